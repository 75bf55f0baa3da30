"""Attempts of a task: its first complete group is kept, a later complete group is dead letters.

A rollout worker that dies after publishing a task's group and before acknowledging the task makes
another complete group when the task is delivered again (the next attempt, under a group id of
its own). The stage keeps the first complete group per task_id and turns every sample of a later
complete group into a dead letter `duplicate_attempt`; a partial group of any attempt times out as
usual (rows, `timed_out`). The completed tasks are remembered by the partition owning their group
(its lowest sample_index's, as for the domain statistics), the newest `task_window` of them, in the
commit state (task_window.py), so a restart or a rebalance between two attempts decides the same
way. A group never mixes attempts: a sample whose (task_id, attempt) differs from its pending
group's is a dead letter `mixed_attempts` (groups.py). Samples not from a task are never refused.

Both are decided when the group is, after letters at higher offsets may have been stored, so they
are written by `DeadLetters.write_decided`, and their offsets become holes of the next commit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stream_processors.dead_letters import DeadLetter
from stream_processors.groups import DecidedGroup, attempt_of
from stream_processors.state import SinkState
from stream_processors.task_window import task_key

if TYPE_CHECKING:
    from stream_processors.processing import SourceMessage

DUPLICATE_ATTEMPT = "duplicate_attempt"
"""The error_type of a later complete group's letters (another attempt of a completed task)."""
MIXED_ATTEMPTS = "mixed_attempts"
"""The error_type of a sample whose (task_id, attempt) differs from its pending group's."""


def refused(decided: DecidedGroup, state: SinkState, source: SourceMessage | None = None) -> list[DeadLetter]:
    """The dead letters `decided` becomes instead of rows, usually none; remembers a task's first
    complete group in its owner partition's window.

    `source` is the message of the sample that decided the group (a "mixed" sample's bytes).
    """
    if decided.status == "mixed":
        (sample,) = decided.samples
        raw, key = (source.value, source.key) if source is not None else (sample.raw, sample.key)
        reason = (
            f"mixed_attempts: group_id {decided.group_id!r} is pending with (task_id, attempt) "
            f"{decided.attempt}, this sample carries {attempt_of(sample.record)}: a group is one "
            "attempt of one task (its id derives from both, schemas/WIRE_FORMAT.md); fix the "
            "producer's group ids"
        )
        return [DeadLetter(reason, MIXED_ATTEMPTS, raw or b"", key, sample.coordinates)]
    task_id, attempt = decided.attempt
    if decided.status != "complete" or task_id is None:
        return []
    task = task_key(task_id)
    if not state.has_task(task):
        owner = decided.samples[0].coordinates
        state.partition((owner.topic, owner.partition)).tasks.add(task)
        return []
    reason = (
        f"duplicate_attempt: task_id {task_id!r} already has a complete group; group_id "
        f"{decided.group_id!r} (attempt {attempt}) is another attempt of it, not a second group"
    )
    return [
        DeadLetter(reason, DUPLICATE_ATTEMPT, s.raw or b"", s.key, s.coordinates) for s in decided.samples
    ]
