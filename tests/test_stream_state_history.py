"""The stage's state read back from a table's history: newest first, a page at a time."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from schemas import history as history_module
from stream_processors.offsets import TxnTable
from stream_processors.state import SinkState

APP = "history-test"
EMPTY = pa.table({"x": pa.array([], pa.int64())})


def _commit_state(table: TxnTable, topic_partition: tuple[str, int], next_offset: int) -> None:
    stored = SinkState(APP)
    stored.partition(topic_partition).next = next_offset
    table.commit(EMPTY, {topic_partition: next_offset - 1}, stored.metadata("profile"), expected=None)


def test_the_state_is_found_a_page_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    table = TxnTable(str(tmp_path / "t"), app_id=APP)
    _commit_state(table, ("t", 0), 5)  # version 0: the only state of partition 0
    for i in range(10):  # versions 1..10 carry no state (another table's kind of commit)
        table.commit(EMPTY, {("t", 1): i}, {}, expected=None)
    limits: list[int | None] = []
    history = DeltaTable.history

    def recording(self: DeltaTable, limit: int | None = None) -> list[dict]:
        limits.append(limit)
        return history(self, limit)

    monkeypatch.setattr(DeltaTable, "history", recording)
    monkeypatch.setattr(history_module, "HISTORY_PAGE", 4)

    old = SinkState(APP)
    old.load(table, [("t", 0)])
    assert old.partitions[("t", 0)].next == 5
    assert limits == [4, 16]  # 4 newest commits without it, then 16 asked and the whole log of 11 read

    _commit_state(table, ("t", 1), 42)  # version 11
    limits.clear()
    recent = SinkState(APP)
    recent.load(table, [("t", 1)])
    assert recent.partitions[("t", 1)].next == 42
    assert recent.last_version == 11
    assert limits == [4]  # found in the first page: the rest of the log is never read
