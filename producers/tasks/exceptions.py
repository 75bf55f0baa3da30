"""Errors of the task queue; each is a `ProducerError` and says what happened to the task."""

from __future__ import annotations

from producers.exceptions import ProducerError


class TaskQueueError(ProducerError):
    """The queue was misused or misconfigured (a lease settled twice, a group without its configs)."""


class LeaseExpiredError(TaskQueueError):
    """The broker refused the acknowledgement: the task's lock ran out before it was settled.

    The task has gone back to the queue (or to another worker) and will be delivered again; what
    this attempt published is a second group of the task, which the stream stage dead-letters as
    ``duplicate_attempt``. Keep attempts shorter than the task's deadline.

    Attributes:
        task_id: the task whose lease expired.
    """

    def __init__(self, message: str, *, task_id: str) -> None:
        super().__init__(message)
        self.task_id = task_id
