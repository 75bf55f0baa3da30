"""The synchronous publisher: a future per message, blocking (with a timeout) when the budget is full.

For threads and plain scripts. A rollout worker running an event loop uses `AsyncPublisher`,
which shares the same core (`producers.core`) and never blocks its loop.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from types import TracebackType
from typing import Any

from producers.core import DEFAULT_BUDGET_BYTES, BatchReport, PublisherCore, Report, _LaneClient
from producers.delivery import BatchResult, DeliveryCallback, DeliveryFuture, DeliveryResult, Outgoing
from producers.exceptions import BackpressureError
from producers.lanes import Lane
from producers.validation import DomainCheck, TrajectoryValidator
from schemas import TrajectoryCodec

DEFAULT_BLOCK_S = 30.0
BUFFER_RETRY_S = 0.005


class _Pending(Report, DeliveryFuture):
    """One message's future, and also its report: librdkafka calls it with the result, which
    settles it and is passed to the caller's `on_delivery`. One object alive per message in flight."""

    __slots__ = ("on_delivery",)

    def __init__(self, on_delivery: DeliveryCallback | None) -> None:
        self.on_delivery = on_delivery

    def settle(self, result: DeliveryResult) -> None:
        if result.error is None:
            self.set_result(result)
        else:
            self.set_exception(result.error)
        if self.on_delivery is not None:
            self.on_delivery(result)


def unsent_rest(
    exc: BackpressureError, batch: BatchReport, outs: list[Outgoing], index: int
) -> BackpressureError:
    """`exc` for the batch message `outs[index]`, widened to name it and every one after it (none
    of them sent); `batch` then expects reports only from those before it."""
    batch.unsent(len(outs) - index)
    unsent = [o.message_id for o in outs[index:]]
    return BackpressureError(
        f"{exc} ({len(unsent)} trajectories of this batch were not sent, from this one on; the "
        f"{index} before it were queued and flush() reports their results)",
        topic=exc.topic,
        failed=len(unsent),
        first_reason=exc.first_reason,
        message_ids=unsent,
    )


class BasePublisher:
    """What the sync and asyncio publishers share: the core, its settings and its counters.

    Args: as `Publisher`.
    """

    def __init__(
        self,
        *,
        bootstrap_servers: str,
        topic: str,
        ultra_topic: str | None = None,
        lane: Lane | str = Lane.THROUGHPUT,
        max_in_flight_bytes: int = DEFAULT_BUDGET_BYTES,
        block_timeout_s: float = DEFAULT_BLOCK_S,
        known_domains: DomainCheck | None = None,
        message_limits: Mapping[str, int] | None = None,
        extra_config: Mapping[str, Any] | None = None,
        codec: TrajectoryCodec | None = None,
    ) -> None:
        self.core = PublisherCore(
            bootstrap_servers=bootstrap_servers,
            topic=topic,
            ultra_topic=ultra_topic,
            lane=Lane(lane),
            max_in_flight_bytes=max_in_flight_bytes,
            message_limits=message_limits,
            extra_config=extra_config,
            codec=codec,
            validator=TrajectoryValidator(known_domains=known_domains),
        )
        self.topic = topic
        self.codec = self.core.codec
        self.block_timeout_s = block_timeout_s

    @property
    def published(self) -> int:
        """Messages the broker has acknowledged so far."""
        return self.core.published

    @property
    def failed(self) -> int:
        """Messages whose delivery failed so far (each reported by id)."""
        return self.core.failed

    @property
    def pending(self) -> int:
        """Messages queued but not yet acknowledged or failed."""
        return self.core.in_flight[0]


