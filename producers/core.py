"""The engine both publishers share: validate, encode, route, budget bytes in flight, report each.

One librdkafka client per lane in use, each with a thread that serves its delivery reports, so
results arrive whether or not the caller polls. The budget counts key and value bytes from
queueing to the delivery report; the sync and asyncio publishers wait for room in their own way
(`reserve_or_wait`, then a condition or an event loop wake-up).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import InvalidStateError
from time import perf_counter
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from producers.delivery import BatchFuture, BatchResult, DeliveryResult, Outgoing
from producers.exceptions import (
    BackpressureError,
    DeliveryError,
    InvalidTrajectoryError,
    ProducerError,
    PublishError,
    RecordTooLargeError,
    ids_preview,
)
from producers.lanes import (
    DEFAULT_MESSAGE_LIMIT,
    FRAMING_BYTES,
    MIB,
    TOPIC_MESSAGE_LIMITS,
    Lane,
    base_config,
    lane_config,
)
from producers.validation import TrajectoryValidator
from schemas import EncodeError, TrajectoryCodec

log = logging.getLogger("producers")
client_log = logging.getLogger("producers.librdkafka")

DEFAULT_BUDGET_BYTES = 128 * MIB
IDLE_POLL_S = 0.005
# Messages a publishing caller queues between two polls of its own for delivery reports.
INLINE_POLL_EVERY = 16
_FAILING = threading.Lock()


def message_key(record: Mapping[str, Any]) -> bytes:
    """The Kafka key: the task id when the sample answers a task (every attempt of a task on one
    partition, so the stage sees them in order), else the group id (a group on one partition)."""
    return str(record.get("task_id") or record["group_id"]).encode()


class _LaneClient:
    """One Kafka producer and the thread that serves its delivery reports.

    In the throughput lane a publishing caller serves reports itself (`poll_inline`, once every
    `INLINE_POLL_EVERY` messages): running them on a second Python thread at the same time would
    pass the GIL back and forth per message, and each poll releases and retakes the GIL. When the
    caller has not polled for `IDLE_POLL_S` (it waits for budget, flushes, or does other work),
    the thread serves them, waking as soon as one arrives. In the latency lane the thread always
    serves them, so a result never waits for the next publish.
    """

    def __init__(self, config: dict[str, Any], lane: Lane) -> None:
        self.producer = Producer(config)
        self.inline = lane is Lane.THROUGHPUT
        self.last_poll = 0.0
        self._unpolled = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name=f"rollstream-{lane}-deliveries", daemon=True)
        self._thread.start()

    def poll_inline(self, queued: int = 1) -> None:
        """Count `queued` messages queued; every `INLINE_POLL_EVERY` of them, serve the reports
        that have arrived, on the caller's thread, without waiting."""
        if self.inline:
            self._unpolled += queued
            if self._unpolled < INLINE_POLL_EVERY:
                return
            self._unpolled = 0
            self.last_poll = time.monotonic()
            try:
                self.producer.poll(0)
            except Exception:
                log.exception("a Kafka client callback raised while serving delivery reports")

    def send_now(self) -> None:
        """Send lingering batches without waiting for linger.ms (what flush does first)."""
        try:
            self.producer.flush(0)
        except Exception:
            log.exception("a Kafka client callback raised while flushing")

    def _poll(self, timeout: float) -> None:
        try:
            self.producer.poll(timeout)
        except Exception:
            # A callback passed in extra_config (stats_cb, ...) raised: confluent-kafka re-raises it
            # here. The message was queued and its result still comes; neither thread may die of it.
            log.exception("a Kafka client callback raised while serving delivery reports")

    def _serve(self) -> None:
        while not self._stop.is_set():
            idle = time.monotonic() - self.last_poll
            if idle >= IDLE_POLL_S:
                self._poll(IDLE_POLL_S)
            else:
                self._stop.wait(IDLE_POLL_S - idle)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._poll(0)
        self.producer.close()


