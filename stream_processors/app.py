"""The Faust app of the stream stage: rollouts.raw and rollouts.ultra -> groups -> Delta.

One agent per source topic (a lane), each of concurrency 1 (HAZARDS.md: higher concurrency can
commit offsets past unfinished messages). A lane judges its batches (decode, validate, verify,
bucket) in its own thread, so a 64 MiB ultra message never holds up the raw lane nor the event
loop; one sink thread then runs the Stage (groups, statistics, commits) for both lanes. The ultra
lane takes small batches from a small buffer (its memory is about 3 x ultra_batch_size x 64 MiB).

Before either lane consumes, the state stored in Delta is loaded and checked against the
broker: offsets ahead of a topic and a topic id that changed are refused (preflight.py, stage.py).
Batches come from ``stream.noack_take`` (always with ``within``); acks are ours alone and follow
`Stage.safe_offsets()`: a message is acked only once it and every message before it in its
partition is a stored row or dead letter, so Faust (which commits the contiguous acked prefix)
never commits past a pending group's sample. A timer releases timed-out groups and commits a due
outbox. A write that keeps failing crashes the worker without acking. SIGTERM commits the outbox;
pending groups stay pending and are rebuilt by the replay from the stored state.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar, cast

import faust

from schemas.profile import WorkloadProfile, load_profile
from stream_processors.advantages import GroupNormalization
from stream_processors.dead_letters import DeadLetters
from stream_processors.delta_sink import DeltaSink
from stream_processors.exceptions import StreamProcessorError
from stream_processors.executions import ExecutionLog
from stream_processors.groups import GroupBuffer
from stream_processors.kafka_security import KafkaSecurityError, faust_credentials
from stream_processors.offsets import Coordinates, TopicPartition, table_uri
from stream_processors.preflight import OffsetStore, check_stored_offsets, topic_ids, topic_partitions
from stream_processors.processing import BatchProcessor, SourceMessage
from stream_processors.progress import Progress
from stream_processors.stage import BatchStats, Stage
from stream_processors.verifiers import DomainVerifiers, VerifierRegistry

log = logging.getLogger(__name__)
T = TypeVar("T")

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
    loop: asyncio.AbstractEventLoop, executor: ThreadPoolExecutor, work: Callable[[], T]
) -> tuple[T, bool]:
    """Run `work` in the executor and wait for it even if this task is cancelled meanwhile.

    Returns the result and whether a cancellation arrived, so the caller can ack what was written
    and then stop; a half-awaited Delta commit would otherwise leave the acks undecided.
    """
    future = loop.run_in_executor(executor, work)
    cancelled = False
    while True:
        try:
            return await asyncio.shield(future), cancelled
        except asyncio.CancelledError:
            if future.done() and future.cancelled():
                raise
            cancelled = True
            log.info("stop requested: finishing the in-flight step first")


class Acks:
    """Consumed events not yet acked, per partition in offset order; acked once below the safe offset."""

    def __init__(self) -> None:
        self._held: dict[TopicPartition, deque[tuple[int, faust.EventT, faust.StreamT]]] = {}
        self._bytes: dict[str, int] = {}

    def held_bytes(self, topic: str) -> int:
        """Bytes of the held messages of `topic` (judged, pending or in flight, not yet acked)."""
        return self._bytes.get(topic, 0)

    def hold(self, events: Sequence[faust.EventT], stream: faust.StreamT) -> None:
        """Keep a batch's events until they are safe."""
        for e in events:
            tp = (e.message.topic, e.message.partition)
            self._held.setdefault(tp, deque()).append((e.message.offset, e, stream))
            self._bytes[tp[0]] = self._bytes.get(tp[0], 0) + len(e.message.value or b"")

    async def release(self, safe: Mapping[TopicPartition, int]) -> int:
        """Ack every held event below its partition's safe offset; returns how many."""
        acked = 0
        for tp, held in self._held.items():
            limit = safe.get(tp)
            while held and limit is not None and held[0][0] < limit:
                _, event, stream = held.popleft()
                self._bytes[tp[0]] -= len(event.message.value or b"")
                await stream.ack(event)
                acked += 1
        return acked

    def drop(self, tps: Iterable[TopicPartition]) -> None:
        """Forget the events of revoked partitions (never acked: the new owner replays them)."""
        for tp in tps:
            for _, event, _ in self._held.pop(tp, ()):
                self._bytes[tp[0]] -= len(event.message.value or b"")


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
    batch_within_s: float = 0.25,
    raw_partitions: int | None = None,
    profile: WorkloadProfile | None = None,
    normalization: GroupNormalization | None = None,
    group_event_timeout_s: float = 300.0,
    group_wall_timeout_s: float = 30.0,
    domain_decay: float = 1.0,
    domain_warmup: int = 32,
    commit_bytes: int = 64 * 2**20,
    commit_interval_s: float = 1.0,
    raw_buffer_bytes: int = 256 * 2**20,
    session_timeout_s: float = 10.0,
    instance_id: str | None = None,
    storage_options: Mapping[str, str] | None = None,
    producer_config: Mapping[str, Any] | None = None,
    kafka_client: Mapping[str, Any] | None = None,
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
        app_id: names the Delta txn versions and the stored state (the exactly-once identity).
        group_id: the Kafka consumer group; default `app_id`. A new group re-reads the topics from
            the beginning and writes nothing twice.
        batch_size: most messages per batch from `raw_topic`.
        ultra_batch_size: most messages per batch from `ultra_topic`, which is also how many more
            it buffers.
        batch_within_s: the longest a partial batch waits before it is judged (commits are sized
            apart from batches, by `commit_bytes` and `commit_interval_s`).
        raw_partitions: partitions of `raw_topic`; default read from broker metadata.
        profile: the inference workload profile that buckets rows; default the shipped one.
        normalization: how group advantages are computed (advantages.py); default GRPO.
        group_event_timeout_s, group_wall_timeout_s: the timeout rule of groups.py.
        domain_decay, domain_warmup: per-domain running statistics (domain_stats.py).
        commit_bytes, commit_interval_s: a commit is made once the decided rows hold this many
            message bytes, or once the oldest waited this long; when the lanes are caught up
            (their last batches were not full), once the oldest waited 0.25 s.
        raw_buffer_bytes: bound of the raw messages held (judged, in pending groups or in flight,
            not yet acked): above it fetching rollouts.raw pauses, and resumes at half. Faust's
            own buffer adds at most 2 x batch_size messages.
        session_timeout_s: Kafka consumer session timeout: a SIGKILLed worker's partitions stay
            assigned to it for this long before the group's other workers (or its restart) get
            them. Heartbeats run on the event loop, which judging never blocks (it runs in threads).
        instance_id: Kafka static membership (``group.instance.id``), unique per worker of the
            group: a worker restarted with the same id gets its partitions back without a
            rebalance, provided it returns within the session timeout.
        storage_options: deltalake storage options for object stores.
        producer_config: extra librdkafka settings for the dead-letter producer.
        kafka_client: librdkafka settings for every Kafka client of the worker (security: SASL,
            TLS); Faust's consumer gets the equivalent credentials (kafka_security.py).
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
    client = dict(kafka_client or {})
    try:
        credentials = faust_credentials(client)
    except KafkaSecurityError as exc:
        raise StreamProcessorError(f"{exc}; fix kafka_client in the settings") from None
    partitions = raw_partitions or topic_partitions(bootstrap_servers, topics, kafka_client=client)[raw_topic]
    options: dict[str, Any] = {} if data_dir is None else {"datadir": str(data_dir)}
    app = faust.App(
        group_id or app_id,
        broker=faust_broker_url(bootstrap_servers),
        broker_credentials=credentials,
        store="memory://",
        web_enabled=False,
        topic_disable_leader=True,
        topic_partitions=partitions,
        consumer_auto_offset_reset="earliest",
        consumer_max_fetch_size=ULTRA_MAX_MESSAGE_BYTES,
        broker_session_timeout=session_timeout_s,
        broker_heartbeat_interval=min(3.0, session_timeout_s / 3),
        consumer_group_instance_id=instance_id,
        broker_commit_every=batch_size,
        # Pending groups hold acks back for as long as they wait: Faust must not wait for them
        # before a rebalance (revoked partitions are forgotten and replayed by their new owner).
        stream_wait_empty=False,
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
            producer_config={**client, **(producer_config or {})},
        ),
        executions=ExecutionLog(
            table_uri(lake_dir, EXECUTIONS_TABLE), app_id=app_id, storage_options=storage_options
        ),
        normalization=normalization,
        groups=GroupBuffer(event_timeout_s=group_event_timeout_s, wall_timeout_s=group_wall_timeout_s),
        decay=domain_decay,
        warmup=domain_warmup,
        commit_bytes=commit_bytes,
        commit_interval_s=commit_interval_s,
        write_retries=write_retries,
    )
    if isinstance(stage.processor.verifiers, DomainVerifiers) and stage.processor.verifiers.needs_sandbox:
        stage.processor.verifiers.sandbox  # noqa: B018 (checked at start-up: fail loudly, never unsandboxed)
    sink_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rollstream-sink")
    lanes = {
        "raw": ThreadPoolExecutor(max_workers=1, thread_name_prefix="rollstream-raw"),
        "ultra": ThreadPoolExecutor(max_workers=1, thread_name_prefix="rollstream-ultra"),
    }
    progress = Progress()
    acks = Acks()
    preflight: asyncio.Future[None] | None = None
    running = 0

    def start() -> None:
        counts = topic_partitions(bootstrap_servers, topics, kafka_client=client)
        stores: list[tuple[str, OffsetStore]] = [
            (TRAJECTORIES_TABLE, stage.sink),
            (DEAD_LETTERS_TABLE, stage.dead_letters),
        ]
        if stage.executions is not None:
            stores.append((EXECUTIONS_TABLE, stage.executions))
        check_stored_offsets(bootstrap_servers, topics, stores, kafka_client=client)
        held = [(t, p) for t, n in counts.items() for p in range(n)]
        stage.load(held, topic_ids(bootstrap_servers, topics, kafka_client=client))

    async def checked() -> None:
        """Load and check the stored state once, for whichever lane asks first."""
        nonlocal preflight
        if preflight is None:
            preflight = asyncio.get_running_loop().run_in_executor(sink_thread, start)
        await asyncio.shield(preflight)

    paused = False

    def bound_raw_buffer() -> None:
        """Pause fetching rollouts.raw while its held messages exceed raw_buffer_bytes; resume at half."""
        nonlocal paused
        held = acks.held_bytes(raw_topic)
        if held > raw_buffer_bytes and not paused:
            tps = [tp for tp in app.consumer.assignment() if tp.topic == raw_topic]
            app.consumer.pause_partitions(tps)
            paused = True
            log.info("%s: %d bytes held (bound %d); fetching paused", raw_topic, held, raw_buffer_bytes)
        elif paused and held <= raw_buffer_bytes // 2:
            tps = [tp for tp in app.consumer.assignment() if tp.topic == raw_topic]
            app.consumer.resume_partitions(tps)
            paused = False
            log.info("%s: %d bytes held; fetching resumed", raw_topic, held)

    crashing: set[asyncio.Future[None]] = set()

    def crash_on_failure(future: asyncio.Future[Any]) -> None:
        """Stop the worker as soon as an accept fails, even if no batch follows to observe it."""
        if not future.cancelled() and future.exception() is not None:
            log.error("a batch could not be written; stopping without acking: %s", future.exception())
            crashing.add(asyncio.ensure_future(app.crash(cast(BaseException, future.exception()))))

    def with_safe(
        work: Callable[[], BatchStats | int],
    ) -> Callable[[], tuple[BatchStats | int, dict[TopicPartition, int]]]:
        """`work` followed by the safe offsets it leaves, as one call in the sink thread."""
        return lambda: (work(), stage.safe_offsets())

    async def settle(future: asyncio.Future[tuple[BatchStats | int, dict[TopicPartition, int]]]) -> bool:
        """Wait for a sink step even if cancelled meanwhile, ack what became safe; True if cancelled."""
        cancelled = False
        while True:
            try:
                result, safe = await asyncio.shield(future)
                break
            except asyncio.CancelledError:
                if future.done() and future.cancelled():
                    raise
                cancelled = True
                log.info("stop requested: finishing the in-flight sink step first")
        await acks.release(safe)
        bound_raw_buffer()
        if isinstance(result, BatchStats):
            progress.add(result)
        else:
            progress.rows_written += result  # a commit by tick or flush
        return cancelled

    async def step(work: Callable[[], BatchStats | int]) -> bool:
        """Run one stage step in the sink thread, then ack what became safe; True if cancelled."""
        return await settle(asyncio.get_running_loop().run_in_executor(sink_thread, with_safe(work)))

    caught_up = {"raw": True, "ultra": True}
    judging = {"raw": False, "ultra": False}

    async def sink_batches(stream: faust.StreamT, size: int, lane_name: str) -> None:
        """Judge batch N+1 in the lane's thread while the sink thread accepts batch N."""
        nonlocal running
        loop = asyncio.get_running_loop()
        running += 1
        in_flight: asyncio.Future[tuple[BatchStats | int, dict[TopicPartition, int]]] | None = None
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
            async for taken in cast(faust.Stream, stream).noack_take(size, within=batch_within_s):
                # Messages fetched before a rebalance took their partition away: its new owner reads them.
                assigned = app.consumer.assignment()
                events = [e for e in taken if e.message.tp in assigned]
                if not events:
                    continue
                messages = [
                    SourceMessage(
                        Coordinates(e.message.topic, e.message.partition, e.message.offset),
                        e.message.key,
                        e.message.value,
                    )
                    for e in events
                ]
                acks.hold(events, stream)
                try:
                    judging[lane_name] = True
                    try:
                        judged, cancelled = await run_to_completion(
                            loop, lanes[lane_name], functools.partial(stage.judge, messages)
                        )
                    finally:
                        judging[lane_name] = False
                    if in_flight is not None:
                        cancelled = await settle(in_flight) or cancelled
                    caught_up[lane_name] = len(taken) < size
                    accept = functools.partial(stage.accept, judged, caught_up=caught_up[lane_name])
                    in_flight = loop.run_in_executor(sink_thread, with_safe(accept))
                    in_flight.add_done_callback(crash_on_failure)
                    if cancelled or app.should_stop:
                        future, in_flight = in_flight, None
                        cancelled = await settle(future) or cancelled
                        cancelled = await step(stage.flush) or cancelled
                        log.info("stopping: the decided rows were committed and acked first")
                except Exception as exc:
                    log.exception(
                        "a batch of %d messages could not be written; stopping without acking", len(events)
                    )
                    await app.crash(exc)
                    return
                if cancelled:
                    raise asyncio.CancelledError
        finally:
            running -= 1
            if app.should_stop:
                try:
                    if in_flight is not None:
                        await settle(in_flight)
                    await step(stage.flush)
                except Exception:
                    log.exception("committing the decided rows at stop failed; the replay redoes them")
            if running == 0 and app.should_stop:  # not when Faust's supervisor restarts an agent
                stage.dead_letters.close()
                log.info("sink stopped: %s; %d groups pending", progress.summary(), stage.pending_groups)

    raw = faust.Topic(
        app,
        topics=[raw_topic],
        key_serializer="raw",
        value_serializer="raw",
        partitions=partitions,
        maxsize=2 * batch_size,
    )

    @app.agent(raw, concurrency=1, name=f"{app_id}.sink")
    async def sink_raw(stream: faust.StreamT) -> None:
        await sink_batches(stream, batch_size, "raw")

    if ultra_topic is not None:
        # faust.Topic, not app.topic: app.topic drops maxsize (faust 0.15.3).
        ultra = faust.Topic(
            app, topics=[ultra_topic], key_serializer="raw", value_serializer="raw", maxsize=ultra_batch_size
        )

        @app.agent(ultra, concurrency=1, name=f"{app_id}.sink-ultra")
        async def sink_ultra(stream: faust.StreamT) -> None:
            await sink_batches(stream, ultra_batch_size, "ultra")

    @app.timer(interval=min(0.1, commit_interval_s / 4))
    async def release_timed_out() -> None:
        if preflight is None or not preflight.done() or app.should_stop:
            return
        try:
            quiet = all(caught_up.values())
            # Not `quiet and ...`: a worker whose last batch was full and then got nothing more
            # must still release its last pending group (a 1,500-message demo stalled on it).
            idle = not any(judging.values())
            await step(functools.partial(stage.tick, caught_up=quiet, idle=idle))
        except Exception as exc:
            log.exception("releasing timed-out groups failed; stopping")
            await app.crash(exc)

    async def on_revoked(sender: Any, *args: Any, **kwargs: Any) -> None:
        revoked: Iterable[Any] = args[0] if args else kwargs.get("revoked", ())
        tps = [(tp.topic, tp.partition) for tp in revoked]
        if preflight is None or not tps or app.should_stop:
            return
        acks.drop(tps)
        await asyncio.get_running_loop().run_in_executor(sink_thread, stage.revoke, tps)

    async def on_assigned(sender: Any, *args: Any, **kwargs: Any) -> None:
        assigned: Iterable[Any] = args[0] if args else kwargs.get("assigned", ())
        tps = [(tp.topic, tp.partition) for tp in assigned]
        if tps:
            await asyncio.get_running_loop().run_in_executor(sink_thread, stage.assign, tps)

    app.on_partitions_revoked.connect(cast(Any, on_revoked))
    app.on_partitions_assigned.connect(cast(Any, on_assigned))

    @app.timer(interval=log_every_s)
    async def report_progress() -> None:
        log.info("progress: %s; %d groups pending", progress.summary(), stage.pending_groups)

    return app
