"""The task outcome log: what workers did with each delivery, for `rollstream tasks status`.

Share groups do not report how many records are in flight, so every worker writes an event per
step of a task's lease to one topic (keyed by task id, JSON values): ``started`` when it hands a
lease out, ``done``, ``released`` (a failed attempt, to be retried), ``requeued`` (put back
without using an attempt) and ``dead`` (a task dead letter). Each event names the task record's
coordinates, so a reader counts every record once whatever was sent twice.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from typing import Any, Literal

from producers.tasks.sending import TaskSender

Event = Literal["started", "done", "released", "requeued", "dead"]
EVENTS: tuple[Event, ...] = ("started", "done", "released", "requeued", "dead")
TERMINAL: frozenset[str] = frozenset({"done", "requeued", "dead"})
"""Events after which a task record is settled for good (a requeued one lives on as its copy)."""


@dataclass(frozen=True)
class Outcome:
    """One event of the outcome log.

    Attributes:
        event: what happened (`EVENTS`).
        task_id: the task ('' when its bytes did not decode).
        attempt: the attempt it happened in (prior attempts + delivery count).
        worker_id: the worker that wrote it.
        priority: the task record's priority class.
        topic, partition, offset: the task record's coordinates.
        time_ms: when, in epoch milliseconds.
        error: the failure or reason, for released, requeued and dead.
    """

    event: Event
    task_id: str
    attempt: int
    worker_id: str
    priority: int
    topic: str
    partition: int
    offset: int
    time_ms: int
    error: str | None = None

    def encode(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes) -> Outcome:
        """One event from its JSON; raises ValueError when it is not one."""
        fields: dict[str, Any] = json.loads(data)
        if fields.get("event") not in EVENTS:
            raise ValueError(f"not a task outcome event: {data[:80]!r}")
        return cls(**fields)

    @property
    def coordinates(self) -> tuple[str, int, int]:
        return (self.topic, self.partition, self.offset)


class OutcomeLog:
    """Writes outcome events through the queue's sender.

    Args:
        sender: the producer that writes them.
        topic: the outcome log topic.
        worker_id: written on every event.
    """

    def __init__(self, sender: TaskSender, *, topic: str, worker_id: str) -> None:
        self.sender, self.topic, self.worker_id = sender, topic, worker_id

    def queue(
        self,
        event: Event,
        *,
        task_id: str,
        attempt: int,
        priority: int,
        coordinates: tuple[str, int, int],
        error: str | None = None,
    ) -> None:
        """Queue one event; `flush` waits for it."""
        topic, partition, offset = coordinates
        outcome = Outcome(
            event, task_id, attempt, self.worker_id, priority, topic, partition, offset, now_ms(), error
        )
        self.sender.queue(self.topic, outcome.encode(), key=task_id or f"{topic}:{partition}:{offset}")

    def flush(self, timeout: float = 60.0) -> None:
        """Wait until every queued event is in Kafka (PublishError names those that are not)."""
        self.sender.flush(self.topic, timeout)


def now_ms() -> int:
    return time.time_ns() // 1_000_000
