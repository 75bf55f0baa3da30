"""TxnTable remembers txn versions per table version: a writer alone on its table reads none back,
and a commit by anyone else still makes the fence read the table."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from stream_processors.offsets import ConcurrentWriterError, TxnTable, txn_app_id

ROW = pa.table({"x": pa.array([1], pa.int64())})
PARTS = [("t", p) for p in range(4)]


@pytest.fixture
def lookups(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every app id delta-rs is asked for (`DeltaTable.transaction_version`)."""
    asked: list[str] = []
    original = DeltaTable.transaction_version

    def counted(self: DeltaTable, app_id: str) -> int | None:
        asked.append(app_id)
        return original(self, app_id)

    monkeypatch.setattr(DeltaTable, "transaction_version", counted)
    return asked


def test_a_writer_alone_reads_no_txn_version_back_after_its_first_commit(
    tmp_path: Path, lookups: list[str]
) -> None:
    table = TxnTable(str(tmp_path / "t"), app_id="memo")
    table.commit(ROW, {tp: 0 for tp in PARTS}, {}, expected={tp: -1 for tp in PARTS})
    table.commit(ROW, {tp: 1 for tp in PARTS}, {}, expected={tp: 0 for tp in PARTS})
    asked = len(lookups)
    assert asked >= len(PARTS), "the first fenced commit on an existing table must read the table"
    for offset in range(2, 12):
        table.commit(ROW, {tp: offset for tp in PARTS}, {}, expected={tp: offset - 1 for tp in PARTS})
    assert len(lookups) == asked, f"{len(lookups) - asked} txn versions read back by a writer alone"
    assert {tp: table.stored_offset(*tp) for tp in PARTS} == {tp: 11 for tp in PARTS}
    fresh = DeltaTable(str(tmp_path / "t"))
    assert fresh.version() == 11 and fresh.transaction_version(txn_app_id("memo", "t", 3)) == 11


def test_a_commit_by_another_writer_makes_the_fence_read_the_table(
    tmp_path: Path, lookups: list[str]
) -> None:
    ours = TxnTable(str(tmp_path / "t"), app_id="memo")
    theirs = TxnTable(str(tmp_path / "t"), app_id="memo")
    ours.commit(ROW, {("t", 0): 9, ("t", 1): 9}, {}, expected={("t", 0): -1, ("t", 1): -1})
    ours.commit(ROW, {("t", 0): 19, ("t", 1): 19}, {}, expected={("t", 0): 9, ("t", 1): 9})
    # Kafka gave partition 0 to another worker, which wrote it; ours has not heard yet.
    theirs.commit(ROW, {("t", 0): 29}, {}, expected={("t", 0): 19})
    asked = len(lookups)
    with pytest.raises(ConcurrentWriterError, match=r"t\[0\] has stored offset 29"):
        ours.commit(ROW, {("t", 0): 39, ("t", 1): 39}, {}, expected={("t", 0): 19, ("t", 1): 19})
    assert len(lookups) > asked, "the fence trusted what it remembered from before another commit"
    # Partition 1 is still ours: after the other writer's commit, ours reads it once, then no more.
    ours.commit(ROW, {("t", 1): 49}, {}, expected={("t", 1): 19})
    asked = len(lookups)
    ours.commit(ROW, {("t", 1): 59}, {}, expected={("t", 1): 49})
    assert len(lookups) == asked
    assert ours.stored_offset("t", 0) == 29 and ours.stored_offset("t", 1) == 59
