"""The committer: once a sink step is done, Kafka offsets follow what became safe."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable

from stream_processors.backpressure import Backpressure, Held
from stream_processors.intake import Intake
from stream_processors.progress import Progress
from stream_processors.shielded import shielded
from stream_processors.sink_thread import SinkThread, Step
from stream_processors.stage import BatchStats


class Committer:
    """Settles sink steps: releases held messages, commits each lane's safe offsets, counts progress.

    Args:
        sink: where steps run.
        intakes: every lane's intake (each commits only the partitions assigned to it).
        held: the messages consumed and not yet safe.
        backpressure: checked after each release; None bounds nothing.
        on_rows: told of the rows each step stored (the rows metric).
    """

    def __init__(
        self,
        sink: SinkThread,
        intakes: Iterable[Intake],
        held: Held,
        backpressure: Backpressure | None = None,
        on_rows: Callable[[int], None] = lambda _: None,
    ) -> None:
        self.sink = sink
        self.intakes = list(intakes)
        self.held = held
        self.backpressure = backpressure
        self.on_rows = on_rows
        self.progress = Progress()

    async def settle(self, future: asyncio.Future[Step]) -> bool:
        """Wait for a sink step even if cancelled meanwhile, commit what became safe; True if cancelled."""
        (result, safe), cancelled = await shielded(future)
        self.held.release(safe)
        for intake in self.intakes:
            intake.commit(safe)
        if self.backpressure is not None:
            self.backpressure.check()
        if isinstance(result, BatchStats):
            self.progress.add(result)
            self.on_rows(result.rows_written)
        else:
            self.progress.rows_written += result  # a commit by tick or flush
            self.on_rows(result)
        return cancelled

    async def step(self, work: Callable[[], BatchStats | int]) -> bool:
        """Run one stage step in the sink thread, then commit what became safe; True if cancelled."""
        return await self.settle(self.sink.step(work))
