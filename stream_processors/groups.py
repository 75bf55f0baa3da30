"""Prompt groups waiting for their samples, across batches and across rollouts.raw and rollouts.ultra.

A group is decided when all `group_size` samples are in (complete), or by the timeout rule:
  1. event time: the newest `created_at` seen in the group's own partitions is more than
     `event_timeout_s` past the group's oldest sample (per partition, so a partition consumed
     ahead of another never times out the other's groups; deterministic on a replay); or
  2. wall clock: the group has waited `wall_timeout_s` in this process since its first sample
     arrived, and no batch is being judged: a backstop for a quiet stream, where no newer event
     time comes, that never fires while slow judging holds the rest of the group.
Either way the group is released as "timed_out" with the samples it has. Samples are keyed by
(group_id, sample_index). A second sample with an index already pending is released at once on
its own as "duplicate", and a sample of a group decided recently (`remember` ids are kept) as
"late": both become rows with advantage 0, never dead letters, so that whether a message is a row
or a dead letter stays a function of its bytes (a replay may see them in another order). A sample
whose (task_id, attempt) differs from its pending group's is released on its own as "mixed" (the
stage makes it a dead letter, attempts.py); the pending groups are rebuilt by a replay in their
partition's order, so that too is decided the same way again.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from schemas.defaults import StreamDefaults
from stream_processors.offsets import Coordinates, TopicPartition
from stream_processors.validation import TokenArrays
from stream_processors.verifiers.base import Verdict

Attempt = tuple[str | None, int]
"""(task_id, attempt) of a sample; (None, 0) when it is not from a task."""


def attempt_of(record: dict[str, Any]) -> Attempt:
    """The (task_id, attempt) a record carries."""
    task_id = record.get("task_id")
    return (None if task_id is None else str(task_id), int(record.get("attempt", 0)))


@dataclass(slots=True)
class Sample:
    """A judged trajectory waiting for the rest of its group.

    `raw` and `key` are its message's, kept for a sample from a task only: a later attempt's
    complete group becomes dead letters, which carry them.
    """

    coordinates: Coordinates
    record: dict[str, Any]
    tokens: TokenArrays
    verdict: Verdict
    bucket: str
    nbytes: int
    raw: bytes | None = None
    key: bytes | None = None

    @property
    def created_ms(self) -> int:
        """created_at in epoch milliseconds."""
        created = self.record["created_at"]
        return int(created.timestamp() * 1000) if hasattr(created, "timestamp") else int(created)


@dataclass(slots=True)
class PendingGroup:
    """Samples of one group so far."""

    group_id: str
    group_size: int
    first_wall: float
    attempt: Attempt
    samples: dict[int, Sample] = field(default_factory=dict)
    oldest_ms: int = 2**62
    partitions: set[TopicPartition] = field(default_factory=set)

    @property
    def complete(self) -> bool:
        """All `group_size` samples are in."""
        return len(self.samples) >= self.group_size


@dataclass(frozen=True, slots=True)
class DecidedGroup:
    """A group released to be written: samples in sample_index order, and why it was released.

    status: "complete", "timed_out", "duplicate", "late" or "mixed" (see the module docstring);
    attempt: the group's (task_id, attempt), which a "mixed" sample does not share.
    """

    group_id: str
    samples: list[Sample]
    status: str
    attempt: Attempt = (None, 0)


class GroupBuffer:
    """Pending groups in arrival order, with the timeout rule above.

    Args:
        event_timeout_s: event-time timeout (rule 1).
        wall_timeout_s: wall-clock timeout (rule 2).
        remember: how many decided group ids are kept to refuse late duplicates.
    """

    def __init__(
        self,
        *,
        event_timeout_s: float = StreamDefaults.group_event_timeout_s,
        wall_timeout_s: float = StreamDefaults.group_wall_timeout_s,
        remember: int = 100_000,
    ):
        if event_timeout_s <= 0 or wall_timeout_s <= 0:
            raise ValueError(
                f"group timeouts must be > 0, got event_timeout_s={event_timeout_s}, wall_timeout_s={wall_timeout_s}"
            )
        self.event_timeout_ms = int(event_timeout_s * 1000)
        self.wall_timeout_s = wall_timeout_s
        self.remember = remember
        self._pending: OrderedDict[str, PendingGroup] = OrderedDict()
        self._decided: OrderedDict[str, None] = OrderedDict()
        self._watermarks: dict[TopicPartition, int] = {}
        self.nbytes = 0

    def __len__(self) -> int:
        return len(self._pending)

    def samples(self) -> Iterator[Sample]:
        """Every pending sample."""
        for group in self._pending.values():
            yield from group.samples.values()

    def add(self, sample: Sample, now: float | None = None) -> DecidedGroup | None:
        """Buffer a sample; returns a group when this sample decided one (its own, or itself alone)."""
        record = sample.record
        group_id, index = str(record["group_id"]), int(record["sample_index"])
        if group_id in self._decided:
            return DecidedGroup(group_id, [sample], "late", attempt_of(record))
        group = self._pending.get(group_id)
        attempt = attempt_of(record)
        if group is None:
            group = PendingGroup(
                group_id, int(record["group_size"]), time.monotonic() if now is None else now, attempt
            )
            self._pending[group_id] = group
        elif attempt != group.attempt:
            return DecidedGroup(group_id, [sample], "mixed", group.attempt)
        elif index in group.samples:
            return DecidedGroup(group_id, [sample], "duplicate", attempt)
        group.samples[index] = sample
        created = sample.created_ms
        group.oldest_ms = min(group.oldest_ms, created)
        tp = (sample.coordinates.topic, sample.coordinates.partition)
        group.partitions.add(tp)
        self._watermarks[tp] = max(self._watermarks.get(tp, -(2**62)), created)
        self.nbytes += sample.nbytes
        return self._release(group_id, "complete") if group.complete else None

    def expire(self, now: float | None = None, *, idle: bool = True) -> list[DecidedGroup]:
        """Release the groups the timeout rule decides (oldest first); rule 2 only when `idle`."""
        now = time.monotonic() if now is None else now
        due = [
            gid
            for gid, g in self._pending.items()
            if max(self._watermarks.get(tp, -(2**62)) for tp in g.partitions) - g.oldest_ms
            > self.event_timeout_ms
            or (idle and now - g.first_wall >= self.wall_timeout_s)
        ]
        return [self._release(gid, "timed_out") for gid in due]

    def drop(self, partitions: Iterable[TopicPartition]) -> int:
        """Forget every pending group with a sample from `partitions` (revoked); returns how many."""
        gone = set(partitions)
        doomed = [
            gid
            for gid, g in self._pending.items()
            if any((s.coordinates.topic, s.coordinates.partition) in gone for s in g.samples.values())
        ]
        for gid in doomed:
            group = self._pending.pop(gid)
            self.nbytes -= sum(s.nbytes for s in group.samples.values())
        return len(doomed)

    def _release(self, group_id: str, status: str) -> DecidedGroup:
        group = self._pending.pop(group_id)
        self.nbytes -= sum(s.nbytes for s in group.samples.values())
        self._decided[group_id] = None
        while len(self._decided) > self.remember:
            self._decided.popitem(last=False)
        return DecidedGroup(
            group_id, [group.samples[i] for i in sorted(group.samples)], status, group.attempt
        )
