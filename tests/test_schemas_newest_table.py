"""NewestTable against a real Delta table on disk: always the newest version, loaded afresh every
RELOAD_VERSIONS versions (a DeltaTable that follows a table for long gets slower to write through)."""

from __future__ import annotations

import pyarrow as pa
from deltalake import write_deltalake

from schemas import newest_table
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
