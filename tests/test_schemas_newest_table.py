"""NewestTable against a real Delta table on disk: always the newest version, loaded afresh every
RELOAD_VERSIONS versions (a DeltaTable that follows a table for long gets slower to write through)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from schemas import newest_table
from schemas.local_table import commit_file, local_path
from schemas.newest_table import NewestTable


def test_a_followed_table_is_newest_and_loaded_afresh_every_reload_versions(tmp_path, monkeypatch):
    monkeypatch.setattr(newest_table, "RELOAD_VERSIONS", 3)
    uri = str(tmp_path / "table")
    handle = NewestTable(uri)
    assert handle.newest() is None  # not created yet
    rows = pa.table({"a": pa.array([1], pa.int64())})
    write_deltalake(uri, rows)
    first = handle.newest()
    assert first is not None and first.version() == 0
    seen = []
    for version in range(1, 8):
        write_deltalake(uri, rows, mode="append")  # another writer
        table = handle.newest()
        assert table is not None and table.version() == version
        seen.append(table)
    # followed incrementally for three versions, then loaded afresh, then followed again
    assert [table is first for table in seen] == [True, True, True, False, False, False, False]
    assert all(table is seen[3] for table in seen[3:])
    assert seen[-1].to_pyarrow_table().num_rows == 8


def test_a_local_table_with_no_newer_commit_is_not_listed_again(tmp_path, monkeypatch):
    uri = str(tmp_path / "table")
    rows = pa.table({"a": pa.array([1], pa.int64())})
    write_deltalake(uri, rows)
    handle = NewestTable(uri)
    assert handle.newest() is not None
    updates = []
    original = DeltaTable.update_incremental
    monkeypatch.setattr(DeltaTable, "update_incremental", lambda self: updates.append(1) or original(self))
    for _ in range(5):
        table = handle.newest()
        assert table is not None and table.version() == 0
    assert updates == [], "a table with no newer commit was updated (its whole log listed)"
    write_deltalake(uri, rows, mode="append")  # another writer
    table = handle.newest()
    assert table is not None and table.version() == 1 and len(updates) == 1
    assert table.to_pyarrow_table().num_rows == 2


def test_only_a_local_table_is_probed_for_its_next_commit():
    assert local_path("s3://bucket/lake/t") is None
    assert local_path("file:///lake/t") == Path("/lake/t")
    assert local_path("/lake/t") == Path("/lake/t")
    assert commit_file(Path("/lake/t"), 7) == Path("/lake/t/_delta_log/00000000000000000007.json")
