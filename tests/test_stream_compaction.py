"""The worker's compaction of small files, on real Delta tables written through TxnTable."""

from __future__ import annotations

import os
from pathlib import Path

import polars as pl
import pyarrow as pa
from deltalake import DeltaTable

from consumers.replay.log import TableLog
from stream_processors.compaction import Compactor
from stream_processors.offsets import TxnTable

TARGET = 64 * 1024
APP = "compaction-test"


def _append(table: TxnTable, bucket: str, first: int, rows: int, payload: int = 16) -> None:
    """Rows at offsets first.. of partition 0, each with `payload` random bytes (incompressible)."""
    data = pa.table(
        {
            "offset": pa.array(range(first, first + rows), pa.int64()),
            "bucket": pa.array([bucket] * rows, pa.string()),
            "payload": pa.array([os.urandom(payload) for _ in range(rows)], pa.binary()),
        }
    )
    versions = {("t", 0): first + rows - 1}
    table.commit(data, versions, {}, expected={("t", 0): first - 1})


def _files(uri: str) -> dict[str, int]:
    actions = pa.table(DeltaTable(uri).get_add_actions(flatten=True))
    return dict(
        zip(actions.column("path").to_pylist(), actions.column("size_bytes").to_pylist(), strict=True)
    )


def test_compaction_rewrites_partitions_with_enough_small_files_and_keeps_rows_and_offsets(tmp_path: Path):
    uri = str(tmp_path / "table")
    table = TxnTable(uri, app_id=APP, partition_by=["bucket"])
    offset = 0
    _append(table, "a", offset, 4, payload=2 * TARGET)  # one file above the target: never rewritten
    offset += 4
    for _ in range(12):
        _append(table, "a", offset, 8)
        offset += 8
    for _ in range(3):
        _append(table, "b", offset, 8)
        offset += 8
    before_files = _files(uri)
    big = {path for path, size in before_files.items() if size >= TARGET}
    before_rows = pl.read_delta(uri).sort("offset")
    compactor = Compactor(uri, partition_by="bucket", min_files=5, target_bytes=TARGET)

    done = compactor.run()

    assert [(c.partition, c.files_removed) for c in done] == [("a", 12)]
    assert done[0].files_added == 1
    after_files = _files(uri)
    assert big <= set(after_files)  # the big file stays
    assert sum("bucket=b" in path for path in after_files) == 3  # below min_files: untouched
    assert len(after_files) == len(before_files) - 12 + 1
    assert pl.read_delta(uri).sort("offset").equals(before_rows)
    assert TxnTable(uri, app_id=APP).stored_offset("t", 0) == offset - 1  # the txn versions survive
    version = DeltaTable(uri).version()
    assert TableLog(uri).added_files(version) == []  # a follower of the table reads no new rows
    assert compactor.run() == []  # nothing small enough left in "a", too few in "b"

    _append(table, "a", offset, 8)  # the writer goes on after the compaction
    assert TxnTable(uri, app_id=APP).stored_offset("t", 0) == offset + 7


def test_an_unpartitioned_table_is_compacted_as_a_whole(tmp_path: Path):
    uri = str(tmp_path / "table")
    table = TxnTable(uri, app_id=APP)
    for i in range(6):
        _append(table, "x", 8 * i, 8)
    done = Compactor(uri, partition_by=None, min_files=6, target_bytes=TARGET).run()
    assert [(c.partition, c.files_removed, c.files_added) for c in done] == [(None, 6, 1)]
    assert pl.read_delta(uri).height == 48


def test_no_table_yet_is_nothing_to_compact(tmp_path: Path):
    assert (
        Compactor(str(tmp_path / "none"), partition_by="bucket", min_files=2, target_bytes=TARGET).run() == []
    )
