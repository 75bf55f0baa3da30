"""Task generators of the synthetic fleet, one module per task type, looked up by task type."""

from __future__ import annotations

from producers.tasks import code_tasks, extraction_tasks, math_tasks, precomputed_tasks
from producers.tasks.base import GroupContent, TaskGenerator

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

__all__ = ["FAMILIES", "GENERATORS", "TASK_TYPES", "GroupContent", "TaskGenerator"]
