"""The asyncio publisher: awaits budget instead of blocking, resolves an asyncio future per message
(or per batch: `publish_many`).

It wraps the same core as `Publisher` rather than confluent-kafka's AIOProducer, which refuses
headers (HAZARDS.md) and would give the two publishers different delivery semantics. Nothing
here blocks the event loop: deliveries are served on the core's threads and handed to the loop
with ``call_soon_threadsafe``; records over `OFFLOAD_BYTES` are encoded in a worker thread.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import Any

from producers.core import BatchReport, Report
from producers.delivery import BatchResult, DeliveryCallback, DeliveryResult, Outgoing
from producers.exceptions import BackpressureError
from producers.lanes import Lane
from producers.publisher import BUFFER_RETRY_S, BasePublisher, unsent_rest

OFFLOAD_BYTES = 1024 * 1024
# A caller publishing in a tight loop never waits when the budget has room: yield to the loop at
# least this often so other coroutines keep running.
YIELD_EVERY_S = 0.005
_PACKED = ("prompt_tokens", "response_tokens", "response_logprobs")


class _Settler:
    """Hands delivery results to the event loop in bursts: one loop wake-up per burst, not per message.

    Delivery reports arrive on the core's threads a batch at a time; waking the loop (a self-pipe
    write) and taking the GIL back and forth for each message would starve the loop's other
    coroutines, so results queue here and the loop settles them all in one callback.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._results: collections.deque[tuple[asyncio.Future[DeliveryResult], DeliveryResult]] = (
            collections.deque()
        )
        self._scheduled = False
        self._lock = threading.Lock()

    def add(self, future: asyncio.Future[DeliveryResult], result: DeliveryResult) -> None:
        """Queue one result (any thread); wakes the loop only when none was waiting to be settled."""
        with self._lock:
            self._results.append((future, result))
            if self._scheduled:
                return
            self._scheduled = True
        with contextlib.suppress(RuntimeError):  # the loop already closed: nobody awaits any more
            self._loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        with self._lock:
            self._scheduled = False
            results, self._results = self._results, collections.deque()
        for future, result in results:
            if future.cancelled():
                continue
            if result.error is None:
                future.set_result(result)
            else:
                future.set_exception(result.error)


class _Handoff(Report):
    """One message's report, on a delivery thread: the result to its settler, then to `on_delivery`."""

    __slots__ = ("future", "on_delivery", "settler")

    def __init__(
        self,
        settler: _Settler,
        future: asyncio.Future[DeliveryResult],
        on_delivery: DeliveryCallback | None,
    ) -> None:
        self.settler, self.future, self.on_delivery = settler, future, on_delivery

    def settle(self, result: DeliveryResult) -> None:
        self.settler.add(self.future, result)
        if self.on_delivery is not None:
            self.on_delivery(result)


def _on_loop(batch: BatchReport, loop: asyncio.AbstractEventLoop) -> asyncio.Future[BatchResult]:
    """An asyncio future of `loop` settled as `batch` is (from a delivery thread, one loop wake-up)."""
    future: asyncio.Future[BatchResult] = loop.create_future()

    def settle() -> None:
        if future.cancelled():
            return
        error = batch.exception(0)
        if error is None:
            future.set_result(batch.result(0))
        else:
            future.set_exception(error)

    def hand_over(_: object) -> None:
        with contextlib.suppress(RuntimeError):  # the loop already closed: nobody awaits any more
            loop.call_soon_threadsafe(settle)

    batch.add_done_callback(hand_over)
    return future


def _waker(loop: asyncio.AbstractEventLoop, room: asyncio.Event) -> Callable[[], None]:
    def wake() -> None:
        with contextlib.suppress(RuntimeError):  # the loop already closed: nobody waits any more
            loop.call_soon_threadsafe(room.set)

    return wake


