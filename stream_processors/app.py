"""The Faust app of the stream stage: rollouts.raw and rollouts.ultra in batches -> Delta.

One agent per source topic, each of concurrency 1 (HAZARDS.md: higher concurrency can commit
offsets past unfinished messages), sharing one Stage whose writes run one batch at a time in a
single executor thread. Ultra-long trajectories get their own agent with small batches and a
small buffer, so a burst of 64 MiB messages stays bounded in memory; they do share the sink
thread with ordinary batches.

Before either agent consumes, the offsets stored in Delta are checked against the topics' end
offsets (preflight.py). Batches come from ``stream.noack_take`` (always with ``within``) and are
acked only after both Delta commits returned, so Faust never commits an offset whose row is not
in Delta. Exactly once comes from the offsets stored in Delta (offsets.py), not from Faust:
replays after a crash or under a new consumer group are filtered out by the sinks. A batch that
cannot be written after retries crashes the worker without acking it. The dead-letter producer
is closed when the app stops, after the last agent finished its batch.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, cast

import faust

from schemas.profile import WorkloadProfile, load_profile
from stream_processors.dead_letters import DeadLetters
from stream_processors.delta_sink import DeltaSink
from stream_processors.executions import ExecutionLog
from stream_processors.offsets import Coordinates, table_uri
from stream_processors.preflight import OffsetStore, check_stored_offsets, topic_partitions
from stream_processors.processing import BatchProcessor, SourceMessage
from stream_processors.progress import Progress
from stream_processors.stage import BatchStats, Stage
from stream_processors.verifiers import DomainVerifiers, VerifierRegistry

log = logging.getLogger(__name__)

TRAJECTORIES_TABLE = "trajectories"
DEAD_LETTERS_TABLE = "dead_letters"
EXECUTIONS_TABLE = "executions"
ULTRA_MAX_MESSAGE_BYTES = 67_108_864
"""64 MiB: rollouts.ultra's max.message.bytes as infra/topics.toml declares it. The consumer's
per-partition fetch size (Faust's consumer_max_fetch_size, aiokafka's max_partition_fetch_bytes)
is set to it, so the largest message the topics accept can always be fetched."""


def faust_broker_url(bootstrap_servers: str) -> str:
    """Faust's broker URL list ("kafka://a:9092;kafka://b:9092") from Kafka's "a:9092,b:9092"."""
    return ";".join(f"kafka://{server.strip()}" for server in bootstrap_servers.split(",") if server.strip())


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
    ultra_topic: str | None = "rollouts.ultra",
    dlq_topic: str = "rollouts.dlq",
    app_id: str = "rollstream-processor",
    group_id: str | None = None,
    batch_size: int = 500,
    ultra_batch_size: int = 4,
    batch_within_s: float = 1.0,
    raw_partitions: int | None = None,
    profile: WorkloadProfile | None = None,
    storage_options: Mapping[str, str] | None = None,
    producer_config: Mapping[str, Any] | None = None,
    verifiers: DomainVerifiers | VerifierRegistry | None = None,
    sandbox_pool_size: int = 2,
    write_retries: int = 5,
    log_every_s: float = 10.0,
    data_dir: Path | str | None = None,
) -> faust.App:
    """Build the stream stage's Faust app.

    Args:
        bootstrap_servers: Kafka "host:port[,host:port]".
        lake_dir: directory or object-store URI holding the trajectories and dead_letters tables.
        raw_topic: the topic of encoded trajectories.
        ultra_topic: the topic of ultra-long trajectories (up to ULTRA_MAX_MESSAGE_BYTES each);
            None consumes `raw_topic` only.
        dlq_topic: where dead letters are sent.
        app_id: names the Delta txn versions (the exactly-once identity); keep it stable.
        group_id: the Kafka consumer group; default `app_id`. A new group re-reads the topics from
            the beginning and writes nothing twice.
        batch_size: most messages per batch (and per Delta commit) from `raw_topic`.
        ultra_batch_size: most messages per batch from `ultra_topic`, which is also how many more
            it buffers: bounds its memory to about 3 x ultra_batch_size x 64 MiB.
        batch_within_s: the longest a partial batch waits before it is written.
        raw_partitions: partitions of `raw_topic`; default read from broker metadata, which also
            checks that the topics exist (without it, a missing topic may be auto-created).
        profile: the inference workload profile that buckets rows; default the shipped one.
        storage_options: deltalake storage options for object stores.
        producer_config: extra librdkafka settings for the dead-letter producer.
        verifiers: domain -> verifier; default `DomainVerifiers()` over the shipped domain registry,
            whose sandbox is checked here, before consuming (SandboxUnavailableError otherwise).
        sandbox_pool_size: judgements (sandboxed executions) run at once per batch.
        write_retries: retries of a failing Delta or dead-letter write before the worker stops.
        log_every_s: interval of the progress log line.
        data_dir: Faust's data directory (default ``./<group id>-data`` in the working directory).
    """
    if batch_size < 1 or ultra_batch_size < 1 or batch_within_s <= 0:
        raise ValueError(
            "batch_size and ultra_batch_size must be >= 1 and batch_within_s > 0, got "
            f"{batch_size}, {ultra_batch_size}, {batch_within_s}"
        )
    topics = [raw_topic] if ultra_topic is None else [raw_topic, ultra_topic]
    partitions = raw_partitions or topic_partitions(bootstrap_servers, topics)[raw_topic]
    options: dict[str, Any] = {} if data_dir is None else {"datadir": str(data_dir)}
    app = faust.App(
        group_id or app_id,
        broker=faust_broker_url(bootstrap_servers),
        store="memory://",
        web_enabled=False,
        topic_disable_leader=True,
        topic_partitions=partitions,
        consumer_auto_offset_reset="earliest",
        consumer_max_fetch_size=ULTRA_MAX_MESSAGE_BYTES,
        broker_commit_every=batch_size,
        stream_wait_empty=True,
        **options,
    )
    profile = profile if profile is not None else load_profile()
    stage = Stage(
        BatchProcessor(verifiers=verifiers, profile=profile, pool_size=sandbox_pool_size),
        DeltaSink(
            table_uri(lake_dir, TRAJECTORIES_TABLE),
            app_id=app_id,
            storage_options=storage_options,
            profile_id=profile.id,
        ),
        DeadLetters(
            table_uri(lake_dir, DEAD_LETTERS_TABLE),
            bootstrap_servers=bootstrap_servers,
            topic=dlq_topic,
            app_id=app_id,
            storage_options=storage_options,
            producer_config=producer_config,
        ),
        executions=ExecutionLog(
            table_uri(lake_dir, EXECUTIONS_TABLE), app_id=app_id, storage_options=storage_options
        ),
        write_retries=write_retries,
    )
    if isinstance(stage.processor.verifiers, DomainVerifiers) and stage.processor.verifiers.needs_sandbox:
        stage.processor.verifiers.sandbox  # noqa: B018 (checked at start-up: fail loudly, never unsandboxed)
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rollstream-sink")
    progress = Progress()
    preflight: asyncio.Future[None] | None = None
    running = 0

    async def checked() -> None:
        """Run the stored-offset check once, for whichever agent asks first."""
        nonlocal preflight
        if preflight is None:
            stores: list[tuple[str, OffsetStore]] = [
                (EXECUTIONS_TABLE, stage.executions),  # type: ignore[list-item]
                (TRAJECTORIES_TABLE, stage.sink),
                (DEAD_LETTERS_TABLE, stage.dead_letters),
            ]
            preflight = asyncio.get_running_loop().run_in_executor(
                executor, check_stored_offsets, bootstrap_servers, topics, stores
            )
        await asyncio.shield(preflight)

    async def sink_batches(stream: faust.StreamT, size: int) -> None:
        nonlocal running
        loop = asyncio.get_running_loop()
        running += 1
        try:
            try:
                await checked()
            except Exception as exc:
                await app.crash(exc)
                return
            # Acks are ours alone, for good: noack_take restores enable_acks when it ends, and
            # Faust's passive drainer would then ack, unprocessed, whatever it still buffers
            # (seen: offsets committed after a failed Delta write, on partitions never written).
            stream.enable_acks = False
            async for events in cast(faust.Stream, stream).noack_take(size, within=batch_within_s):
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
            running -= 1
            if running == 0 and app.should_stop:  # not when Faust's supervisor restarts an agent
                stage.dead_letters.close()
                log.info("sink stopped: %s", progress.summary())

    raw = app.topic(raw_topic, key_serializer="raw", value_serializer="raw", partitions=partitions)

    @app.agent(raw, concurrency=1, name=f"{app_id}.sink")
    async def sink_raw(stream: faust.StreamT) -> None:
        await sink_batches(stream, batch_size)

    if ultra_topic is not None:
        # faust.Topic, not app.topic: app.topic drops maxsize (faust 0.15.3).
        ultra = faust.Topic(
            app, topics=[ultra_topic], key_serializer="raw", value_serializer="raw", maxsize=ultra_batch_size
        )

        @app.agent(ultra, concurrency=1, name=f"{app_id}.sink-ultra")
        async def sink_ultra(stream: faust.StreamT) -> None:
            await sink_batches(stream, ultra_batch_size)

    @app.timer(interval=log_every_s)
    async def report_progress() -> None:
        log.info("progress: %s", progress.summary())

    return app
