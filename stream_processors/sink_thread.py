"""The sink: the one thread that runs the Stage's steps (accept, tick, flush, revoke, assign)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

from stream_processors.intake import Taken
from stream_processors.lanes import Lane
from stream_processors.offsets import TopicPartition
from stream_processors.processing import JudgedBatch
from stream_processors.stage import BatchStats, Stage
from stream_processors.thread_names import named_executor

T = TypeVar("T")
Step = tuple[BatchStats | int, dict[TopicPartition, int]]
"""What a sink step returns: its stats (an accept) or rows written (a tick or flush), and the
safe offsets it leaves."""


class SinkThread:
    """Runs every step of `stage` in one thread, each followed by the safe offsets it leaves."""

    def __init__(self, stage: Stage) -> None:
        self.stage = stage
        self.executor = named_executor("sink")

    def step(self, work: Callable[[], BatchStats | int]) -> asyncio.Future[Step]:
        """Run `work` in the sink thread (from the event loop)."""
        return asyncio.get_running_loop().run_in_executor(
            self.executor, lambda: (work(), self.stage.safe_offsets())
        )

    def accept(self, lane: Lane, judged: JudgedBatch, taken: Taken) -> asyncio.Future[Step]:
        """Accept the part of a judged batch whose partitions were not revoked meanwhile."""

        def work() -> BatchStats:
            batch = judged.only(lambda c: lane.current(taken, c)) if lane.stale(taken) else judged
            return self.stage.accept(batch, caught_up=taken.caught_up(lane.batch_size))

        return self.step(work)

    def call(self, work: Callable[[], T]) -> T:
        """Run `work` in the sink thread and wait for it (from another thread: a rebalance hook)."""
        return self.executor.submit(work).result()

    def revoke(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        """In the sink thread: commit the decided rows, forget `tps`, return their safe offsets."""
        self.stage.flush()
        safe = self.stage.safe_offsets()
        self.stage.revoke(tps)
        return {tp: safe[tp] for tp in tps if tp in safe}
