"""Progress bars with rate and ETA for long commands (process catch-up, learn, demo), on stderr.

`Bars` draws one rich bar per phase while it is enabled (a terminal, no ``--json``); disabled, it
prints the same messages as plain ``[rollstream] ...`` lines and draws nothing, so logs and pipes
stay clean. Library code never imports this: it takes a callback `(phase, done, total)`.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

Advance = Callable[[str, int, int | None], None]
"""(phase, done, total or None) -> None: how far a phase has come."""


class RateColumn(ProgressColumn):
    """Items per second of a task, as rich measures it over its recent updates."""

    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        return Text(f"{speed:,.1f}/s" if speed else "-/s", style="progress.data.speed")


def bars_wanted(*, as_json: bool = False, stream: Any = None) -> bool:
    """Draw bars only on a terminal and never when the output is meant for a program."""
    stream = sys.stderr if stream is None else stream
    return not as_json and bool(getattr(stream, "isatty", lambda: False)())


class Bars:
    """One bar per phase (rate, ETA), or plain lines when disabled. Use as a context manager."""

    def __init__(self, *, enabled: bool, console: Console | None = None) -> None:
        self.enabled = enabled
        self._progress = (
            Progress(
                TextColumn("{task.description:<12}"),
                BarColumn(),
                MofNCompleteColumn(),
                RateColumn(),
                TextColumn("eta"),
                TimeRemainingColumn(),
                TimeElapsedColumn(),
                console=console or Console(stderr=True),
                redirect_stdout=False,
                redirect_stderr=True,
            )
            if enabled
            else None
        )
        self._tasks: dict[str, Any] = {}
        self._lock = threading.Lock()

    def __enter__(self) -> Bars:
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()

    def line(self, message: str) -> None:
        """A message: above the bars when drawing, else one ``[rollstream]`` line on stderr."""
        if self._progress is not None:
            self._progress.console.print(f"[rollstream] {message}", markup=False, highlight=False)
        else:
            print(f"[rollstream] {message}", file=sys.stderr, flush=True)

    def advance(self, phase: str, done: int, total: int | None) -> None:
        """Set `phase`'s bar to `done` of `total` (None: unknown), creating it on first use."""
        if self._progress is None:
            return
        with self._lock:
            task = self._tasks.get(phase)
            if task is None:
                task = self._tasks[phase] = self._progress.add_task(phase, total=total)
            self._progress.update(task, completed=done, total=total)


def follow_catch_up(
    bars: Bars,
    lag: Callable[[], Mapping[Any, tuple[int, int | None]]],
    *,
    interval_s: float = 1.0,
    stop: threading.Event,
) -> threading.Thread | None:
    """Track a consumer group catching up: messages taken since now against the lag now.

    `lag` returns ``{partition: (end offset, committed offset or None)}``. A daemon thread polls it
    until the lag at start is worked off or `stop` is set. Returns None when not drawing.
    """
    if not bars.enabled:
        return None

    def behind(found: Mapping[Any, tuple[int, int | None]]) -> int:
        return sum(max(0, end - (committed or 0)) for end, committed in found.values())

    def run() -> None:
        try:
            start = behind(lag())
        except Exception as exc:  # the broker may still be starting: the bar is optional
            bars.line(f"no catch-up bar: {exc}")
            return
        if start == 0:
            bars.line("caught up: no lag at start")
            return
        while not stop.wait(interval_s):
            try:
                now = behind(lag())
            except Exception:  # a slow metadata call: try again next time
                continue
            bars.advance("catching up", max(0, min(start, start - now)), start)
            if now == 0:
                bars.line(f"caught up: {start} messages taken")
                return

    thread = threading.Thread(target=run, name="rollstream-catch-up", daemon=True)
    thread.start()
    return thread
