"""The names the task queue works with: a topic per priority class, dead letters, the outcome log."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from schemas.task import PRIORITIES


@dataclass(frozen=True)
class TaskTopics:
    """Where tasks, their dead letters and their outcomes live.

    Attributes:
        classes: priority -> the topic of that class's tasks.
        dead_letters: the task dead-letter topic.
        outcomes: the task outcome log.
    """

    classes: Mapping[int, str]
    dead_letters: str
    outcomes: str

    @classmethod
    def named(cls, prefix: str, *, dead_letters: str, outcomes: str) -> TaskTopics:
        """``<prefix>.high`` and ``<prefix>.low``, as infra/topics.toml declares them."""
        return cls({p: f"{prefix}.{name}" for p, name in PRIORITIES.items()}, dead_letters, outcomes)

    def priority_of(self, topic: str) -> int:
        """The priority class whose tasks `topic` holds."""
        for priority, name in self.classes.items():
            if name == topic:
                return priority
        raise KeyError(f"{topic!r} is not a task topic; task topics are {dict(self.classes)}")
