"""Task dead letters: a task that cannot or will not succeed, with its reason and its bytes.

A letter's value is the task record's bytes as they were taken (whatever they are); its headers
say why, like a trajectory dead letter's (WIRE_FORMAT.md): ``reason``, ``error``, ``attempts``,
``task_id``, ``worker_id``, ``source_topic``, ``source_partition``, ``source_offset``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from confluent_kafka import Message

from producers.tasks.sending import Headers

Reason = Literal["malformed", "invalid", "failed", "attempts_exhausted"]
REASONS: Mapping[str, str] = {
    "malformed": "the bytes do not decode as a task",
    "invalid": "the task decodes but a field is invalid, or its deadline outlasts the lease",
    "failed": "every attempt failed; error is the last attempt's",
    "attempts_exhausted": "the attempts ran out without an outcome (leases expired: workers died or hung)",
}


@dataclass(frozen=True)
class TaskDeadLetter:
    """One task dead letter, as it is written and read back.

    Attributes:
        reason: one of `REASONS`.
        error: the last error, or what was wrong with the bytes.
        attempts: attempts made (prior attempts + deliveries), 0 when unknown.
        task_id: the task, '' when its bytes did not decode.
        worker_id: the worker that wrote the letter.
        source: topic, partition and offset of the task record.
        value: the task record's bytes.
    """

    reason: Reason
    error: str
    attempts: int
    task_id: str
    worker_id: str
    source: tuple[str, int, int]
    value: bytes

    def headers(self) -> Headers:
        topic, partition, offset = self.source
        fields = {
            "reason": self.reason,
            "error": self.error,
            "attempts": str(self.attempts),
            "task_id": self.task_id,
            "worker_id": self.worker_id,
            "source_topic": topic,
            "source_partition": str(partition),
            "source_offset": str(offset),
        }
        return [(key, value.encode()) for key, value in fields.items()]

    @classmethod
    def from_message(cls, message: Message) -> TaskDeadLetter:
        """A letter read back from the task dead-letter topic."""
        pairs: list[tuple[str, Any]] = list(message.headers() or [])  # type: ignore[arg-type]
        headers = {key: bytes(value or b"").decode() for key, value in pairs}
        return cls(
            reason=headers["reason"],  # type: ignore[arg-type]
            error=headers["error"],
            attempts=int(headers["attempts"]),
            task_id=headers["task_id"],
            worker_id=headers["worker_id"],
            source=(headers["source_topic"], int(headers["source_partition"]), int(headers["source_offset"])),
            value=message.value() or b"",
        )
