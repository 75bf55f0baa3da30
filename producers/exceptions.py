"""Errors of the producing stage; every one is a `RollstreamError` and says what to do."""

from __future__ import annotations

from collections.abc import Sequence

from schemas.exceptions import RollstreamError


class ProducerError(RollstreamError):
    """Root of the producers' errors."""


def ids_preview(ids: Sequence[str], limit: int = 5) -> str:
    shown = ", ".join(repr(i) for i in ids[:limit])
    return shown + (f" and {len(ids) - limit} more" if len(ids) > limit else "")


class PublishError(ProducerError):
    """Messages were not acknowledged by the broker; they are not in Kafka and must be re-sent.

    Attributes:
        topic: the topic the messages were meant for.
        failed: how many messages this error reports as not delivered.
        first_reason: the first failure's reason, as the client or broker gave it.
        message_ids: the trajectory ids (or raw message ids) of those messages, when known.
    """

    def __init__(
        self,
        message: str,
        *,
        topic: str,
        failed: int,
        first_reason: str,
        message_ids: Sequence[str] = (),
    ) -> None:
        super().__init__(message)
        self.topic = topic
        self.failed = failed
        self.first_reason = first_reason
        self.message_ids = tuple(message_ids)


class DeliveryError(PublishError):
    """One message was refused or lost on its way to the broker (a future's exception).

    Attributes:
        message_id: the trajectory id (or the raw message's id) that was not delivered.
        code: librdkafka's error name, e.g. ``MSG_SIZE_TOO_LARGE`` or ``_PURGE_QUEUE``.
    """

    def __init__(self, message: str, *, topic: str, message_id: str, code: str, reason: str) -> None:
        super().__init__(message, topic=topic, failed=1, first_reason=reason, message_ids=(message_id,))
        self.message_id = message_id
        self.code = code


class RecordTooLargeError(PublishError):
    """One encoded record exceeds the topic's message size limit; it was not sent."""


class BackpressureError(PublishError):
    """The in-flight byte budget stayed full for the whole wait: the message was not queued.

    Nothing was dropped: the message named is unsent (re-send it), and the ones in flight keep
    their futures. Raised when the broker is slower than the producer for longer than the wait.
    """


class InvalidTrajectoryError(ProducerError):
    """A trajectory breaks the schema or an invariant; it was refused before sending.

    Attributes:
        trajectory_id: the record's id, or '?' when it has none.
        field: the offending field.
    """

    def __init__(self, message: str, *, trajectory_id: str, field: str) -> None:
        super().__init__(message)
        self.trajectory_id = trajectory_id
        self.field = field


class FleetConfigError(ProducerError):
    """The synthetic fleet or the load generator was configured with an impossible value."""
