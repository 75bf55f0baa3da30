"""The rebalance listener: what a lane's intake does when partitions come and go.

Its hooks run in the intake threads, inside librdkafka's rebalance callbacks: a revoked
partition has its decided rows committed and its safe offset returned (committed by the intake
while the partition is still ours) before it goes; an assigned one is accepted by the stage again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

from stream_processors.backpressure import Held
from stream_processors.offsets import TopicPartition
from stream_processors.sink_thread import SinkThread


class RebalanceListener:
    """The intake hooks of every lane (`stored_next`, `on_revoke`, `on_assign`).

    Args:
        sink: where the stage's revoke and assign run.
        held: forgets the messages of revoked partitions.
        passed: True once the start-up check passed (before it no state is loaded to settle).
        on_assigned: called with the lane's name after each assignment (readiness).
    """

    def __init__(
        self,
        sink: SinkThread,
        held: Held,
        passed: Callable[[], bool],
        on_assigned: Callable[[str], None] = lambda _: None,
    ) -> None:
        self.sink = sink
        self.held = held
        self.passed = passed
        self.on_assigned = on_assigned
        self.loop: asyncio.AbstractEventLoop | None = None
        """The event loop that owns `held`; set when the worker starts."""

    def stored_next(self, tp: TopicPartition) -> int | None:
        """The lowest offset of `tp` not yet stored in Delta, or None when not known."""
        part = self.sink.stage.state.partitions.get(tp)
        return None if part is None else part.next

    def on_revoke(self, tps: list[TopicPartition]) -> Mapping[TopicPartition, int]:
        """Settle the revoked partitions before they go; returns their safe offsets."""
        if not self.passed() or self.loop is None:
            return {}
        safe = self.sink.call(lambda: self.sink.revoke(tps))
        self.loop.call_soon_threadsafe(self.held.drop, tps)
        return safe

    def for_lane(self, lane: str) -> Callable[[list[TopicPartition]], None]:
        """The assign hook of lane `lane`: the stage accepts these partitions' batches again."""

        def on_assign(tps: list[TopicPartition]) -> None:
            self.sink.call(lambda: self.sink.stage.assign(tps))
            self.on_assigned(lane)

        return on_assign
