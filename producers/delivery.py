"""What one publish produces: an outgoing message, and the result its delivery report brings."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

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


@dataclass(frozen=True, slots=True)
class DeliveryResult:
    """The broker's answer for one message.

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


DeliveryCallback = Callable[[DeliveryResult], None]
"""Called once per message with its result, on the publisher's delivery thread: keep it short."""
