"""The Faust app of the stream stage: rollouts.raw in batches -> trajectories + dead letters in Delta.

One agent, concurrency 1 (HAZARDS.md: higher concurrency can commit offsets past unfinished
messages). Batches come from ``stream.noack_take`` (always with ``within``) and are acked only
after both Delta commits returned, so Faust never commits an offset whose row is not in Delta.
Exactly once comes from the offsets stored in Delta (offsets.py), not from Faust: replays after
a crash or under a new consumer group are filtered out by the sinks. A batch that cannot be
written after retries crashes the worker without acking it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, cast

import faust
from confluent_kafka.admin import AdminClient

from stream_processors.bucketing import DEFAULT_EDGES
from stream_processors.dead_letters import DeadLetters
from stream_processors.delta_sink import DeltaSink
from stream_processors.exceptions import StreamProcessorError
from stream_processors.offsets import Coordinates, table_uri
from stream_processors.processing import BatchProcessor, SourceMessage
from stream_processors.progress import Progress
from stream_processors.stage import BatchStats, Stage
from stream_processors.verifiers import VerifierRegistry

log = logging.getLogger(__name__)

TRAJECTORIES_TABLE = "trajectories"
DEAD_LETTERS_TABLE = "dead_letters"


def faust_broker_url(bootstrap_servers: str) -> str:
    """Faust's broker URL list ("kafka://a:9092;kafka://b:9092") from Kafka's "a:9092,b:9092"."""
    return ";".join(f"kafka://{server.strip()}" for server in bootstrap_servers.split(",") if server.strip())


def topic_partition_count(bootstrap_servers: str, topic: str, *, timeout_s: float = 15.0) -> int:
    """How many partitions `topic` has, from broker metadata; raises if the topic does not exist.

    Asks for every topic's metadata: naming the topic in the request would make a broker with
    auto.create.topics.enable create it with default settings.
    """
    metadata = AdminClient({"bootstrap.servers": bootstrap_servers}).list_topics(timeout=timeout_s)
    found = metadata.topics.get(topic)
    if found is None or found.error is not None or not found.partitions:
        reason = found.error if found is not None else "not in metadata"
        raise StreamProcessorError(
            f"topic {topic!r} is not available on {bootstrap_servers} ({reason}): provision the "
            "topics first (`rollstream up`), or pass raw_partitions to skip this lookup"
        )
    return len(found.partitions)


async def run_to_completion(
    loop: asyncio.AbstractEventLoop,
    executor: ThreadPoolExecutor,
    stage: Stage,
    messages: Sequence[SourceMessage],
) -> tuple[BatchStats, bool]:
    """Run one batch in the executor and wait for it even if this task is cancelled meanwhile.

    Returns the stats and whether a cancellation arrived, so the caller can ack what was written
    and then stop; a half-awaited Delta commit would otherwise leave the acks undecided.
    """
    future = loop.run_in_executor(executor, stage.run, messages)
    cancelled = False
    while True:
        try:
            return await asyncio.shield(future), cancelled
        except asyncio.CancelledError:
            if future.done() and future.cancelled():
                raise
            cancelled = True
            log.info("stop requested: finishing the in-flight batch of %d messages first", len(messages))


def create_app(
    *,
    bootstrap_servers: str,
    lake_dir: Path | str,
    raw_topic: str = "rollouts.raw",
    dlq_topic: str = "rollouts.dlq",
    app_id: str = "rollstream-processor",
    group_id: str | None = None,
    batch_size: int = 500,
    batch_within_s: float = 1.0,
    raw_partitions: int | None = None,
    bucket_edges: Sequence[int] = DEFAULT_EDGES,
    storage_options: Mapping[str, str] | None = None,
    producer_config: Mapping[str, Any] | None = None,
    verifiers: VerifierRegistry | None = None,
    write_retries: int = 5,
    log_every_s: float = 10.0,
) -> faust.App:
    """Build the stream stage's Faust app.

    Args:
        bootstrap_servers: Kafka "host:port[,host:port]".
        lake_dir: directory or object-store URI holding the trajectories and dead_letters tables.
        raw_topic: the topic of encoded trajectories.
        dlq_topic: where dead letters are sent.
        app_id: names the Delta txn versions (the exactly-once identity); keep it stable.
        group_id: the Kafka consumer group; default `app_id`. A new group re-reads the topic from
            the beginning and writes nothing twice.
        batch_size: most messages per batch (and per Delta commit).
        batch_within_s: the longest a partial batch waits before it is written.
        raw_partitions: partitions of `raw_topic`; default read from broker metadata.
        bucket_edges: length bucket edges.
        storage_options: deltalake storage options for object stores.
        producer_config: extra librdkafka settings for the dead-letter producer.
        verifiers: task_type -> verifier; default `verifiers.default_registry()`.
        write_retries: retries of a failing Delta or dead-letter write before the worker stops.
        log_every_s: interval of the progress log line.
    """
    if batch_size < 1 or batch_within_s <= 0:
        raise ValueError(
            f"batch_size must be >= 1 and batch_within_s > 0, got {batch_size}, {batch_within_s}"
        )
    partitions = raw_partitions or topic_partition_count(bootstrap_servers, raw_topic)
    app = faust.App(
        group_id or app_id,
        broker=faust_broker_url(bootstrap_servers),
        store="memory://",
        web_enabled=False,
        topic_disable_leader=True,
        topic_partitions=partitions,
        consumer_auto_offset_reset="earliest",
        broker_commit_every=batch_size,
        stream_wait_empty=True,
    )
    topic = app.topic(raw_topic, key_serializer="raw", value_serializer="raw", partitions=partitions)
    stage = Stage(
        BatchProcessor(verifiers=verifiers, bucket_edges=bucket_edges),
        DeltaSink(table_uri(lake_dir, TRAJECTORIES_TABLE), app_id=app_id, storage_options=storage_options),
        DeadLetters(
            table_uri(lake_dir, DEAD_LETTERS_TABLE),
            bootstrap_servers=bootstrap_servers,
            topic=dlq_topic,
            app_id=app_id,
            storage_options=storage_options,
            producer_config=producer_config,
        ),
        write_retries=write_retries,
    )
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rollstream-sink")
    progress = Progress()

    @app.agent(topic, concurrency=1, name=f"{app_id}.sink")
    async def sink_batches(stream: faust.StreamT) -> None:
        loop = asyncio.get_running_loop()
        try:
            async for events in cast(faust.Stream, stream).noack_take(batch_size, within=batch_within_s):
                messages = [
                    SourceMessage(
                        Coordinates(e.message.topic, e.message.partition, e.message.offset),
                        e.message.key,
                        e.message.value,
                    )
                    for e in events
                ]
                try:
                    stats, cancelled = await run_to_completion(loop, executor, stage, messages)
                except Exception as exc:
                    log.exception(
                        "batch of %d messages could not be written; stopping without acking", len(events)
                    )
                    await app.crash(exc)
                    return
                for event in events:
                    await stream.ack(event)
                progress.add(stats)
                if cancelled or app.should_stop:
                    log.info(
                        "stopping: the in-flight batch of %d messages was written and acked first",
                        len(events),
                    )
                if cancelled:
                    raise asyncio.CancelledError
        finally:
            log.info("sink stopped: %s", progress.summary())

    @app.timer(interval=log_every_s)
    async def report_progress() -> None:
        log.info("progress: %s", progress.summary())

    return app
