"""Which priority class the next start is served from: higher first, the lowest at least 1 in Y."""

from __future__ import annotations

from collections.abc import Iterable


class PriorityScheduler:
    """Orders the classes to try for each start.

    Higher classes come first, except that once `low_every` - 1 starts in a row went to other
    classes, the lowest class is tried first until it starts a task. So while every class has
    tasks waiting, each `low_every` consecutive starts include at least one of the lowest class;
    when it has none, the others are served without waiting. The guarantee is per scheduler (one
    `TaskQueue`); across a fleet the lowest class's share of starts is still at least 1/Y.

    Args:
        priorities: the classes (higher number, higher priority).
        low_every: Y, at least 2.
    """

    def __init__(self, priorities: Iterable[int], *, low_every: int) -> None:
        self.priorities = sorted(set(priorities), reverse=True)
        if len(self.priorities) < 1:
            raise ValueError("give at least one priority class")
        if low_every < 2:
            raise ValueError(f"low_every must be at least 2, got low_every={low_every}")
        self.low_every = low_every
        self.since_low = 0

    @property
    def lowest(self) -> int:
        return self.priorities[-1]

    def order(self) -> list[int]:
        """The classes to try for the next start, in order."""
        if self.since_low >= self.low_every - 1:
            return [self.lowest, *self.priorities[:-1]]
        return list(self.priorities)

    def started(self, priority: int) -> None:
        """Record a start from `priority`."""
        self.since_low = 0 if priority == self.lowest else self.since_low + 1