class AsyncPublisher(BasePublisher):
    """`Publisher` for coroutines: same arguments, same results, awaited.

    ``fut = await pub.publish(record)`` returns once the message is queued (after awaiting room
    in the byte budget, at most `block_timeout_s`, then `BackpressureError`); ``await fut`` gives
    its `DeliveryResult` or raises its `DeliveryError`. ``await pub.send(record)`` does both.
    Use it inside one event loop; ``async with`` flushes and closes.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._yielded = time.monotonic()
        self._settlers: dict[asyncio.AbstractEventLoop, _Settler] = {}

    async def publish(
        self,
        record: Mapping[str, Any],
        *,
        lane: Lane | str | None = None,
        on_delivery: DeliveryCallback | None = None,
        timeout: float | None = None,
    ) -> asyncio.Future[DeliveryResult]:
        """Validate, encode and queue one trajectory; returns the future of its delivery."""
        if sum(len(record.get(f) or b"") for f in _PACKED) > OFFLOAD_BYTES:
            out = await asyncio.get_running_loop().run_in_executor(None, self.core.prepare, record)
        else:
            out = self.core.prepare(record)
        return await self._send(out, lane, on_delivery, timeout)

    async def publish_many(
        self,
        records: Sequence[Mapping[str, Any]],
        *,
        lane: Lane | str | None = None,
        timeout: float | None = None,
    ) -> asyncio.Future[BatchResult]:
        """`Publisher.publish_many` for coroutines: returns once every record is queued (awaiting
        budget as `publish` does), with one future for the batch's `BatchResult`."""
        core = self.core
        loop = asyncio.get_running_loop()
        if sum(len(r.get(f) or b"") for r in records for f in _PACKED) > OFFLOAD_BYTES:
            outs = await loop.run_in_executor(None, core.prepare_many, records)
        else:
            outs = core.prepare_many(records)
        chosen = core.lane if lane is None else Lane(lane)
        client = core.client(chosen)
        batch = BatchReport(core, chosen, len(outs))
        future = _on_loop(batch, loop)
        if not outs:
            batch.finish()
            return future
        wait = self.block_timeout_s if timeout is None else timeout
        deadline = time.monotonic() + wait
        for index in range(core.send_many(client, outs, batch), len(outs)):
            out = outs[index]
            try:
                while True:
                    await self._reserve(out, deadline, wait)
                    if core.send_in(client, out, batch):
                        break
                    # librdkafka's own queue is full (its message count): give deliveries a moment.
                    if time.monotonic() >= deadline:
                        raise core.backpressure(out, wait)
                    await asyncio.sleep(BUFFER_RETRY_S)
            except BackpressureError as exc:
                raise unsent_rest(exc, batch, outs, index) from None
        if time.monotonic() - self._yielded > YIELD_EVERY_S:
            await asyncio.sleep(0)
            self._yielded = time.monotonic()
        return future

    async def publish_raw(
        self,
        value: bytes,
        key: bytes | None = None,
        *,
        message_id: str = "raw",
        lane: Lane | str | None = None,
        on_delivery: DeliveryCallback | None = None,
        timeout: float | None = None,
    ) -> asyncio.Future[DeliveryResult]:
        """Queue bytes as they are, unvalidated and unencoded."""
        out = self.core.route(Outgoing(self.topic, key, value, message_id))
        return await self._send(out, lane, on_delivery, timeout)

    async def send(
        self, record: Mapping[str, Any], *, lane: Lane | str | None = None, timeout: float | None = None
    ) -> DeliveryResult:
        """Publish one trajectory and await its delivery; raises its DeliveryError on failure."""
        return await (await self.publish(record, lane=lane, timeout=timeout))

    async def _send(
        self,
        out: Outgoing,
        lane: Lane | str | None,
        on_delivery: DeliveryCallback | None,
        timeout: float | None,
    ) -> asyncio.Future[DeliveryResult]:
        loop = asyncio.get_running_loop()
        wait = self.block_timeout_s if timeout is None else timeout
        deadline = time.monotonic() + wait
        future: asyncio.Future[DeliveryResult] = loop.create_future()
        settler = self._settlers.get(loop) or self._settlers.setdefault(loop, _Settler(loop))
        done = _Handoff(settler, future, on_delivery)
        while True:
            await self._reserve(out, deadline, wait)
            try:
                self.core.send(out, None if lane is None else Lane(lane), done)
            except BufferError:
                if time.monotonic() >= deadline:
                    raise self.core.backpressure(out, wait) from None
                await asyncio.sleep(BUFFER_RETRY_S)
                continue
            if time.monotonic() - self._yielded > YIELD_EVERY_S:
                await asyncio.sleep(0)
                self._yielded = time.monotonic()
            return future

    async def _reserve(self, out: Outgoing, deadline: float, wait: float) -> None:
        loop = asyncio.get_running_loop()
        while True:
            room = asyncio.Event()
            if self.core.reserve_or_wait(out.size, _waker(loop, room)):
                return
            left = deadline - time.monotonic()
            if left <= 0:
                raise self.core.backpressure(out, wait)
            try:
                await asyncio.wait_for(room.wait(), left)
            except TimeoutError:
                raise self.core.backpressure(out, wait) from None
            self._yielded = time.monotonic()

    async def flush(self, timeout: float = 60.0) -> None:
        """Await every queued message's result; raise `PublishError` naming what failed."""
        await asyncio.get_running_loop().run_in_executor(None, self.core.flush, timeout)

    async def close(self, timeout: float = 60.0) -> None:
        """Flush; after `timeout`, fail (by id) what is still unsent; release the clients."""
        await asyncio.get_running_loop().run_in_executor(None, self.core.close, timeout)

    async def __aenter__(self) -> AsyncPublisher:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
