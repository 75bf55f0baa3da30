"""Running totals of the stream stage, for periodic progress logs."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from stream_processors.stage import BatchStats


@dataclass(slots=True)
class Progress:
    """Counts since the worker started; `summary` renders them for a log line."""

    records_in: int = 0
    rows_written: int = 0
    dead_letters_written: int = 0
    replays_skipped: int = 0
    duplicates: int = 0
    batches: int = 0
    busy_s: float = 0.0
    process_s: float = 0.0
    started: float = field(default_factory=time.monotonic)

    def add(self, stats: BatchStats) -> None:
        """Fold one batch's stats into the totals."""
        self.records_in += stats.records_in
        self.rows_written += stats.rows_written
        self.dead_letters_written += stats.dead_letters_written
        self.replays_skipped += stats.rows_skipped + stats.dead_letters_skipped
        self.duplicates += stats.duplicates
        self.batches += 1
        self.busy_s += stats.seconds
        self.process_s += stats.process_seconds

    def summary(self) -> str:
        """One line: totals, and records per second of wall time and of batch time."""
        wall = max(time.monotonic() - self.started, 1e-9)
        busy = max(self.busy_s, 1e-9)
        return (
            f"records in {self.records_in}, rows written {self.rows_written}, dead letters "
            f"{self.dead_letters_written} ({self.duplicates} duplicates), replays skipped {self.replays_skipped}, batches {self.batches}; "
            f"{self.records_in / wall:.0f} rec/s wall, {self.records_in / busy:.0f} rec/s while busy "
            f"({self.process_s:.1f}s scoring, {self.busy_s - self.process_s:.1f}s writing)"
        )
