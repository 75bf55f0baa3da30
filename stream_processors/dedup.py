"""Re-sent trajectories: the first copy becomes a row, a later copy is a dead letter `duplicate`.

A publisher that times out waiting for a delivery report and sends the trajectory again makes a
second message with the same trajectory_id. Both copies carry the same key (group_id), so they
sit in one partition. The rule, per source (topic, partition), with `window` offsets:

    a valid trajectory at offset o is a duplicate when an accepted trajectory (one that is, or
    will be, a row) with the same trajectory_id sits at an offset in [o - window, o).

It is a function of the partition's messages, not of what a worker had in memory: a replay after
a crash or SIGKILL decides every message the same way. The memory it needs is the accepted ids of
the last `window` offsets of each partition. It is durable without being stored twice: every
accepted trajectory below a partition's `next` (state.py) is a row of the trajectories table, and
so is every hole above it; on (re)assignment `RecentTrajectories.load` reads back the ids of the
rows at offsets >= next - window, and the replay from `next` adds the rest in order. A trajectory
accepted here may still become a dead letter when its group is decided (another attempt of a task,
attempts.py): `load` reads those ids back too, from the dead_letters table (`decided`).

Bound: at most `window` ids per partition plus its holes (rows already written above `next`).
A copy re-sent more than `window` messages of its partition after the first is not recognised,
and becomes a row (with group_status `late`, or `duplicate` while its group is pending).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import polars as pl

from stream_processors.exceptions import SinkError
from stream_processors.offsets import TopicPartition, TxnTable

log = logging.getLogger(__name__)

DEFAULT_WINDOW = 20_000
"""Offsets per partition within which a re-sent trajectory is recognised (about 5 MB of ids)."""

DecidedIds = Callable[[TopicPartition, int], list[tuple[int, str]]]
"""(offset, trajectory_id) of a partition's accepted trajectories at offsets >= a floor that became
dead letters when their group was decided."""


@dataclass(slots=True)
class PartitionIds:
    """The accepted trajectory ids of one partition's recent offsets."""

    ids: dict[str, list[int]] = field(default_factory=dict)
    order: deque[tuple[int, str]] = field(default_factory=deque)

    def __len__(self) -> int:
        return len(self.order)

    def add(self, trajectory_id: str, offset: int) -> None:
        """Remember an accepted trajectory (offsets arrive in increasing order, holes aside)."""
        self.ids.setdefault(trajectory_id, []).append(offset)
        self.order.append((offset, trajectory_id))

    def earlier(self, trajectory_id: str, offset: int, window: int) -> int | None:
        """The offset of an accepted copy in [offset - window, offset), or None; forgets older ids."""
        floor = offset - window
        while self.order and self.order[0][0] < floor:
            old, tid = self.order.popleft()
            offsets = self.ids[tid]
            offsets.remove(old)
            if not offsets:
                del self.ids[tid]
        for o in self.ids.get(trajectory_id, ()):
            if floor <= o < offset:
                return o
        return None


class RecentTrajectories:
    """The duplicate rule of the module docstring, over every held partition.

    Args:
        window: offsets per partition within which a copy is recognised; 0 turns the rule off.
    """

    def __init__(self, window: int = DEFAULT_WINDOW) -> None:
        if window < 0:
            raise ValueError(f"the duplicate window must be >= 0 offsets, got window={window}")
        self.window = window
        self._partitions: dict[TopicPartition, PartitionIds] = {}
        self.duplicates = 0

    def __contains__(self, tp: TopicPartition) -> bool:
        return tp in self._partitions

    def size(self) -> int:
        """Ids remembered over all partitions."""
        return sum(len(p) for p in self._partitions.values())

    def check(self, tp: TopicPartition, trajectory_id: str, offset: int) -> int | None:
        """The offset of the first copy when the trajectory at `offset` is a duplicate; otherwise
        remember it as accepted and return None."""
        part = self._partitions.get(tp)
        if part is None:
            part = self._partitions[tp] = PartitionIds()
        if self.window == 0:
            return None
        first = part.earlier(trajectory_id, offset, self.window)
        if first is None:
            part.add(trajectory_id, offset)
        else:
            self.duplicates += 1
        return first

    def load(
        self, table: TxnTable, tp: TopicPartition, next_offset: int, decided: DecidedIds | None = None
    ) -> int:
        """Read back the ids of `tp`'s rows at offsets >= next_offset - window, and those `decided`
        gives; returns how many."""
        part = self._partitions[tp] = PartitionIds()
        if self.window == 0:
            return 0
        dt = table.refresh()
        if dt is None:
            return 0
        topic, partition = tp
        try:  # polars, not an Arrow dataset: HAZARDS.md (the latter can abort the interpreter at exit)
            found = (
                pl.scan_delta(dt)
                .filter(
                    (pl.col("topic") == topic)
                    & (pl.col("partition") == partition)
                    & (pl.col("offset") >= next_offset - self.window)
                )
                .select("trajectory_id", "offset")
                .collect()
            )
        except (OSError, ValueError, pl.exceptions.PolarsError) as exc:
            raise SinkError(
                f"reading the recent trajectory ids of {tp} from {table.uri} failed: {exc}; the "
                "table must be readable to resume (check the lake's storage)"
            ) from exc
        accepted = [
            (int(offset), str(tid))
            for tid, offset in zip(found["trajectory_id"].to_list(), found["offset"].to_list(), strict=True)
        ]
        if decided is not None:
            accepted += decided(tp, next_offset - self.window)
        for offset, tid in sorted(accepted):
            part.add(tid, offset)
        log.debug("%s: %d recent trajectory ids of %s read back", table.uri, len(accepted), tp)
        return len(accepted)

    def drop(self, tps: set[TopicPartition]) -> None:
        """Forget revoked partitions (read back by `load` if they come back)."""
        for tp in tps:
            self._partitions.pop(tp, None)
