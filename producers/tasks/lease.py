"""A lease on one task: the task, its attempt, and the three ways a worker settles it."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Literal

from confluent_kafka import Message

from schemas.task import Task

if TYPE_CHECKING:
    from producers.tasks.queue import TaskQueue, _Member

State = Literal["open", "done", "released", "requeued", "dead", "expired"]


class Lease:
    """A taken task, locked to this worker until it is settled or the group's lock runs out.

    Settle it exactly once, with `done`, `fail` or `requeue`. Until then no other worker gets
    the task; if this worker dies, the broker gives it back after the lock duration and it is
    delivered again with the next attempt number.

    Attributes:
        task: the decoded task.
        attempt: prior attempts + this delivery's count: 1 on the first delivery.
        priority: the task record's priority class.
        coordinates: topic, partition and offset of the task record.
        acquired_at: a monotonic time no later than when the broker locked the record.
        lock_s: the share group's lock duration, in seconds.
    """

    def __init__(
        self,
        queue: TaskQueue,
        member: _Member,
        message: Message,
        task: Task,
        *,
        attempt: int,
        acquired_at: float,
        lock_s: float,
    ) -> None:
        self._queue, self._member, self._message = queue, member, message
        self.task = task
        self.attempt = attempt
        self.priority = task.priority
        self.coordinates: tuple[str, int, int] = (
            message.topic() or "",
            message.partition() or 0,
            message.offset() or 0,
        )
        self.acquired_at = acquired_at
        self.lock_s = lock_s
        self.state: State = "open"

    @property
    def task_id(self) -> str:
        return self.task.task_id

    def expires_in(self) -> float:
        """Seconds left before the lock runs out (a lower bound); settle before it."""
        return self.acquired_at + self.lock_s - time.monotonic()

    def deadline_in(self) -> float:
        """Seconds left of the task's deadline, counted from when the lock began."""
        return self.acquired_at + self.task.deadline_ms / 1000 - time.monotonic()

    def done(self) -> None:
        """The attempt succeeded (its group is in Kafka): accept the task for good.

        Raises:
            LeaseExpiredError: the lock ran out first; the task will be delivered again.
            TaskQueueError: the lease was already settled.
        """
        self._queue._done(self)

    def fail(self, error: str, *, final: bool = False) -> State:
        """The attempt failed: release the task for a retry, or after the last attempt dead-letter it.

        Returns 'released' or 'dead'. A release counts as an attempt; use `requeue` for a stop
        that is not the task's fault. `final` dead-letters the task now, for a failure no attempt
        can mend (a text prompt whose tokenizer disagrees with the model's).

        Raises:
            LeaseExpiredError: the lock ran out first; the task will be delivered again.
            PublishError: the dead letter was not acknowledged; the task was released instead.
        """
        return self._queue._fail(self, error, final=final)

    def requeue(self) -> None:
        """Put the task back without using an attempt (a clean stop, an abort on a weight update).

        Publishes a copy carrying this lease's prior attempts, then accepts the original. A crash
        between the two leaves both in the queue: two attempts of one task, whose second complete
        group the stream stage dead-letters as ``duplicate_attempt``.

        Raises:
            PublishError: the copy was not acknowledged; the task was released instead.
        """
        self._queue._requeue(self, reason="requeued by the worker")

    def __repr__(self) -> str:
        return f"Lease(task_id={self.task_id!r}, attempt={self.attempt}, priority={self.priority}, state={self.state!r})"
