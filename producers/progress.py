"""A rich progress bar showing the achieved publishing rate (the load generator's display)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


@contextlib.contextmanager
def rate_bar(*, enabled: bool = True) -> Iterator[Callable[[int, int, float], None]]:
    """Yield an update(done, total, seconds) that redraws the bar; a no-op when not enabled."""
    if not enabled:
        yield lambda done, total, seconds: None
        return
    columns = (
        TextColumn("publishing"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]:>9.0f} msg/s"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, transient=False) as bar:
        task = bar.add_task("publish", total=None, rate=0.0)

        def update(done: int, total: int, seconds: float) -> None:
            bar.update(task, completed=done, total=total, rate=done / seconds if seconds else 0.0)

        yield update
