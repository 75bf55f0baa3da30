"""Batched intake of one source topic: a confluent-kafka consumer in the worker's consumer group.

librdkafka fetches and decompresses in C and `consume(num_messages=...)` hands out whole batches,
so a message costs the worker a few microseconds instead of Faust's per-message event, stream and
ack machinery. Offsets are ours: `commit` moves Kafka's committed offset to what the stage calls
safe (every message below it stored), never past a pending message. On assignment a partition is
positioned at the larger of Kafka's committed offset and the `next` stored in Delta (everything
below it is stored); on revocation the owner's `on_revoke` hook runs before the partition goes, and
batches taken before it are recognized as stale by their generation (librdkafka itself drops, from
a batch being collected, the messages fetched before a rebalance: librdkafka PR #3269, #4117).

All calls into the consumer other than `commit`, `pause` and `resume` (which librdkafka allows from
any thread) happen in the one thread that calls `take`; the rebalance hooks run there too.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException
from confluent_kafka import TopicPartition as KafkaPartition

from stream_processors.offsets import Coordinates, TopicPartition
from stream_processors.processing import SourceMessage

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Taken:
    """One batch from `Intake.take`: its messages, per partition the generation it was read in, and
    `behind`: how many messages the assigned partitions held past the batch when it was taken
    (from the high watermarks of the last fetches; None when librdkafka knows none yet)."""

    messages: list[SourceMessage] = field(default_factory=list)
    generations: dict[TopicPartition, int] = field(default_factory=dict)
    nbytes: int = 0
    behind: int | None = None

    def caught_up(self, size: int) -> bool:
        """True when the reader keeps up: less than a batch of `size` waits behind this one
        (or, with no watermark known yet, the batch was not full)."""
        if self.behind is not None:
            return self.behind < size
        return len(self.messages) < size


class Intake:
    """A consumer of one topic that hands out batches and commits only offsets it is told are safe.

    Args:
        topic: the topic to subscribe to.
        config: librdkafka settings (bootstrap servers, group id, fetch sizes, session timeout);
            auto commit and auto offset store are always off.
        stored_next: partition -> the lowest offset not yet stored in Delta, or None when unknown;
            consulted on assignment.
        on_revoke: called with the revoked partitions before they go; returns their safe offsets,
            which are committed synchronously while the partitions are still ours.
        on_assign: called with the assigned partitions after they are positioned.
    """

    def __init__(
        self,
        topic: str,
        config: Mapping[str, Any],
        *,
        stored_next: Callable[[TopicPartition], int | None] = lambda _: None,
        on_revoke: Callable[[list[TopicPartition]], Mapping[TopicPartition, int]] = lambda _: {},
        on_assign: Callable[[list[TopicPartition]], None] = lambda _: None,
    ) -> None:
        self.topic = topic
        self.config = {
            **config,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": False,
        }
        self.stored_next = stored_next
        self.on_revoke = on_revoke
        self.on_assign = on_assign
        self._consumer: Consumer | None = None
        self._lock = threading.Lock()
        self._generation: dict[TopicPartition, int] = {}
        self._assigned: set[TopicPartition] = set()
        self._committed: dict[TopicPartition, int] = {}
        self._log_end: dict[TopicPartition, int] = {}
        self._paused = False

    # -- in the intake thread --------------------------------------------------------------------

    def subscribe(self) -> None:
        """Create the consumer and join the group (rebalances then happen inside `take`)."""
        self._consumer = Consumer(self.config)
        self._consumer.subscribe([self.topic], on_assign=self._assigned_cb, on_revoke=self._revoked_cb)

    def take(self, size: int, within_s: float) -> Taken:
        """Up to `size` messages, waiting at most `within_s` for the batch to fill.

        Raises:
            KafkaException: a fatal consumer error (the worker stops without committing).
        """
        consumer = self._require()
        out = Taken()
        for message in consumer.consume(num_messages=size, timeout=within_s):
            error = message.error()
            if error is not None:
                self._on_error(error)
                continue
            partition, offset = message.partition(), message.offset()
            if partition is None or offset is None:
                continue  # only error events lack them
            value = message.value()
            out.messages.append(
                SourceMessage(Coordinates(self.topic, partition, offset), message.key(), value)
            )
            out.nbytes += len(value or b"")
        with self._lock:
            for m in out.messages:
                tp = (m.coordinates.topic, m.coordinates.partition)
                out.generations[tp] = self._generation.get(tp, 0)
        out.behind = self._behind(consumer)
        return out

    def close(self) -> None:
        """Leave the group (the revoke hook runs for what is still assigned)."""
        if self._consumer is not None:
            consumer, self._consumer = self._consumer, None
            consumer.close()

    # -- from any thread -------------------------------------------------------------------------

    def current(self, tp: TopicPartition, generation: int) -> bool:
        """True while `tp` is still assigned in `generation` (a batch read then is not stale)."""
        with self._lock:
            return tp in self._assigned and self._generation.get(tp, 0) == generation

    def assignment(self) -> set[TopicPartition]:
        """The partitions assigned now."""
        with self._lock:
            return set(self._assigned)

    def log_ends(self) -> dict[TopicPartition, int]:
        """Per assigned partition, its log-end offset as of the last fetch (librdkafka's cached high
        watermark, read after each `take`); partitions not fetched yet are missing."""
        with self._lock:
            return dict(self._log_end)

    def commit(self, safe: Mapping[TopicPartition, int]) -> None:
        """Commit, asynchronously, the safe offsets of assigned partitions that moved forward (never 0:
        a partition with nothing stored keeps no committed offset)."""
        consumer = self._consumer
        if consumer is None:
            return
        with self._lock:
            moved = {
                tp: offset
                for tp, offset in safe.items()
                if tp in self._assigned and offset > self._committed.get(tp, 0)
            }
            self._committed.update(moved)
        if moved:
            consumer.commit(
                offsets=[KafkaPartition(t, p, o) for (t, p), o in moved.items()], asynchronous=True
            )

    @property
    def paused(self) -> bool:
        """True while fetching is paused by `pause`."""
        return self._paused

    def pause(self, paused: bool) -> None:
        """Stop (True) or resume (False) fetching from every assigned partition."""
        consumer = self._consumer
        if consumer is None or paused == self._paused:
            return
        parts = [KafkaPartition(t, p) for t, p in self.assignment()]
        if paused:
            consumer.pause(parts)
        else:
            consumer.resume(parts)
        self._paused = paused

    # -- internals -------------------------------------------------------------------------------

    def _require(self) -> Consumer:
        if self._consumer is None:
            raise RuntimeError("Intake.take before Intake.subscribe (or after close)")
        return self._consumer

    def _behind(self, consumer: Consumer) -> int | None:
        """Messages past the consumer's position in its assigned partitions, by the high watermarks
        of the last fetch responses (cached by librdkafka: no request to the broker)."""
        with self._lock:
            assigned = [KafkaPartition(t, p) for t, p in self._assigned]
        if not assigned:
            return None
        total: int | None = 0
        for position in consumer.position(assigned):
            _, high = consumer.get_watermark_offsets(position, cached=True)
            if high >= 0:
                with self._lock:
                    if (position.topic, position.partition) in self._assigned:
                        self._log_end[(position.topic, position.partition)] = high
            if high < 0 or position.offset < 0 or total is None:
                total = None  # not fetched yet
                continue
            total += max(0, high - position.offset)
        return total

    def _on_error(self, error: KafkaError) -> None:
        if error.fatal():
            raise KafkaException(error)
        log.warning("%s: consumer error (retried by librdkafka): %s", self.topic, error)

    def _assigned_cb(self, consumer: Consumer, partitions: list[KafkaPartition]) -> None:
        tps = [(p.topic, p.partition) for p in partitions]
        committed = {(p.topic, p.partition): p.offset for p in consumer.committed(partitions, timeout=30)}
        positioned, ahead = [], []
        for t, p in tps:
            start = committed.get((t, p), -1)
            stored = self.stored_next((t, p))
            if stored is not None and stored > max(start, 0):
                start = stored  # everything below it is stored: no need to read it again
                ahead.append(KafkaPartition(t, p, stored))
            positioned.append(KafkaPartition(t, p, start) if start >= 0 else KafkaPartition(t, p))
        consumer.assign(positioned)
        if ahead:
            consumer.commit(offsets=ahead, asynchronous=False)
        with self._lock:
            for tp in tps:
                self._generation[tp] = self._generation.get(tp, 0) + 1
                self._committed[tp] = max(committed.get(tp, 0), self.stored_next(tp) or 0, 0)
            self._assigned.update(tps)
        if self._paused:
            consumer.pause(positioned)
        log.info("%s: assigned partitions %s", self.topic, sorted(p for _, p in tps))
        self.on_assign(tps)

    def _revoked_cb(self, consumer: Consumer, partitions: list[KafkaPartition]) -> None:
        tps = [(p.topic, p.partition) for p in partitions]
        with self._lock:
            for tp in tps:
                self._generation[tp] = self._generation.get(tp, 0) + 1
                self._log_end.pop(tp, None)
            self._assigned.difference_update(tps)
        try:
            safe = self.on_revoke(tps)
            with self._lock:
                offsets = [
                    KafkaPartition(t, p, safe[(t, p)])
                    for t, p in tps
                    if safe.get((t, p), 0) > self._committed.get((t, p), 0)
                ]
            if offsets:
                consumer.commit(offsets=offsets, asynchronous=False)
        except Exception:
            log.exception(
                "%s: committing revoked partitions failed; their next owner replays more", self.topic
            )
        finally:
            with self._lock:
                for tp in tps:
                    self._committed.pop(tp, None)
            consumer.unassign()
        log.info("%s: revoked partitions %s", self.topic, sorted(p for _, p in tps))