class Report:
    """One queued message's delivery report: librdkafka calls it once, with (error, message).

    It carries what the result needs (id, topic, size, lane, when it was queued) and is also what
    hands the result over: the sync and asyncio publishers subclass it with their `settle` (the
    sync publisher's is the message's future too). One object per message in flight, without the
    value's bytes: thousands are in flight at once, and each tracked object alive there is work
    for the caller's cyclic garbage collector (docs/producers.md, Benchmarks).
    """

    __slots__ = ("core", "lane", "message_id", "size", "started", "topic")

    core: PublisherCore
    lane: Lane
    message_id: str
    size: int
    started: float
    topic: str

    def settle(self, result: DeliveryResult) -> None:
        """Hand `result` over (resolve the caller's future, call its `on_delivery`)."""
        raise NotImplementedError

    def __call__(self, err: KafkaError | None, msg: Message) -> None:
        latency = perf_counter() - self.started
        core = self.core
        if err is None:
            result = DeliveryResult(
                self.message_id, self.topic, msg.partition() or 0, msg.offset() or 0, self.lane, latency
            )
        else:
            result = core.failed_result(self, err, latency)
        try:
            self.settle(result)
        except Exception:
            log.exception(
                "a delivery callback raised for %r (the result was still recorded)", self.message_id
            )
        # Last: a flush that sees nothing in flight finds every future already resolved.
        if result.error is None:
            core.release(self.size, delivered=True)
        else:
            core.release(self.size, (self.message_id, result.error.first_reason))


class BatchReport(BatchFuture):
    """The delivery reports of one `publish_many` call, and its future: one object for all of its
    messages.

    librdkafka calls it once per message with (error, message); it returns that message's budget
    (its key and value, as librdkafka hands them back) and counts it, and the report that
    completes the batch settles it: a `BatchResult`, or a `PublishError` naming every message of
    the batch that failed. Where `publish` keeps one object per message in flight (its `Report`),
    a batch keeps this one, and a delivered message costs a count under the budget's lock. A
    failed message's id is read back from its value (the trajectory id the codec wrote), on that
    path only.
    """

    __slots__ = ("core", "expected", "failures", "lane", "reported", "started", "topic")

    def __init__(self, core: PublisherCore, lane: Lane, expected: int) -> None:
        self.core, self.lane, self.topic = core, lane, core.topic
        self.expected = expected
        self.reported = 0
        self.failures: list[DeliveryError] | None = None
        self.started = perf_counter()

    def __call__(self, err: KafkaError | None, msg: Message) -> None:
        key = msg.key()
        size = len(msg) + (len(key) if key else 0)
        if err is None:
            last = self.core.release(size, delivered=True, batch=self)
        else:
            error = self.core.batch_error(msg, err)
            self._failed(error)  # before the count: the last report sees every failure
            last = self.core.release(size, (error.message_ids[0], error.first_reason), batch=self)
        if last:
            self.finish()

    def _failed(self, error: DeliveryError) -> None:
        with _FAILING:  # reports are served on two threads
            if self.failures is None:
                self.failures = []
            self.failures.append(error)

    def refused(self, error: DeliveryError) -> None:
        """Count a message librdkafka refused to queue (it gets no report) as failed."""
        self._failed(error)
        self.unsent(1)

    def unsent(self, count: int) -> None:
        """Expect `count` fewer reports (messages not queued); settles the batch if none are left."""
        if self.core.expect_fewer(self, count):
            self.finish()

    def finish(self) -> None:
        """Settle the batch (once every report has arrived), unless its caller cancelled it."""
        with contextlib.suppress(InvalidStateError):  # cancelled: nobody wants the result
            if self.failures:
                ids = [e.message_ids[0] for e in self.failures]
                first = self.failures[0].first_reason
                self.set_exception(
                    PublishError(
                        f"{len(ids)} message(s) of a batch to topic {self.topic!r} failed delivery: "
                        f"{ids_preview(ids)}; first: {first}. They are not in Kafka: re-send them",
                        topic=self.topic,
                        failed=len(ids),
                        first_reason=first,
                        message_ids=ids,
                    )
                )
            else:
                result = BatchResult(self.topic, self.lane, self.reported, perf_counter() - self.started)
                self.set_result(result)


