"""The demo's accounting, on real Delta tables: by Kafka coordinates, exactly one place each."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
from deltalake import write_deltalake

from infra.accounting import outcome, ranges_between


def _write(uri: Path, partitions: list[int], offsets: list[int], ids: list[str] | None = None) -> None:
    columns = {
        "topic": pa.array(["raw"] * len(offsets)),
        "partition": pa.array(partitions, pa.int32()),
        "offset": pa.array(offsets, pa.int64()),
    }
    if ids is not None:
        columns["trajectory_id"] = pa.array(ids)
    write_deltalake(str(uri), pa.table(columns), mode="append")


def test_ranges_cover_only_what_the_topic_grew_by() -> None:
    assert ranges_between({0: 5, 1: 7}, {0: 9, 1: 7, 2: 3}) == {0: (5, 9), 2: (0, 3)}


def test_exact_when_every_offset_is_one_row_or_one_letter(tmp_path: Path) -> None:
    # Rows from an earlier run (offsets 0-1) share trajectory ids with this run: they do not count.
    _write(tmp_path / "trajectories", [0, 0], [0, 1], ["a", "b"])
    _write(tmp_path / "trajectories", [0, 0, 1], [2, 3, 0], ["a", "b", "c"])
    _write(tmp_path / "dead_letters", [0], [4])
    found = outcome(tmp_path, "raw", {0: (2, 5), 1: (0, 1)})
    assert (found.expected, found.rows, found.dead_letters, found.duplicates) == (4, 3, 1, 0)
    assert found.complete and found.exact


def test_a_doubled_letter_does_not_hide_a_missing_row(tmp_path: Path) -> None:
    _write(tmp_path / "trajectories", [0], [0], ["a"])
    _write(tmp_path / "dead_letters", [0, 0], [1, 1])
    found = outcome(tmp_path, "raw", {0: (0, 3)})
    assert found.rows + found.dead_letters == found.expected == 3
    assert found.accounted == 2 and not found.complete and not found.exact


def test_repeats_and_overlaps_are_duplicates(tmp_path: Path) -> None:
    _write(tmp_path / "trajectories", [0, 0, 0], [0, 1, 1], ["a", "b", "b"])
    _write(tmp_path / "dead_letters", [0], [0])
    found = outcome(tmp_path, "raw", {0: (0, 2)})
    assert found.complete and not found.exact
    assert found.duplicates == 3  # offset 1 twice, offset 0 in both tables, trajectory "b" twice


def test_missing_tables_count_nothing(tmp_path: Path) -> None:
    found = outcome(tmp_path, "raw", {0: (0, 2)})
    assert (found.rows, found.dead_letters, found.accounted, found.complete) == (0, 0, 0, False)
