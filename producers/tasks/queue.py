"""`TaskQueue`: tasks leased one at a time from a Kafka share group, served by priority.

Each priority class has its own topic and, per slot, its own `ShareConsumer` in explicit
acknowledgement mode with ``max.poll.records=1``, so the queue acquires only the tasks it starts:
a record a poll acquired is locked (its delivery counted) whether or not anyone works on it.
Three facts of librdkafka 2.16 shape the rest (measured, docs/rollout.md): a consumer cannot poll
again until every record of its last poll is acknowledged, hence one consumer per slot; a poll
that returned nothing leaves the consumer fetching in the background, so it may hold one record
when next polled, which the queue hands out or, if too little of its lock is left, requeues; and
the broker leases whole record batches, hence one task per batch (`producers.tasks.sending`).
The share group assigns each consumer its own partitions, so a take polls every free consumer of
a class, and a keeper thread collects background fetches between calls.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from confluent_kafka import (
    AcknowledgeType,
    IllegalStateException,
    KafkaError,
    KafkaException,
    Message,
    ShareConsumer,
)

from producers.exceptions import PublishError
from producers.tasks.dead_letters import Reason, TaskDeadLetter
from producers.tasks.exceptions import LeaseExpiredError, TaskQueueError
from producers.tasks.group import read_group_terms
from producers.tasks.lease import Lease, State
from producers.tasks.outcomes import Event, OutcomeLog
from producers.tasks.priorities import PriorityScheduler
from producers.tasks.sending import TaskSender
from producers.tasks.topics import TaskTopics
from schemas.defaults import RolloutDefaults
from schemas.exceptions import DecodeError
from schemas.task import TaskCodec, TaskError

log = logging.getLogger("producers.tasks")

SETTLE_S = 0.5
"""A first poll waits this long for its fetch; after it, a consumer fetches in the background."""
IDLE_POLL_S = 0.1
CLOCK_SKEW_S = 5.0
"""How far a producer's clock may run ahead of ours when a record's timestamp bounds its lock."""
TRANSIT_S = 1.0
"""A fetch response reaches the client within this of the broker locking its records, so a record
a consumer holds was locked no earlier than this before the consumer's last empty poll."""
COMMIT_TIMEOUT_S = 30.0
KEEP_S = 0.25
"""How often the keeper collects what consumers fetched in the background between calls."""


@dataclass
class QueueStats:
    """What the queue's consumers did, for measuring and for tests.

    Attributes:
        polls: polls made.
        records: records those polls returned.
        held: records returned while no lease was wanted for them (kept for the next take).
        stale: held records requeued because too little of their lock was left.
        dead: records dead-lettered when taken (malformed, invalid, attempts exhausted).
        lost_events: outcome events the broker did not acknowledge (logged as errors).
    """

    polls: int = 0
    records: int = 0
    held: int = 0
    stale: int = 0
    dead: int = 0
    lost_events: int = 0


class _Member:
    """One share consumer of one priority class and what it holds."""

    def __init__(self, consumer: ShareConsumer, priority: int) -> None:
        self.consumer = consumer
        self.priority = priority
        self.unsettled = 0
        self.armed_since: float | None = None
        self.empty_poll_at = 0.0
        self.polled_at = 0.0

    @property
    def free(self) -> bool:
        return self.unsettled == 0


