"""Tasks: the task queue on a Kafka share group, and the synthetic fleet's task generators.

The queue (`TaskQueue`, `Lease`, `TaskSubmitter`, `read_status`) is where rollout workers take
their work (docs/rollout.md, Tasks). The generators, one module per task type and looked up by
task type, make the synthetic fleet's groups.
"""

from __future__ import annotations

from producers.tasks import code_tasks, extraction_tasks, math_tasks, precomputed_tasks
from producers.tasks.base import GroupContent, TaskGenerator
from producers.tasks.dead_letters import REASONS, TaskDeadLetter
from producers.tasks.exceptions import LeaseExpiredError, TaskQueueError
from producers.tasks.group import GroupTerms, read_group_terms
from producers.tasks.lease import Lease
from producers.tasks.outcomes import Outcome
from producers.tasks.priorities import PriorityScheduler
from producers.tasks.queue import QueueStats, TaskQueue
from producers.tasks.status import ClassStatus, TaskStatus, read_status
from producers.tasks.submit import Refusal, SubmitReport, TaskSubmitter, read_rows, task_from_row
from producers.tasks.topics import TaskTopics

GENERATORS: dict[str, TaskGenerator] = {
    "math": math_tasks.generate,
    "code": code_tasks.generate,
    "extraction": extraction_tasks.generate,
    "precomputed": precomputed_tasks.generate,
}
FAMILIES: dict[str, tuple[str, ...]] = {
    "math": math_tasks.FAMILIES,
    "code": code_tasks.FAMILIES,
    "extraction": extraction_tasks.FAMILIES,
    "precomputed": precomputed_tasks.FAMILIES,
}
TASK_TYPES = tuple(GENERATORS)

__all__ = [
    "FAMILIES",
    "GENERATORS",
    "REASONS",
    "TASK_TYPES",
    "ClassStatus",
    "GroupContent",
    "GroupTerms",
    "Lease",
    "LeaseExpiredError",
    "Outcome",
    "PriorityScheduler",
    "QueueStats",
    "Refusal",
    "SubmitReport",
    "TaskDeadLetter",
    "TaskGenerator",
    "TaskQueue",
    "TaskQueueError",
    "TaskStatus",
    "TaskSubmitter",
    "TaskTopics",
    "read_group_terms",
    "read_rows",
    "read_status",
    "task_from_row",
]
