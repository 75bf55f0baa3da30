"""Lanes: one per source topic, its intake (and the thread reading it) and its judging thread.

A lane reads batch N+1 in its intake thread while it judges batch N in its judge thread, so a
64 MiB ultra message never holds up the raw lane nor the event loop.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from stream_processors.intake import Intake, Taken
from stream_processors.offsets import Coordinates
from stream_processors.processing import JudgedBatch, SourceMessage
from stream_processors.shielded import shielded
from stream_processors.thread_names import named_executor

ULTRA_MAX_MESSAGE_BYTES = 67_108_864
"""64 MiB: rollouts.ultra's max.message.bytes as infra/topics.toml declares it. The ultra lane's
fetch sizes are set to it, so the largest message the topics accept can always be fetched."""
RAW_MAX_MESSAGE_BYTES = 4_194_304
"""4 MiB: rollouts.raw's max.message.bytes as infra/topics.toml declares it. The raw lane fetches
at most this much per partition: a largest message always fits one partition's fetch, and the
fetch thread's buffers stay small (8 MiB per partition cost its thread about 2 µs of system time
per 8 KB message in page faults, against a plain consumer's 1 MiB)."""
FETCH_QUEUE_BACKOFF_MS = 10
"""How long librdkafka postpones a partition's next fetch once the consumer's queue is over its
thresholds (`queued.max.messages.kbytes`, 64 MiB): 1,000 ms by default, which drained the queue of a
worker working through a backlog and left its judging thread idle 0.1 to 0.25 s a few times per
40,000 messages. A batch of 500 takes about 35 ms to judge, so 10 ms never lets the queue run dry."""
MAX_POLL_INTERVAL_MS = 900_000
"""A lane polls once per batch; a batch of slow sandboxed judgements may take minutes."""
FETCH: Mapping[str, Mapping[str, int]] = {
    "raw": {"max.partition.fetch.bytes": RAW_MAX_MESSAGE_BYTES, "fetch.max.bytes": 64 * 2**20},
    "ultra": {
        "max.partition.fetch.bytes": ULTRA_MAX_MESSAGE_BYTES,
        "fetch.max.bytes": ULTRA_MAX_MESSAGE_BYTES,
        "queued.max.messages.kbytes": ULTRA_MAX_MESSAGE_BYTES // 1024,
    },
}
"""Fetch sizes per lane name."""


def consumer_config(
    *,
    lane: str,
    bootstrap_servers: str,
    group: str,
    app_id: str,
    session_timeout_s: float,
    instance_id: str | None,
    kafka_client: Mapping[str, Any],
) -> dict[str, Any]:
    """The librdkafka settings of a lane's consumer."""
    config: dict[str, Any] = {
        **kafka_client,
        "bootstrap.servers": bootstrap_servers,
        "group.id": group,
        # Range assigns partition i of every topic to the same member rank, and with static
        # membership ranks follow the instance ids: a worker's raw and ultra lanes then get the
        # same partition numbers, so a group's raw and ultra samples meet in one worker.
        "partition.assignment.strategy": "range",
        "auto.offset.reset": "earliest",
        "session.timeout.ms": int(session_timeout_s * 1000),
        "heartbeat.interval.ms": int(min(3.0, session_timeout_s / 3) * 1000),
        "max.poll.interval.ms": MAX_POLL_INTERVAL_MS,
        "fetch.queue.backoff.ms": FETCH_QUEUE_BACKOFF_MS,
        **FETCH[lane],
        "client.id": f"{app_id}-{lane}",
    }
    if instance_id is not None:
        config["group.instance.id"] = f"{instance_id}-{lane}"
    return config


class Lane:
    """One source topic's intake, batch size and threads.

    Args:
        name: "raw" or "ultra".
        intake: the topic's consumer.
        batch_size: most messages per batch.
        within_s: the longest a partial batch waits before it is judged.
    """

    def __init__(self, name: str, intake: Intake, batch_size: int, within_s: float) -> None:
        self.name = name
        self.intake = intake
        self.batch_size = batch_size
        self.within_s = within_s
        self.reader = named_executor(f"{name}-intake")
        self.judge_thread = named_executor(f"{name}-judge")
        self.judging = False
        """True while a batch is being judged (the wall-clock group timeout waits for it)."""
        self.caught_up = True
        """True when less than a batch waited behind the last one taken."""

    async def subscribe(self) -> None:
        """Join the consumer group (in the intake thread)."""
        await asyncio.get_running_loop().run_in_executor(self.reader, self.intake.subscribe)

    def read(self) -> asyncio.Future[Taken]:
        """Start reading the next batch in the intake thread."""
        loop = asyncio.get_running_loop()
        return loop.run_in_executor(self.reader, self.intake.take, self.batch_size, self.within_s)

    def fresh(self, taken: Taken) -> list[SourceMessage]:
        """The messages of `taken` whose partitions were not revoked since it was read (checked
        once per partition, not per message)."""
        current = {tp: self.intake.current(tp, g) for tp, g in taken.generations.items()}
        if all(current.values()):
            return taken.messages
        return [m for m in taken.messages if current.get((m.coordinates.topic, m.coordinates.partition))]

    def current(self, taken: Taken, c: Coordinates) -> bool:
        """True while the partition of `c` is assigned in the generation `taken` was read in."""
        tp = (c.topic, c.partition)
        return self.intake.current(tp, taken.generations.get(tp, -1))

    def stale(self, taken: Taken) -> bool:
        """True when a partition of `taken` was revoked (or reassigned) since it was read."""
        return not all(self.intake.current(tp, g) for tp, g in taken.generations.items())

    async def judge(
        self, judge: Callable[[Sequence[SourceMessage]], JudgedBatch], messages: Sequence[SourceMessage]
    ) -> tuple[JudgedBatch, bool]:
        """Judge `messages` in the judge thread, to the end even if cancelled; (batch, cancelled)."""
        self.judging = True
        try:
            loop = asyncio.get_running_loop()
            return await shielded(loop.run_in_executor(self.judge_thread, functools.partial(judge, messages)))
        finally:
            self.judging = False

    async def close(self) -> None:
        """Leave the group (in the intake thread: the revoke hook runs there)."""
        loop = asyncio.get_running_loop()
        await asyncio.shield(loop.run_in_executor(self.reader, self.intake.close))