class TaskQueue:
    """Takes tasks from the share group `group` and settles them; one per worker process.

    `take` returns leases (at most `slots` open at once), higher priority first, the lowest class
    at least once in `low_every` starts while it has tasks waiting. A lease is settled with
    `Lease.done`, `Lease.fail` or `Lease.requeue`. Every step is written to the outcome log;
    malformed or invalid tasks and tasks out of attempts become task dead letters and are never
    handed out. Records consumers fetched in the background are collected every KEEP_S by a
    keeper thread (and at every take and settlement) and held for the next take; a held record
    whose lock has less than its task's deadline left is requeued (no attempt used). `close`
    requeues whatever is still open or held. Thread-safe (one lock around the consumers, which
    are not).

    Args:
        bootstrap_servers: the Kafka brokers.
        topics: the task topics (one per priority class), dead letters and outcome log.
        group: the share group; its lock duration and delivery limit are read from the broker.
        worker_id: written on outcomes and dead letters; default ``<host>-<pid>``.
        slots: leases open at once; one consumer per slot and class.
        max_attempts: N: a failure on attempt N dead-letters the task. Below the group's
            ``share.delivery.count.limit``, so the letter is written before the broker archives it.
        low_every: Y of the priority rule (`PriorityScheduler`).
        extra_config: librdkafka options for every client (security settings, say).
        codec: decodes tasks; default the shipped task schema.
    """

    def __init__(
        self,
        *,
        bootstrap_servers: str,
        topics: TaskTopics,
        group: str,
        worker_id: str | None = None,
        slots: int = 1,
        max_attempts: int = RolloutDefaults.task_max_attempts,
        low_every: int = RolloutDefaults.task_low_every,
        extra_config: Mapping[str, Any] | None = None,
        codec: TaskCodec | None = None,
    ) -> None:
        if slots < 1:
            raise TaskQueueError(f"slots = {slots}; give the number of tasks this worker runs at once (>= 1)")
        terms = read_group_terms(bootstrap_servers, group, extra_config=extra_config)
        if not 1 <= max_attempts < terms.delivery_limit:
            raise TaskQueueError(
                f"max_attempts = {max_attempts} must be at least 1 and below share group {group!r}'s "
                f"share.delivery.count.limit = {terms.delivery_limit}, or the broker archives a failing "
                "task before its dead letter is written; lower task_max_attempts or raise task_delivery_limit"
            )
        if terms.offset_reset != "earliest":
            raise TaskQueueError(
                f"share group {group!r} has share.auto.offset.reset = {terms.offset_reset}: tasks submitted "
                "before its first worker joined would never be delivered; provision it (`rollstream up`)"
            )
        self.topics, self.group, self.slots, self.max_attempts = topics, group, slots, max_attempts
        self.worker_id = worker_id or f"{socket.gethostname()}-{os.getpid()}"
        self.lock_s = terms.lock_ms / 1000
        self.stats = QueueStats()
        self._codec = codec or TaskCodec()
        self._scheduler = PriorityScheduler(topics.classes, low_every=low_every)
        self._sender = TaskSender(bootstrap_servers, extra_config=extra_config)
        self._outcomes = OutcomeLog(self._sender, topic=topics.outcomes, worker_id=self.worker_id)
        self._lock = threading.RLock()
        self._open: set[Lease] = set()
        self._held: list[Lease] = []
        self._closed = False
        config = {
            **(extra_config or {}),
            "bootstrap.servers": bootstrap_servers,
            "group.id": group,
            "share.acknowledgement.mode": "explicit",
            "max.poll.records": 1,
        }
        self._members: dict[int, list[_Member]] = {}
        for priority, topic in topics.classes.items():
            self._members[priority] = []
            for slot in range(slots):
                consumer = ShareConsumer({**config, "client.id": f"{self.worker_id}-{topic}-{slot}"})
                consumer.subscribe([topic])
                self._members[priority].append(_Member(consumer, priority))
        self._stopping = threading.Event()
        self._keeper = threading.Thread(target=self._keep, name=f"task-queue-keeper-{group}", daemon=True)
        self._keeper.start()

    @property
    def open_leases(self) -> int:
        """Leases handed out and not yet settled."""
        return len(self._open)

    def take(self, max_tasks: int = 1, timeout: float = 1.0) -> list[Lease]:
        """Up to `max_tasks` leases (fewer when the slots are full), waiting up to `timeout` s for one.

        Returns as soon as it has at least one lease and the next is not at hand (what its
        consumers fetch meanwhile is held for the next take); an empty list when nothing came
        within `timeout`.

        Raises:
            TaskQueueError: every slot holds an open lease, or the queue is closed.
            PublishError: a dead letter or outcome event was not acknowledged by the broker.
        """
        with self._lock:
            if self._closed:
                raise TaskQueueError("the task queue is closed; make a new one")
            room = min(max_tasks, self.slots - len(self._open))
            if room < 1:
                raise TaskQueueError(
                    f"all {self.slots} slots hold open leases; settle one (done, fail, requeue) before taking more"
                )
            end = time.monotonic() + timeout
            self._drain()
            out: list[Lease] = []
            while len(out) < room:
                lease = self._next(hurry=bool(out), end=end)
                if lease is not None:
                    out.append(lease)
                    continue
                left = end - time.monotonic()
                if out or left <= 0:
                    break
                self._idle(min(left, IDLE_POLL_S))
            for lease in out:
                self._open.add(lease)
                self._scheduler.started(lease.priority)
                self._event("started", lease)
            if out:
                self._flush_outcomes()
            return out

    def close(self, timeout: float = 30.0) -> None:
        """Requeue every open and held lease (no attempt used), then leave the group."""
        with self._lock:
            if self._closed:
                return
            self._stopping.set()
            closed: set[int] = set()
            try:
                self._drain()
                # Consumers that hold nothing leave first: one still in the group could fetch a
                # requeued copy in the background and release it on closing, using an attempt.
                for members in self._members.values():
                    for member in members:
                        if member.free:
                            member.consumer.close()
                            closed.add(id(member))
                for lease in [*self._open, *self._held]:
                    try:
                        self._requeue(lease, reason="the worker stopped")
                    except (PublishError, TaskQueueError) as exc:
                        log.warning("task %s: not requeued on close: %s", lease.task_id, exc)
            finally:
                self._closed = True
                for members in self._members.values():
                    for member in members:
                        if id(member) not in closed:
                            member.consumer.close()
                self._sender.close(timeout)

    def __enter__(self) -> TaskQueue:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # Settling a lease (called by Lease).

    def _done(self, lease: Lease) -> None:
        with self._lock:
            self._settle(lease, AcknowledgeType.ACCEPT, "done")
            self._event("done", lease)
            self._flush_outcomes()
            self._drain()

    def _fail(self, lease: Lease, error: str, *, final: bool = False) -> State:
        with self._lock:
            self._check_open(lease)
            if lease.attempt < self.max_attempts and not final:
                self._settle(lease, AcknowledgeType.RELEASE, "released")
                self._event("released", lease, error)
                self._flush_outcomes()
                self._drain()
                return "released"
            self._bury(lease._member, lease._message, "failed", error, lease.attempt, lease.task_id, lease)
            self._drain()
            return "dead"

    def _requeue(self, lease: Lease, *, reason: str) -> None:
        with self._lock:
            self._check_open(lease)
            if lease.expires_in() <= 0:
                # The lock may be gone: a copy could duplicate a task another worker already has.
                self._settle(lease, AcknowledgeType.RELEASE, "released")
                self._event("released", lease, f"{reason}; lease expired before it was requeued")
                self._flush_outcomes()
                return
            copy = lease.task.with_prior_attempts(lease.attempt - 1)
            try:
                self._sender.send(lease.coordinates[0], self._codec.encode(copy), key=copy.task_id)
            except PublishError:
                self._settle(lease, AcknowledgeType.RELEASE, "released")
                self._event("released", lease, f"{reason}; its copy was not acknowledged")
                self._flush_outcomes()
                raise
            self._settle(lease, AcknowledgeType.ACCEPT, "requeued")
            self._event("requeued", lease, reason)
            self._flush_outcomes()

    def _check_open(self, lease: Lease) -> None:
        if lease.state != "open":
            raise TaskQueueError(
                f"task {lease.task_id}'s lease is already settled ({lease.state}); settle once"
            )

    def _settle(self, lease: Lease, ack: AcknowledgeType, state: State) -> None:
        """Acknowledge one record and commit; mark the lease settled either way."""
        self._check_open(lease)
        lease.state = state
        self._open.discard(lease)
        if lease in self._held:
            self._held.remove(lease)
        try:
            self._acknowledge(lease._member, lease._message, ack, lease.task_id)
        except LeaseExpiredError:
            lease.state = "expired"
            raise

    def _acknowledge(
        self, member: _Member, message: Message, ack: AcknowledgeType, task_id: str = ""
    ) -> None:
        topic, partition, offset = message.topic(), message.partition(), message.offset()
        member.unsettled -= 1
        try:
            member.consumer.acknowledge(message, ack)
            results = member.consumer.commit_sync(COMMIT_TIMEOUT_S)
        except (IllegalStateException, KafkaException) as exc:
            raise LeaseExpiredError(
                f"acknowledging task {task_id!r} ({topic}[{partition}]@{offset}) failed: {exc}; it will be "
                "delivered again",
                task_id=task_id,
            ) from exc
        for tp, error in results.items():
            if tp.topic == topic and tp.partition == partition and error is not None:
                raise LeaseExpiredError(
                    f"the broker refused the acknowledgement of task {task_id!r} ({topic}[{partition}]@{offset}: "
                    f"{error.args[0].str() if error.args else error}): its lock of {self.lock_s:.0f} s ran "
                    "out first, and the task goes to another attempt; keep attempts within the deadline",
                    task_id=task_id,
                )

    def _flush_outcomes(self) -> None:
        """Wait for the outcome events; a lost one is logged and counted, never undoes a settlement."""
        try:
            self._outcomes.flush()
        except PublishError as exc:
            self.stats.lost_events += exc.failed
            log.error("task outcome events lost (status will be off by them): %s", exc)

    def _event(self, event: Event, lease: Lease, error: str | None = None) -> None:
        self._outcomes.queue(
            event,
            task_id=lease.task_id,
            attempt=lease.attempt,
            priority=lease.priority,
            coordinates=lease.coordinates,
            error=error,
        )

    # Getting records.

    def _next(self, *, hurry: bool, end: float) -> Lease | None:
        """The next lease by priority: a held one, else one polled from the class's free consumers.

        Every free consumer of a class is polled, least recently polled first: the share group
        assigns each consumer its own partitions, so a task waits on the one consumer that owns
        its partition. A consumer that has not fetched yet is started with a poll of no wait; if
        some have fetched for less than SETTLE_S, the queue waits out one of them unless `hurry`
        (a lease is at hand already), in which case it returns None rather than let a lower class
        jump the queue; what they fetch meanwhile is held for the next take. No wait outlasts `end`.
        """
        for priority in self._scheduler.order():
            held = next((lease for lease in self._held if lease.priority == priority), None)
            if held is not None:
                self._held.remove(held)
                return held
            members = self._free(priority)
            lease = self._poll_each(members, lambda m: m.armed_since is None or self._settled(m))
            if lease is not None:
                return lease
            settling = [m for m in members if m.armed_since is not None and not self._settled(m)]
            if not settling:
                continue
            if hurry:
                return None
            first = settling[0]
            assert first.armed_since is not None
            now = time.monotonic()
            wait = max(0.0, min(first.armed_since + SETTLE_S, end) - now)
            lease = self._poll_each([first], lambda m: True, wait)
            lease = lease or self._poll_each(settling[1:], self._settled)
            if lease is not None or not self._settled(first):
                return lease  # None when `end` cut the wait short: no lower class jumps the queue
        return None

    def _poll_each(
        self, members: list[_Member], which: Callable[[_Member], bool], wait: float = 0.0
    ) -> Lease | None:
        """Poll the members `which` accepts until one yields a lease; extra leases are held."""
        for member in members:
            if not which(member):
                continue
            leases = self._poll(member, wait)
            if leases:
                self._held.extend(leases[1:])
                self.stats.held += len(leases) - 1
                return leases[0]
        return None

    @staticmethod
    def _settled(member: _Member) -> bool:
        """The member has fetched in the background for at least SETTLE_S."""
        return member.armed_since is not None and time.monotonic() - member.armed_since >= SETTLE_S

    def _idle(self, wait: float) -> None:
        """Wait for tasks on the class tried first; what arrives is held for the next round."""
        for priority in self._scheduler.order():
            members = self._free(priority)
            if members:
                self._held.extend(self._poll(members[0], wait))
                return
        time.sleep(wait)

    def _keep(self) -> None:
        """Collect background fetches every KEEP_S, so a held record's lock is bounded tightly.

        A record a consumer fetched in the background was locked no earlier than that consumer's
        last empty poll; polling every KEEP_S keeps that bound close to the truth whatever the
        caller's rhythm, and requeues held records before their locks run out.
        """
        while not self._stopping.wait(KEEP_S):
            with self._lock:
                if self._closed:
                    return
                try:
                    self._drain()
                except (PublishError, TaskQueueError, LeaseExpiredError) as exc:
                    log.warning("task queue keeper: %s", exc)

    def _drain(self) -> None:
        """Collect what consumers fetched in the background; requeue held leases gone stale."""
        for members in self._members.values():
            for member in members:
                if member.free and member.armed_since is not None:
                    leases = self._poll(member, 0.0)
                    self._held.extend(leases)
                    self.stats.held += len(leases)
        for lease in list(self._held):
            if lease.expires_in() < lease.task.deadline_ms / 1000:
                self.stats.stale += 1
                self._held.remove(lease)
                self._requeue(lease, reason="held too long before a start")

    def _free(self, priority: int) -> list[_Member]:
        """The class's consumers that hold nothing, least recently polled first."""
        return sorted((m for m in self._members[priority] if m.free), key=lambda m: m.polled_at)

    def _poll(self, member: _Member, wait: float) -> list[Lease]:
        started = member.polled_at = time.monotonic()
        messages = member.consumer.poll(wait)
        self.stats.polls += 1
        records = [message for message in messages if message.error() is None]
        topic = self.topics.classes[member.priority]
        for message in messages:
            error = message.error()
            if error is None:
                continue
            if error.fatal():
                raise TaskQueueError(
                    f"share consumer of {topic} failed for good: {error.str()}; make a new queue"
                )
            if error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART and not records:
                raise TaskQueueError(
                    f"task topic {topic} does not exist: {error.str()}; provision it (`rollstream up`)"
                )
            log.warning("share consumer of %s: %s", topic, error.str())
        if not records:
            member.armed_since = member.armed_since or started
            member.empty_poll_at = started
            return []
        armed, member.armed_since = member.armed_since is not None, None
        member.unsettled = len(records)
        self.stats.records += len(records)
        leases = []
        for message in records:
            acquired = started
            if armed:  # fetched in the background since the last empty poll, or just before it
                acquired = max(member.empty_poll_at - TRANSIT_S, _timestamp(message) - CLOCK_SKEW_S)
            lease = self._lease(member, message, acquired)
            if lease is not None:
                leases.append(lease)
        return leases

    def _lease(self, member: _Member, message: Message, acquired_at: float) -> Lease | None:
        """A lease on one record, or None after dead-lettering what must not be handed out."""
        delivery = message.delivery_count() or 1
        try:
            task = self._codec.decode(message.value() or b"")
        except DecodeError as exc:
            self._bury(member, message, "malformed", str(exc), delivery, "")
            return None
        except TaskError as exc:
            self._bury(member, message, "invalid", str(exc), delivery, _key(message))
            return None
        attempt = task.prior_attempts + delivery
        if task.deadline_ms > self.lock_s * 1000:
            error = (
                f"deadline_ms = {task.deadline_ms} outlasts share group {self.group!r}'s lock of "
                f"{self.lock_s * 1000:.0f} ms: a worker could lose the lease mid-attempt"
            )
            self._bury(member, message, "invalid", error, attempt, task.task_id)
            return None
        if attempt > self.max_attempts:
            error = (
                f"delivery {delivery} makes attempt {attempt} of at most {self.max_attempts}: earlier "
                "attempts ended without an outcome (the worker died or overran its lock)"
            )
            self._bury(member, message, "attempts_exhausted", error, attempt, task.task_id)
            return None
        return Lease(
            self, member, message, task, attempt=attempt, acquired_at=acquired_at, lock_s=self.lock_s
        )

    def _bury(
        self,
        member: _Member,
        message: Message,
        reason: Reason,
        error: str,
        attempts: int,
        task_id: str,
        lease: Lease | None = None,
    ) -> None:
        """Write a task dead letter, wait for it, then reject the record and log `dead`."""
        source = (message.topic() or "", message.partition() or 0, message.offset() or 0)
        letter = TaskDeadLetter(
            reason, error, attempts, task_id, self.worker_id, source, message.value() or b""
        )
        try:
            self._sender.send(
                self.topics.dead_letters, letter.value, key=task_id or "malformed", headers=letter.headers()
            )
        except PublishError:
            if lease is not None:
                self._settle(lease, AcknowledgeType.RELEASE, "released")
            else:
                self._acknowledge(member, message, AcknowledgeType.RELEASE)
            raise
        if lease is not None:
            self._settle(lease, AcknowledgeType.REJECT, "dead")
        else:
            self.stats.dead += 1
            self._acknowledge(member, message, AcknowledgeType.REJECT)
        priority = member.priority
        self._outcomes.queue(
            "dead",
            task_id=task_id,
            attempt=attempts,
            priority=priority,
            coordinates=source,
            error=f"{reason}: {error}",
        )
        self._flush_outcomes()


def _timestamp(message: Message) -> float:
    """The record's timestamp on our monotonic clock."""
    _, millis = message.timestamp()
    return time.monotonic() - (time.time() - millis / 1000)


def _key(message: Message) -> str:
    key = message.key()
    return key.decode(errors="replace") if isinstance(key, bytes) else ""
