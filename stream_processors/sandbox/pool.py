"""A bounded pool of concurrent sandbox executions, off the event loop: the work is in the children."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

from stream_processors.thread_names import named_executor

T = TypeVar("T")
R = TypeVar("R")


class SandboxPool:
    """Runs up to `size` judgements at once, each in threads that wait on their bwrap children.

    Args:
        size: most concurrent executions (the `sandbox_pool_size` setting; default the core count).
    """

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"sandbox pool size must be >= 1, got {size}")
        self.size = size
        self._executor = named_executor("sandbox", size)

    def map(self, fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
        """fn over items, `size` at a time, results in order; the first exception raised is re-raised."""
        return list(self._executor.map(fn, items))

    def close(self) -> None:
        """Wait for running executions and stop the threads."""
        self._executor.shutdown(wait=True)