class Publisher(BasePublisher):
    """Publishes trajectories to one topic (the too-long ones to `ultra_topic`), keyed by group_id.

    Each `publish` validates and encodes at the call site (raising `InvalidTrajectoryError` or
    `RecordTooLargeError` there), waits up to `block_timeout_s` for room in the in-flight byte
    budget (then raises `BackpressureError` naming the unsent trajectory), and returns a future
    that resolves to its `DeliveryResult` or raises its `DeliveryError`. Nothing is dropped: a
    message ends acknowledged or failed by id. `flush` and `close` (and leaving a ``with``
    block) wait for every result and raise one `PublishError` naming what failed since the last
    flush. Thread-safe.

    Args:
        bootstrap_servers: the Kafka brokers, ``host:port[,host:port...]``.
        topic: where trajectories go.
        ultra_topic: where trajectories too long for `topic` go (e.g. 'rollouts.ultra'); None
            refuses them with RecordTooLargeError.
        lane: the default lane (`Lane.THROUGHPUT` or `Lane.LATENCY`); `publish` may override it.
        max_in_flight_bytes: the byte budget of messages awaiting the broker.
        block_timeout_s: how long `publish` waits for budget before BackpressureError.
        known_domains: domain names (or a predicate) to accept; None accepts any domain.
        message_limits: per-topic message limits for topics not declared in infra/topics.toml.
        extra_config: librdkafka options applied last to every lane's client.
        codec: encodes records; default the shipped trajectory schema.
    """

    def publish(
        self,
        record: Mapping[str, Any],
        *,
        lane: Lane | str | None = None,
        on_delivery: DeliveryCallback | None = None,
        timeout: float | None = None,
    ) -> Future[DeliveryResult]:
        """Validate, encode and queue one trajectory; returns the future of its delivery.

        Raises:
            InvalidTrajectoryError: the record breaks the schema or an invariant.
            RecordTooLargeError: it is too large for the topic (and for the ultra topic, if any).
            BackpressureError: no budget within `timeout` (default `block_timeout_s`) seconds.
        """
        return self._send(self.core.prepare(record), lane, on_delivery, timeout)

    def publish_many(
        self,
        records: Sequence[Mapping[str, Any]],
        *,
        lane: Lane | str | None = None,
        timeout: float | None = None,
    ) -> Future[BatchResult]:
        """Validate, encode and queue several trajectories (a group's samples, say); returns one
        future for all of them.

        Every record is validated and encoded before any is sent, so an invalid or too large one
        raises here with nothing sent. The future resolves to a `BatchResult` once the broker has
        acknowledged them all, or raises a `PublishError` naming each one that failed (`flush`
        names those too). Cheaper per message than `publish`: no future or report per message.

        Raises:
            InvalidTrajectoryError: a record breaks the schema or an invariant (none was sent).
            RecordTooLargeError: a record is too large for the topic and the ultra topic (none sent).
            BackpressureError: no budget within `timeout` (default `block_timeout_s`) seconds for
                a record: it and the records after it were not sent (the error names them); the
                ones before it were queued, and `flush` reports what becomes of them.
        """
        core = self.core
        outs = core.prepare_many(records)
        chosen = core.lane if lane is None else Lane(lane)
        client = core.client(chosen)
        batch = BatchReport(core, chosen, len(outs))
        if not outs:
            batch.finish()
            return batch
        reserve, send_in = core.reserve_now, core.send_in
        deadline: float | None = None
        for index in range(core.send_many(client, outs, batch), len(outs)):
            out = outs[index]
            if reserve(out.size) and send_in(client, out, batch):
                continue
            wait = self.block_timeout_s if timeout is None else timeout
            if deadline is None:
                deadline = time.monotonic() + wait
            try:
                self._send_late(out, client, batch, deadline, wait)
            except BackpressureError as exc:
                raise unsent_rest(exc, batch, outs, index) from None
        return batch

    def _send_late(
        self, out: Outgoing, client: _LaneClient, batch: BatchReport, deadline: float, wait: float
    ) -> None:
        """Queue one of a batch's messages once there is budget (and room in librdkafka's queue)."""
        core = self.core
        while True:
            core.reserve_blocking(out, max(0.0, deadline - time.monotonic()))
            if core.send_in(client, out, batch):
                return
            # librdkafka's own queue is full (its message count): give deliveries a moment.
            if time.monotonic() >= deadline:
                raise core.backpressure(out, wait)
            time.sleep(BUFFER_RETRY_S)

    def publish_raw(
        self,
        value: bytes,
        key: bytes | None = None,
        *,
        message_id: str = "raw",
        lane: Lane | str | None = None,
        on_delivery: DeliveryCallback | None = None,
        timeout: float | None = None,
    ) -> Future[DeliveryResult]:
        """Queue bytes as they are, unvalidated and unencoded (bad input for dead-letter tests)."""
        out = self.core.route(Outgoing(self.topic, key, value, message_id))
        return self._send(out, lane, on_delivery, timeout)

    def _send(
        self,
        out: Outgoing,
        lane: Lane | str | None,
        on_delivery: DeliveryCallback | None,
        timeout: float | None,
    ) -> Future[DeliveryResult]:
        pending = _Pending(on_delivery)
        chosen = None if lane is None else Lane(lane)
        core = self.core
        if core.reserve_now(out.size):  # the common case: room in the budget, and in librdkafka's queue
            try:
                core.send(out, chosen, pending)
                return pending
            except BufferError:  # librdkafka's own queue is full (its message count)
                time.sleep(BUFFER_RETRY_S)
        wait = self.block_timeout_s if timeout is None else timeout
        deadline = time.monotonic() + wait
        while True:
            core.reserve_blocking(out, max(0.0, deadline - time.monotonic()))
            try:
                core.send(out, chosen, pending)
                return pending
            except BufferError:
                # librdkafka's own queue is full (its message count): give deliveries a moment.
                if time.monotonic() >= deadline:
                    raise core.backpressure(out, wait) from None
                time.sleep(BUFFER_RETRY_S)

    def flush(self, timeout: float = 60.0) -> None:
        """Wait for every queued message's result; raise `PublishError` naming what failed."""
        self.core.flush(timeout)

    def close(self, timeout: float = 60.0) -> None:
        """Flush; after `timeout`, fail (by id) what is still unsent; release the clients.

        Raises:
            PublishError: naming every message that failed or was given up since the last flush.
        """
        self.core.close(timeout)

    def __enter__(self) -> Publisher:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
