"""Expired Delta log files: removed by TxnTable once every CLEANUP_EVERY versions, not after each commit."""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from stream_processors import offsets
from stream_processors.offsets import TxnTable

APP = "log-cleanup-test"
ROW = pa.table({"x": pa.array([1], pa.int64())})


def _log(uri: Path) -> set[str]:
    return {p.name for p in (uri / "_delta_log").iterdir()}


def test_expired_logs_go_once_every_cleanup_interval_not_after_every_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    uri = tmp_path / "t"
    table = TxnTable(str(uri), app_id=APP)
    monkeypatch.setattr(offsets, "CLEANUP_EVERY", 10**6)  # ours does not run in this part
    for offset in range(110):  # delta-rs's hook checkpoints version 99
        table.commit(ROW, {("t", 0): offset}, {}, expected=None)
    DeltaTable(str(uri)).alter.set_table_properties({"delta.logRetentionDuration": "interval 1 second"})
    time.sleep(1.5)  # every commit so far is now past the retention
    for offset in range(110, 113):
        table.commit(ROW, {("t", 0): offset}, {}, expected=None)
    checkpoints = sorted(n for n in _log(uri) if n.endswith(".checkpoint.parquet"))
    assert checkpoints, "delta-rs's hook wrote no checkpoint"
    assert "00000000000000000000.json" in _log(uri), "an append ran delta-rs's expired-log cleanup"

    monkeypatch.setattr(offsets, "CLEANUP_EVERY", 1)
    table.commit(ROW, {("t", 0): 113}, {}, expected=None)
    checkpointed = int(checkpoints[-1].split(".")[0])
    left = sorted(int(n.split(".")[0]) for n in _log(uri) if n.endswith(".json") and n[0].isdigit())
    assert left[0] == checkpointed, f"log files before the checkpoint {checkpointed} remain: {left[:3]}"
    newest = DeltaTable(str(uri))
    assert newest.version() == left[-1]
    assert newest.to_pyarrow_table().num_rows == 114
    assert newest.transaction_version(offsets.txn_app_id(APP, "t", 0)) == 113
