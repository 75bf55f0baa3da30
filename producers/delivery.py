"""What one publish produces: an outgoing message, and the result its delivery report brings."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures._base import FINISHED, PENDING, _Waiter
from typing import NamedTuple, TypeVar

from producers.exceptions import DeliveryError
from producers.lanes import Lane


class Outgoing:
    """An encoded message routed to its topic, with the id its result will carry.

    `size` (key plus value bytes) is what the in-flight budget counts.
    """

    __slots__ = ("key", "message_id", "size", "topic", "value")

    def __init__(self, topic: str, key: bytes | None, value: bytes, message_id: str) -> None:
        self.topic, self.key, self.value, self.message_id = topic, key, value, message_id
        self.size = len(value) + (len(key) if key else 0)


class DeliveryResult(NamedTuple):
    """The broker's answer for one message (immutable).

    A named tuple rather than a frozen dataclass: one is made per message, and a frozen
    dataclass sets each field through ``object.__setattr__`` (about 1.4 µs here, against 0.3).

    Attributes:
        message_id: the trajectory id (or the id given to a raw message).
        topic: where it went (the ultra topic when it was routed there).
        partition: its partition, -1 when it was not delivered.
        offset: its offset, -1 when it was not delivered.
        lane: the lane it travelled in.
        latency_s: seconds from being queued to the delivery report.
        error: None when the broker acknowledged it; otherwise why it is not in Kafka.
    """

    message_id: str
    topic: str
    partition: int
    offset: int
    lane: Lane
    latency_s: float
    error: DeliveryError | None = None

    @property
    def ok(self) -> bool:
        """True when the broker acknowledged the message."""
        return self.error is None


class BatchResult(NamedTuple):
    """The broker's answer for every message of one `Publisher.publish_many` call (immutable).

    Attributes:
        topic: the publisher's topic (a message of the batch routed to the ultra topic is
            counted in `delivered` all the same).
        lane: the lane they travelled in.
        delivered: how many the broker acknowledged: all of them when this is a future's result.
        latency_s: seconds from queueing the first to the last delivery report.
    """

    topic: str
    lane: Lane
    delivered: int
    latency_s: float


_MAKING = threading.Lock()
_T = TypeVar("_T")


class LazyFuture(Future[_T]):
    """A `concurrent.futures.Future` whose condition and lists are made only when something waits.

    Future() makes a Condition (with its lock and bound methods) and two lists at once: 11
    objects the cyclic garbage collector tracks. With thousands of messages in flight, those live
    long enough to be promoted, and full collections then traverse the caller's whole heap more
    often: about a quarter of a 1 KB publish's CPU here (docs/producers.md, Benchmarks). This
    future makes its condition when first asked for it (result, wait, as_completed,
    add_done_callback, cancel, ...), and its waiters and callbacks lists when first used (always
    under that condition); settling one that nobody waits on needs none of them. A new one holds
    no attribute of its own: its pending state is the class's, and settling it sets its own.
    Behaves as a Future in every respect.
    """

    # Future.__init__'s state (Python 3.11), as class defaults, but for the condition.
    _made: threading.Condition | None = None
    _state = PENDING
    _result = None
    _exception = None
    _waiting: list[_Waiter] | None = None
    _callbacks: list[Callable[[Future[_T]], object]] | None = None

    def __init__(self) -> None:
        pass

    @property
    def _condition(self) -> threading.Condition:
        made = self._made
        if made is None:
            with _MAKING:  # two threads asking at once must share one condition
                if self._made is None:
                    self._made = threading.Condition()
                made = self._made
        return made

    @_condition.setter
    def _condition(self, value: threading.Condition) -> None:
        self._made = value

    @property
    def _waiters(self) -> list[_Waiter]:  # Future only reads it holding the condition
        if self._waiting is None:
            self._waiting = []
        return self._waiting

    @_waiters.setter
    def _waiters(self, value: list[_Waiter]) -> None:
        self._waiting = value

    @property
    def _done_callbacks(self) -> list[Callable[[Future[_T]], object]]:
        if self._callbacks is None:  # appended to holding the condition; read once finished
            self._callbacks = []
        return self._callbacks

    @_done_callbacks.setter
    def _done_callbacks(self, value: list[Callable[[Future[_T]], object]]) -> None:
        self._callbacks = value

    def set_result(self, result: _T) -> None:
        if not self._settle_unwatched(result, None):
            super().set_result(result)

    def set_exception(self, exception: BaseException | None) -> None:
        if not self._settle_unwatched(None, exception):
            super().set_exception(exception)

    def _settle_unwatched(self, result: _T | None, exception: BaseException | None) -> bool:
        """Settle a pending future that has no condition yet; False leaves it to Future's own way.

        Whatever waits on a future or adds a callback to it takes its condition first, and the
        condition is made under the same lock as this: either the waiter then finds the future
        finished, or this finds the condition and Future settles it (notifying the waiters).
        """
        if self._made is not None:
            return False
        with _MAKING:
            if self._made is not None or self._state != PENDING:
                return False
            self._result, self._exception, self._state = result, exception, FINISHED
        return True


class DeliveryFuture(LazyFuture[DeliveryResult]):
    """The future of one message's `DeliveryResult` (`Publisher.publish`)."""


class BatchFuture(LazyFuture[BatchResult]):
    """The future of a batch's `BatchResult` (`Publisher.publish_many`)."""


DeliveryCallback = Callable[[DeliveryResult], None]
"""Called once per message with its result, on the publisher's delivery thread: keep it short."""