class PublisherCore:
    """Validation, encoding, routing, the byte budget and per-message results for one topic.

    Args:
        bootstrap_servers: the Kafka brokers, ``host:port[,host:port...]``.
        topic: where trajectories go.
        ultra_topic: where a trajectory too large for `topic` goes instead; None refuses it.
        lane: the default lane of this publisher's messages.
        max_in_flight_bytes: key and value bytes queued but not yet acknowledged or failed; a
            message that would exceed it waits (one larger than the budget waits for an empty one).
        message_limits: per-topic message size limits (default infra/topics.toml's).
        extra_config: librdkafka options applied last to every lane's client.
        codec: encodes records; default the shipped trajectory schema.
        validator: checks records before encoding; default accepts any domain.
    """

    def __init__(
        self,
        *,
        bootstrap_servers: str,
        topic: str,
        ultra_topic: str | None = None,
        lane: Lane = Lane.THROUGHPUT,
        max_in_flight_bytes: int = DEFAULT_BUDGET_BYTES,
        message_limits: Mapping[str, int] | None = None,
        extra_config: Mapping[str, Any] | None = None,
        codec: TrajectoryCodec | None = None,
        validator: TrajectoryValidator | None = None,
    ) -> None:
        if max_in_flight_bytes < 1:
            raise ProducerError(f"max_in_flight_bytes must be positive, got {max_in_flight_bytes}")
        self.topic, self.ultra_topic, self.lane = topic, ultra_topic, Lane(lane)
        self.codec = codec or TrajectoryCodec()
        self.validator = validator or TrajectoryValidator()
        self.max_in_flight_bytes = max_in_flight_bytes
        limits = {**TOPIC_MESSAGE_LIMITS, **(message_limits or {})}
        self._limits = {t: limits.get(t, DEFAULT_MESSAGE_LIMIT) for t in (topic, ultra_topic) if t}
        self._extra = dict(extra_config or {})
        if "message.max.bytes" in self._extra:
            self._limits = {t: min(v, int(self._extra["message.max.bytes"])) for t, v in self._limits.items()}
        self._fits = self.limit(topic)
        self.bootstrap_servers = bootstrap_servers
        self._clients: dict[Lane, _LaneClient] = {}
        # The budget's counters are guarded by a plain lock (a C-level `with` per message); the
        # condition on it is only waited on by callers out of budget and by flush.
        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)
        self._sleepers = 0
        self._wakers: list[Callable[[], None]] = []
        self._bytes = 0
        self._count = 0
        self._unreported: list[tuple[str, str]] = []
        self._last_client_error = ""
        self._warned: set[int] = set()
        self.published = 0
        self.failed = 0
        self.closed = False
        self.client(self.lane)  # fail fast on a bad configuration

    # -- preparing ------------------------------------------------------------------------------

    def limit(self, topic: str) -> int:
        """The largest key plus value this publisher sends to `topic`."""
        return self._limits.get(topic, DEFAULT_MESSAGE_LIMIT) - FRAMING_BYTES

    def prepare(self, record: Mapping[str, Any]) -> Outgoing:
        """Validate, encode and route one trajectory; raises at the call site, sends nothing."""
        self.validator.check(record)
        try:
            value = self.codec.encode(record)
        except EncodeError as exc:
            raise self._unencodable(record, exc) from exc
        out = Outgoing(self.topic, message_key(record), value, str(record["trajectory_id"]))
        return out if out.size <= self._fits else self.route(out)

    def prepare_many(self, records: Sequence[Mapping[str, Any]]) -> list[Outgoing]:
        """`prepare` each of `records` (one loop, its lookups made once); raises at the first
        record that fails, having sent nothing."""
        check, encode, fits, topic = self.validator.check, self.codec.encode, self._fits, self.topic
        outs: list[Outgoing] = []
        append = outs.append
        for record in records:
            check(record)
            try:
                value = encode(record)
            except EncodeError as exc:
                raise self._unencodable(record, exc) from exc
            out = Outgoing(topic, message_key(record), value, str(record["trajectory_id"]))
            append(out if out.size <= fits else self.route(out))
        return outs

    def _unencodable(self, record: Mapping[str, Any], exc: EncodeError) -> InvalidTrajectoryError:
        tid = str(record.get("trajectory_id", "?"))
        return InvalidTrajectoryError(f"{exc}; it was not sent", trajectory_id=tid, field="schema")

    def route(self, out: Outgoing) -> Outgoing:
        """Send `out` to the ultra topic when it is too large for the main one, or refuse it."""
        if out.size <= self.limit(out.topic):
            return out
        if self.ultra_topic and out.topic == self.topic and out.size <= self.limit(self.ultra_topic):
            return Outgoing(self.ultra_topic, out.key, out.value, out.message_id)
        if self.ultra_topic:
            fix = f"split it, or raise {self.ultra_topic!r}'s max.message.bytes and pass message_limits="
        else:
            fix = "pass ultra_topic='rollouts.ultra' so trajectories this long go to the ultra topic"
        reason = (
            f"{out.message_id!r} is {out.size} bytes (key and value), over the {self.limit(out.topic)}-byte "
            f"limit of topic {out.topic!r} ({self._limits.get(out.topic, DEFAULT_MESSAGE_LIMIT)} less "
            f"{FRAMING_BYTES} bytes of framing)"
        )
        raise RecordTooLargeError(
            f"{reason}; it was not sent: {fix}",
            topic=out.topic,
            failed=1,
            first_reason=reason,
            message_ids=(out.message_id,),
        )

    # -- the budget -----------------------------------------------------------------------------

    def _take(self, size: int) -> bool:
        """Take `size` bytes of budget if they fit; the caller holds the lock."""
        self._check_open()
        if self._count and self._bytes + size > self.max_in_flight_bytes:
            return False
        self._bytes += size
        self._count += 1
        return True

    def reserve_or_wait(self, size: int, waker: Callable[[], None] | None = None) -> bool:
        """Take `size` bytes of budget and return True, or register `waker` and return False."""
        with self._lock:
            if self._take(size):
                return True
            if waker is not None:
                self._wakers.append(waker)
            return False

    def reserve_now(self, size: int) -> bool:
        """Take `size` bytes of budget if the publisher is open and they fit now (`_take` inlined)."""
        with self._lock:
            if not self.closed and (not self._count or self._bytes + size <= self.max_in_flight_bytes):
                self._bytes += size
                self._count += 1
                return True
        return False

    def reserve_all_now(self, size: int, count: int) -> bool:
        """Take budget for `count` messages of `size` bytes in all if the publisher is open and
        they all fit now (one lock for a batch)."""
        with self._lock:
            if not self.closed and self._bytes + size <= self.max_in_flight_bytes:
                self._bytes += size
                self._count += count
                return True
        return False

    def release_all(self, size: int, count: int) -> None:
        """Return budget taken for `count` messages that were not queued after all."""
        with self._lock:
            self._bytes -= size
            self._count -= count
            wakers = self._room_freed()
        for wake in wakers:
            wake()

    def reserve_blocking(self, out: Outgoing, timeout: float) -> None:
        """Take budget for `out`, waiting up to `timeout` seconds; raises BackpressureError."""
        if self.reserve_now(out.size):
            return
        deadline = time.monotonic() + timeout
        with self._room:
            while not self._take(out.size):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise self.backpressure(out, timeout)
                self._sleep(left)

    def _sleep(self, seconds: float) -> None:
        """Wait on the budget's condition (lock held) until a release or `seconds` pass."""
        self._sleepers += 1
        try:
            self._room.wait(seconds)
        finally:
            self._sleepers -= 1

    def backpressure(self, out: Outgoing, timeout: float) -> BackpressureError:
        """The error for `out` not fitting the budget within `timeout` seconds."""
        hint = f" Last client error: {self._last_client_error}." if self._last_client_error else ""
        return BackpressureError(
            f"trajectory {out.message_id!r} ({out.size} bytes) was not sent: the in-flight budget of "
            f"{self.max_in_flight_bytes} bytes stayed full for {timeout:g} s ({self._count} messages, "
            f"{self._bytes} bytes awaiting the broker at {self.bootstrap_servers}; none dropped, each "
            f"keeps its future).{hint} Re-send it later, raise max_in_flight_bytes or the timeout, or "
            "check the broker",
            topic=out.topic,
            failed=1,
            first_reason="in-flight budget full",
            message_ids=(out.message_id,),
        )

    def release(
        self,
        size: int,
        failure: tuple[str, str] | None = None,
        *,
        delivered: bool = False,
        batch: BatchReport | None = None,
    ) -> bool:
        """Return budget after a delivery report (or a refused produce) and wake the waiters.

        Counts the outcome under the same lock: reports are served on two threads (the caller's
        and the delivery thread), and ``+=`` on an attribute is not atomic between them. With
        `batch`, counts the report there too; returns True when it was the batch's last.
        """
        last = False
        with self._lock:
            self._bytes -= size
            self._count -= 1
            if delivered:
                self.published += 1
            elif failure is not None:
                self.failed += 1
                self._unreported.append(failure)
            if batch is not None:
                batch.reported += 1
                last = batch.reported == batch.expected
            wakers = self._room_freed()
        if delivered and self._warned:
            self._warned.clear()  # each kind of client error is logged again after a success
        for wake in wakers:
            wake()
        return last

    def _room_freed(self) -> list[Callable[[], None]]:
        """Under the lock, after budget came back: wake the blocked publishers and hand over the
        asyncio wakers for the caller to call once the lock is released."""
        if self._sleepers:
            self._room.notify_all()
        if not self._wakers:
            return []
        wakers, self._wakers = self._wakers, []
        return wakers

    def expect_fewer(self, batch: BatchReport, count: int) -> bool:
        """`count` of `batch`'s messages will get no report; True when none are left to come."""
        with self._lock:
            batch.expected -= count
            return batch.reported == batch.expected

    def wait_idle(self, timeout: float) -> int:
        """Wait until nothing is in flight, up to `timeout` s; returns how many messages still are."""
        deadline = time.monotonic() + timeout
        for client in list(self._clients.values()):
            client.send_now()
        with self._room:
            while self._count and (left := deadline - time.monotonic()) > 0:
                self._sleep(min(left, 0.1))
            return self._count

    @property
    def in_flight(self) -> tuple[int, int]:
        """(messages, bytes) queued but not yet acknowledged or failed."""
        return self._count, self._bytes

    # -- sending --------------------------------------------------------------------------------

    def client(self, lane: Lane) -> _LaneClient:
        """The Kafka client of `lane`, created on first use."""
        found = self._clients.get(lane)
        if found is not None:
            return found
        config: dict[str, Any] = base_config(
            self.bootstrap_servers,
            message_max_bytes=max(self._limits.values()),
            buffer_bytes=self.max_in_flight_bytes,
        )
        config.update(lane_config(lane))
        config.update(self._extra)
        config["error_cb"] = self._on_error
        config["logger"] = client_log
        try:
            made = _LaneClient(config, lane)
        except KafkaException as exc:
            raise ProducerError(
                f"cannot create the {lane} lane's Kafka producer for topic {self.topic!r}: "
                f"{exc.args[0].str()}; check extra_config against librdkafka's CONFIGURATION.md"
            ) from exc
        return self._clients.setdefault(lane, made)

    def send(self, out: Outgoing, lane: Lane | None, report: Report) -> None:
        """Queue `out` (its budget already taken); `report.settle` gets its result on a delivery thread.

        Raises:
            BufferError: librdkafka's own queue is full (the budget was returned; retry later).
            DeliveryError: librdkafka refused the message outright (budget returned).
        """
        chosen = self.lane if lane is None else Lane(lane)
        client = self._clients.get(chosen) or self.client(chosen)
        report.core, report.lane, report.topic = self, chosen, out.topic
        report.message_id, report.size, report.started = out.message_id, out.size, perf_counter()
        try:
            client.producer.produce(out.topic, out.value, out.key, -1, report)  # -1: partitioner picks
        except BufferError:
            self.release(out.size)
            raise
        except KafkaException as exc:
            self.release(out.size)
            error: KafkaError = exc.args[0]
            raise self._delivery_error(out, error) from exc
        client.poll_inline()

    def send_many(self, client: _LaneClient, outs: list[Outgoing], batch: BatchReport) -> int:
        """Queue as many of `outs` as have room, from the first, as `batch`'s messages; returns
        how many were queued (or refused: see `send_in`).

        When the budget has room for all of them, takes it under one lock and queues them all
        unless librdkafka's own queue fills first (the rest's budget is then returned);
        otherwise queues none: the caller takes budget message by message.
        """
        total = 0
        for out in outs:
            total += out.size
        if not self.reserve_all_now(total, len(outs)):
            return 0
        produce = client.producer.produce
        for index, out in enumerate(outs):
            try:
                produce(out.topic, out.value, out.key, -1, batch)  # -1: partitioner picks
            except BufferError:
                self.release_all(total, len(outs) - index)
                client.poll_inline(index)
                return index
            except KafkaException as exc:
                error = self._delivery_error(out, exc.args[0])
                self.release(out.size, (out.message_id, error.first_reason))
                batch.refused(error)
            total -= out.size
        client.poll_inline(len(outs))
        return len(outs)

    def send_in(self, client: _LaneClient, out: Outgoing, batch: BatchReport) -> bool:
        """Queue `out` (its budget already taken) as one of `batch`'s messages.

        Returns False when librdkafka's own queue is full (the budget was returned: wait and
        retry). A message librdkafka refuses outright is counted failed in the batch, and in
        what `flush` raises.
        """
        try:
            client.producer.produce(out.topic, out.value, out.key, -1, batch)  # -1: partitioner picks
        except BufferError:
            self.release(out.size)
            return False
        except KafkaException as exc:
            error = self._delivery_error(out, exc.args[0])
            self.release(out.size, (out.message_id, error.first_reason))
            batch.refused(error)
            return True
        client.poll_inline()
        return True

    def batch_error(self, msg: Message, err: KafkaError) -> DeliveryError:
        """The error of a batch's message that librdkafka failed with `err`, naming it by the
        trajectory id read back from its value."""
        value, key = msg.value() or b"", msg.key()
        try:
            message_id = str(self.codec.decode(value)["trajectory_id"])
        except Exception:
            message_id = "(a message whose value does not decode)"
        return self._delivery_error(Outgoing(msg.topic() or self.topic, key, value, message_id), err)

    def failed_result(self, report: Report, err: KafkaError, latency: float) -> DeliveryResult:
        """The result of `report`'s message that librdkafka failed with `err`."""
        error = self._delivery_error(report, err)
        return DeliveryResult(report.message_id, report.topic, -1, -1, report.lane, latency, error)

    def _delivery_error(self, out: Outgoing | Report, err: KafkaError) -> DeliveryError:
        reason = f"{err.name()}: {err.str()}"
        if err.code() == KafkaError.MSG_SIZE_TOO_LARGE:
            reason += (
                f" (the broker refused the batch holding this {out.size}-byte message as over topic "
                f"{out.topic!r}'s max.message.bytes: every message of that batch failed; keep batch.size "
                "below the topic's limit and route long trajectories to the ultra topic)"
            )
        elif err.code() in (KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT):
            reason += " (the publisher was closed before the broker acknowledged it)"
        return DeliveryError(
            f"{out.message_id!r} was not delivered to topic {out.topic!r}: {reason}; it is not in Kafka, re-send it",
            topic=out.topic,
            message_id=out.message_id,
            code=err.name(),
            reason=reason,
        )

    def _on_error(self, err: KafkaError) -> None:
        self._last_client_error = f"{err.name()}: {err.str()}"
        if err.fatal():
            log.error("fatal Kafka client error, the publisher for %r is unusable: %s", self.topic, err.str())
            return
        # Each kind is logged once until a delivery succeeds: the client retries by itself.
        level = logging.DEBUG if err.code() in self._warned else logging.WARNING
        self._warned.add(err.code())
        log.log(level, "Kafka client error (the client retries) publishing to %r: %s", self.topic, err.str())

    # -- ending ---------------------------------------------------------------------------------

    def raise_failures(self) -> None:
        """Raise one PublishError naming every message that failed since the last call."""
        with self._room:
            failures, self._unreported = self._unreported, []
        if failures:
            ids = [i for i, _ in failures]
            raise PublishError(
                f"{len(ids)} message(s) to topic {self.topic!r} failed delivery: {ids_preview(ids)}; "
                f"first: {failures[0][1]}. They are not in Kafka: fix the cause and re-send them "
                "(each one's future or callback carried its error too)",
                topic=self.topic,
                failed=len(ids),
                first_reason=failures[0][1],
                message_ids=ids,
            )

    def flush(self, timeout: float) -> None:
        """Wait for every queued message's result, then raise what failed (see `raise_failures`).

        Raises:
            PublishError: some messages failed, or some are still in flight after `timeout` seconds
                (those stay queued; flush again to keep waiting).
        """
        self._check_open()
        remaining = self.wait_idle(timeout)
        if remaining:
            hint = f"; last client error: {self._last_client_error}" if self._last_client_error else ""
            raise PublishError(
                f"{remaining} message(s) to topic {self.topic!r} still in flight after {timeout:g} s{hint}. "
                f"Check that the broker at {self.bootstrap_servers} is up and reachable, then flush() "
                "again to keep waiting, or close() to give up on them (each is then failed by id)",
                topic=self.topic,
                failed=remaining,
                first_reason=f"still undelivered after {timeout:g} s{hint}",
            )
        self.raise_failures()

    def close(self, timeout: float) -> None:
        """Flush; fail by id (purge) what is still unsent after `timeout`; release the clients.

        Raises:
            PublishError: names every message that failed or was purged since the last flush.
        """
        if self.closed:
            return
        try:
            self.wait_idle(timeout)
            if self._count:
                # Undeliverable: purge, so each message's result says so, instead of close()
                # blocking for message.timeout.ms (HAZARDS.md).
                for client in self._clients.values():
                    client.producer.purge()
                self.wait_idle(10.0)
        finally:
            with self._room:
                self.closed = True
                wakers, self._wakers = self._wakers, []
            for wake in wakers:
                wake()
            for client in self._clients.values():
                client.close()
        self.raise_failures()

    def _check_open(self) -> None:
        if self.closed:
            raise PublishError(
                f"the publisher for topic {self.topic!r} is closed: create a new one",
                topic=self.topic,
                failed=0,
                first_reason="closed",
            )
