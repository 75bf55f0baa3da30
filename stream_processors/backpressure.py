"""The bound on consumed but uncommitted bytes: past it, fetching rollouts.raw pauses."""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

from stream_processors.offsets import TopicPartition
from stream_processors.processing import SourceMessage

log = logging.getLogger(__name__)


class Pausable(Protocol):
    """What backpressure needs of an intake."""

    @property
    def paused(self) -> bool: ...

    def pause(self, paused: bool) -> None: ...


class Held:
    """Consumed messages whose offsets are not committed yet, per partition, for the byte bound."""

    def __init__(self) -> None:
        self._held: dict[TopicPartition, deque[tuple[int, int]]] = {}
        self._bytes: dict[str, int] = {}

    def held_bytes(self, topic: str) -> int:
        """Bytes of the held messages of `topic` (judged, pending or in flight, not yet safe)."""
        return self._bytes.get(topic, 0)

    def hold(self, messages: Sequence[SourceMessage]) -> None:
        """Count a batch's messages until they are safe."""
        for m in messages:
            c = m.coordinates
            size = len(m.value or b"")
            self._held.setdefault((c.topic, c.partition), deque()).append((c.offset, size))
            self._bytes[c.topic] = self._bytes.get(c.topic, 0) + size

    def release(self, safe: Mapping[TopicPartition, int]) -> None:
        """Forget every held message below its partition's safe offset."""
        for tp, held in self._held.items():
            limit = safe.get(tp)
            while held and limit is not None and held[0][0] < limit:
                self._bytes[tp[0]] -= held.popleft()[1]

    def drop(self, tps: Iterable[TopicPartition]) -> None:
        """Forget the messages of revoked partitions (their new owner reads them again)."""
        for tp in tps:
            for _, size in self._held.pop(tp, ()):
                self._bytes[tp[0]] -= size


class Backpressure:
    """Pauses fetching `topic` while its held messages exceed `bound_bytes`; resumes at half.

    Args:
        topic: the bounded topic (rollouts.raw; the ultra lane bounds itself by its batch size).
        intake: the intake fetching it.
        bound_bytes: the most bytes held before fetching pauses.
        held: the messages held, counted by the lanes and released by the committer.
    """

    def __init__(self, topic: str, intake: Pausable, bound_bytes: int, held: Held) -> None:
        self.topic = topic
        self.intake = intake
        self.bound_bytes = bound_bytes
        self.held = held

    def check(self) -> None:
        """Pause or resume fetching by the bytes held now (call after each release)."""
        amount = self.held.held_bytes(self.topic)
        if amount > self.bound_bytes and not self.intake.paused:
            self.intake.pause(True)
            log.info("%s: %d bytes held (bound %d); fetching paused", self.topic, amount, self.bound_bytes)
        elif self.intake.paused and amount <= self.bound_bytes // 2:
            self.intake.pause(False)
            log.info("%s: %d bytes held; fetching resumed", self.topic, amount)
