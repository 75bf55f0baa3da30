"""Errors of the producing stage; every one is a `RollstreamError` and says what to do."""

from __future__ import annotations

from schemas.exceptions import RollstreamError


class ProducerError(RollstreamError):
    """Root of the producers' errors."""


class PublishError(ProducerError):
    """Messages were not acknowledged by the broker; they are not in Kafka and must be re-sent.

    Attributes:
        topic: the topic the messages were meant for.
        failed: how many messages this error reports as not delivered.
        first_reason: the first failure's reason, as the client or broker gave it.
    """

    def __init__(self, message: str, *, topic: str, failed: int, first_reason: str) -> None:
        super().__init__(message)
        self.topic = topic
        self.failed = failed
        self.first_reason = first_reason


class RecordTooLargeError(PublishError):
    """One encoded record exceeds the topic's message size limit; it was not sent."""


class FleetConfigError(ProducerError):
    """The synthetic fleet was configured with an impossible value."""
