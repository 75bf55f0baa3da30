"""The Faust app of the stream stage: rollouts.raw and rollouts.ultra -> groups -> Delta.

Faust is the process shell: supervision, signals, logging, timers. The intake is ours
(intake.py): per source topic (a lane) one confluent-kafka consumer in the worker's consumer
group hands out whole batches, read in the lane's intake thread while the previous batch is
judged. A lane judges its batches (decode, validate, verify, bucket) in its own thread, so a
64 MiB ultra message never holds up the raw lane nor the event loop; one sink thread then runs
the Stage (groups, statistics, commits) for both lanes. The ultra lane takes small batches.

Before either lane consumes, the state stored in Delta is loaded and checked against the broker:
offsets ahead of a topic and a topic id that changed are refused (preflight.py, stage.py). Kafka
offsets are committed by us alone and follow `Stage.safe_offsets()`: never past a message whose
row or dead letter is not stored, so never past a pending group's sample. A partition revoked in
a rebalance has its decided rows committed and its safe offset committed before it goes; a batch
read before the revocation is dropped (its next owner reads it again). A timer releases timed-out
groups and commits a due outbox. A write that keeps failing crashes the worker without committing
offsets. SIGTERM commits the outbox; pending groups stay pending and are rebuilt by the replay.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, cast

import faust
import tenacity
from faust.app.base import BootStrategy

from schemas.profile import WorkloadProfile, load_profile
from stream_processors.advantages import GroupNormalization
from stream_processors.dead_letters import DeadLetters
from stream_processors.delta_sink import DeltaSink
from stream_processors.exceptions import BrokerUnavailableError
from stream_processors.executions import ExecutionLog
from stream_processors.groups import GroupBuffer
from stream_processors.intake import Intake, Taken
from stream_processors.offsets import Coordinates, TopicPartition, table_uri
from stream_processors.preflight import OffsetStore, check_stored_offsets, topic_ids, topic_partitions
from stream_processors.processing import BatchProcessor, JudgedBatch, SourceMessage
from stream_processors.progress import Progress
from stream_processors.stage import BatchStats, Stage
from stream_processors.task_window import DEFAULT_TASK_WINDOW
from stream_processors.verifier_pool import VerifierPool
from stream_processors.verifiers import DomainVerifiers, VerifierRegistry

log = logging.getLogger(__name__)
T = TypeVar("T")

TRAJECTORIES_TABLE = "trajectories"
DEAD_LETTERS_TABLE = "dead_letters"
EXECUTIONS_TABLE = "executions"
ULTRA_MAX_MESSAGE_BYTES = 67_108_864
"""64 MiB: rollouts.ultra's max.message.bytes as infra/topics.toml declares it. The ultra lane's
fetch sizes are set to it, so the largest message the topics accept can always be fetched."""
MAX_POLL_INTERVAL_MS = 900_000
"""A lane polls once per batch; a batch of slow sandboxed judgements may take minutes."""
PREFLIGHT_RETRY_S = 120.0
"""How long start-up keeps asking brokers that do not answer (a node down, an election) before it stops."""


def faust_broker_url(bootstrap_servers: str) -> str:
    """Faust's broker URL list ("kafka://a:9092;kafka://b:9092") from Kafka's "a:9092,b:9092"."""
    return ";".join(f"kafka://{server.strip()}" for server in bootstrap_servers.split(",") if server.strip())


async def run_to_completion(
    loop: asyncio.AbstractEventLoop, executor: ThreadPoolExecutor, work: Callable[[], T]
) -> tuple[T, bool]:
    """Run `work` in the executor and wait for it even if this task is cancelled meanwhile.

    Returns the result and whether a cancellation arrived, so the caller can commit what was
    written and then stop; a half-awaited Delta commit would otherwise leave the offsets undecided.
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


class ShellBoot(BootStrategy):
    """Faust starts no Kafka client of its own: the lanes' consumers and the dead-letter producer
    are confluent-kafka clients (a Faust consumer in the same group would also break the group)."""

    enable_kafka = False


@dataclass(slots=True)
class Lane:
    """One source topic: its intake (and the thread that reads it), its batch size, its judging thread."""

    name: str
    intake: Intake
    batch_size: int
    reader: ThreadPoolExecutor
    judge: ThreadPoolExecutor


class StreamApp(faust.App):
    """The Faust app of the stream stage; `lanes` holds each source topic's intake, `stage` the
    groups, normalization and tables they feed."""

    BootStrategy = ShellBoot
    lanes: dict[str, Lane]
    stage: Stage


class Held:
    """Consumed messages whose offsets are not committed yet, per partition, for the byte bound."""

    def __init__(self) -> None:
        self._held: dict[TopicPartition, deque[tuple[int, int]]] = {}
        self._bytes: dict[str, int] = {}

    def held_bytes(self, topic: str) -> int:
        """Bytes of the held messages of `topic` (judged, pending or in flight, not yet safe)."""
        return self._bytes.get(topic, 0)

    def hold(self, messages: Sequence[SourceMessage]) -> None:
        """Count a batch's messages until they are safe."""
        for m in messages:
            c = m.coordinates
            size = len(m.value or b"")
            self._held.setdefault((c.topic, c.partition), deque()).append((c.offset, size))
            self._bytes[c.topic] = self._bytes.get(c.topic, 0) + size

    def release(self, safe: Mapping[TopicPartition, int]) -> None:
        """Forget every held message below its partition's safe offset."""
        for tp, held in self._held.items():
            limit = safe.get(tp)
            while held and limit is not None and held[0][0] < limit:
                self._bytes[tp[0]] -= held.popleft()[1]

    def drop(self, tps: Iterable[TopicPartition]) -> None:
        """Forget the messages of revoked partitions (their new owner reads them again)."""
        for tp in tps:
            for _, size in self._held.pop(tp, ()):
                self._bytes[tp[0]] -= size


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
    task_window: int = DEFAULT_TASK_WINDOW,
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
    verifier_processes: int = 1,
    write_retries: int = 5,
    log_every_s: float = 10.0,
    data_dir: Path | str | None = None,
) -> StreamApp:
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
        task_window: completed task ids remembered per source partition: another complete
            attempt of one of them is a dead letter `duplicate_attempt` (attempts.py).
        commit_bytes, commit_interval_s: a commit is made once the decided rows hold this many
            message bytes, or once the oldest waited this long; when the lanes are caught up
            (less than a batch waits behind their last batches), once the oldest waited 0.25 s.
        raw_buffer_bytes: bound of the raw messages held (judged, in pending groups or in flight,
            not yet committed): above it fetching rollouts.raw pauses, and resumes at half. The
            intake adds one batch read ahead and librdkafka's prefetch queue (64 MiB per lane).
        session_timeout_s: Kafka consumer session timeout: a SIGKILLed worker's partitions stay
            assigned to it for this long before the group's other workers (or its restart) get
            them. librdkafka heartbeats from its own thread, whatever the worker is doing.
        instance_id: Kafka static membership (``group.instance.id``), unique per worker of the
            group (each lane's consumer appends its lane name): a worker restarted with the same
            id gets its partitions back without a rebalance, provided it returns within the
            session timeout.
        storage_options: deltalake storage options for object stores.
        producer_config: extra librdkafka settings for the dead-letter producer.
        kafka_client: librdkafka settings for every Kafka client of the worker (security: SASL,
            TLS): the lanes' consumers, the dead-letter producer, the admin checks.
        verifiers: domain -> verifier; default `DomainVerifiers()` over the shipped domain registry,
            whose sandbox is checked here, before consuming (SandboxUnavailableError otherwise).
        sandbox_pool_size: judgements (sandboxed executions) run at once per batch.
        verifier_processes: spawned processes judging the CPU-heavy verifiers (math, extraction);
            0 judges them in the lane's thread (also with task-type verifier overrides).
        write_retries: retries of a failing Delta or dead-letter write before the worker stops.
        log_every_s: interval of the progress log line.
        data_dir: Faust's data directory (default ``./<group id>-data`` in the working directory).
    """
    if verifier_processes < 0:
        raise ValueError(f"verifier_processes must be >= 0, got {verifier_processes}")
    if batch_size < 1 or ultra_batch_size < 1 or batch_within_s <= 0:
        raise ValueError(
            "batch_size and ultra_batch_size must be >= 1 and batch_within_s > 0, got "
            f"{batch_size}, {ultra_batch_size}, {batch_within_s}"
        )
    topics = [raw_topic] if ultra_topic is None else [raw_topic, ultra_topic]
    client = dict(kafka_client or {})
    partitions = raw_partitions or topic_partitions(bootstrap_servers, topics, kafka_client=client)[raw_topic]
    options: dict[str, Any] = {} if data_dir is None else {"datadir": str(data_dir)}
    group = group_id or app_id
    app = StreamApp(
        group,
        broker=faust_broker_url(bootstrap_servers),
        store="memory://",
        web_enabled=False,
        topic_partitions=partitions,
        **options,
    )
    profile = profile if profile is not None else load_profile()
    processor = BatchProcessor(verifiers=verifiers, profile=profile, pool_size=sandbox_pool_size)
    if verifier_processes > 0 and not processor.verifiers.overrides:
        processor.verifier_pool = VerifierPool(processor.verifiers, verifier_processes)
    stage = Stage(
        processor,
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
        task_window=task_window,
        commit_bytes=commit_bytes,
        commit_interval_s=commit_interval_s,
        write_retries=write_retries,
        background_commits=True,
    )
    if isinstance(stage.processor.verifiers, DomainVerifiers) and stage.processor.verifiers.needs_sandbox:
        stage.processor.verifiers.sandbox  # noqa: B018 (checked at start-up: fail loudly, never unsandboxed)
    sink_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rollstream-sink")
    progress = Progress()
    held = Held()
    preflight: asyncio.Future[None] | None = None
    main_loop: asyncio.AbstractEventLoop | None = None
    running = 0

    def stored_next(tp: TopicPartition) -> int | None:
        part = stage.state.partitions.get(tp)
        return None if part is None else part.next

    def revoke(tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        """In the sink thread: commit the decided rows, forget the partitions, return their safe offsets."""
        stage.flush()
        safe = stage.safe_offsets()
        stage.revoke(tps)
        return {tp: safe[tp] for tp in tps if tp in safe}

    def on_revoke(tps: list[TopicPartition]) -> Mapping[TopicPartition, int]:
        """In an intake thread, inside a rebalance: settle the revoked partitions before they go."""
        if preflight is None or not preflight.done() or main_loop is None:
            return {}
        safe = sink_thread.submit(revoke, tps).result()
        main_loop.call_soon_threadsafe(held.drop, tps)
        return safe

    def on_assign(tps: list[TopicPartition]) -> None:
        """In an intake thread, after a rebalance: the stage accepts these partitions' batches again."""
        sink_thread.submit(stage.assign, tps).result()

    common: dict[str, Any] = {
        **client,
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
    }
    fetch = {
        "raw": {"max.partition.fetch.bytes": 8 * 2**20, "fetch.max.bytes": 64 * 2**20},
        "ultra": {
            "max.partition.fetch.bytes": ULTRA_MAX_MESSAGE_BYTES,
            "fetch.max.bytes": ULTRA_MAX_MESSAGE_BYTES,
            "queued.max.messages.kbytes": ULTRA_MAX_MESSAGE_BYTES // 1024,
        },
    }
    sizes = {"raw": batch_size, "ultra": ultra_batch_size}
    app.stage = stage
    app.lanes = {}
    for name, topic in zip(("raw", "ultra"), topics, strict=False):
        config = {**common, **fetch[name], "client.id": f"{app_id}-{name}"}
        if instance_id is not None:
            config["group.instance.id"] = f"{instance_id}-{name}"
        app.lanes[name] = Lane(
            name,
            Intake(topic, config, stored_next=stored_next, on_revoke=on_revoke, on_assign=on_assign),
            sizes[name],
            ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"rollstream-{name}-intake"),
            ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"rollstream-{name}"),
        )

    def start() -> None:
        """Check the stored offsets against the brokers and load the state, retrying while brokers
        do not answer (a node restarting, a leader election) for up to PREFLIGHT_RETRY_S."""
        for attempt in tenacity.Retrying(
            stop=tenacity.stop_after_delay(PREFLIGHT_RETRY_S),
            wait=tenacity.wait_exponential(multiplier=0.5, max=10),
            retry=tenacity.retry_if_exception_type(BrokerUnavailableError),
            before_sleep=lambda state: log.warning(
                "start-up check: %s; retrying", state.outcome.exception() if state.outcome else "?"
            ),
            reraise=True,
        ):
            with attempt:
                load_checked()

    def load_checked() -> None:
        counts = topic_partitions(bootstrap_servers, topics, kafka_client=client)
        stores: list[tuple[str, OffsetStore]] = [
            (TRAJECTORIES_TABLE, stage.sink),
            (DEAD_LETTERS_TABLE, stage.dead_letters),
        ]
        if stage.executions is not None:
            stores.append((EXECUTIONS_TABLE, stage.executions))
        check_stored_offsets(bootstrap_servers, topics, stores, kafka_client=client)
        owned = [(t, p) for t, n in counts.items() for p in range(n)]
        stage.load(owned, topic_ids(bootstrap_servers, topics, kafka_client=client))

    async def checked() -> None:
        """Load and check the stored state once, for whichever lane asks first."""
        nonlocal preflight, main_loop
        if preflight is None:
            main_loop = asyncio.get_running_loop()
            preflight = main_loop.run_in_executor(sink_thread, start)
        await asyncio.shield(preflight)

    def bound_raw_buffer() -> None:
        """Pause fetching rollouts.raw while its held messages exceed raw_buffer_bytes; resume at half."""
        lane = app.lanes["raw"]
        amount = held.held_bytes(raw_topic)
        if amount > raw_buffer_bytes and not lane.intake.paused:
            lane.intake.pause(True)
            log.info("%s: %d bytes held (bound %d); fetching paused", raw_topic, amount, raw_buffer_bytes)
        elif lane.intake.paused and amount <= raw_buffer_bytes // 2:
            lane.intake.pause(False)
            log.info("%s: %d bytes held; fetching resumed", raw_topic, amount)

    crashing: set[asyncio.Future[None]] = set()

    def crash_on_failure(future: asyncio.Future[Any]) -> None:
        """Stop the worker as soon as an accept fails, even if no batch follows to observe it."""
        if not future.cancelled() and future.exception() is not None:
            log.error(
                "a batch could not be written; stopping without committing", exc_info=future.exception()
            )
            crashing.add(asyncio.ensure_future(app.crash(cast(BaseException, future.exception()))))

    def with_safe(
        work: Callable[[], BatchStats | int],
    ) -> Callable[[], tuple[BatchStats | int, dict[TopicPartition, int]]]:
        """`work` followed by the safe offsets it leaves, as one call in the sink thread."""
        return lambda: (work(), stage.safe_offsets())

    async def settle(future: asyncio.Future[tuple[BatchStats | int, dict[TopicPartition, int]]]) -> bool:
        """Wait for a sink step even if cancelled meanwhile, commit what became safe; True if cancelled."""
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
        held.release(safe)
        for lane in app.lanes.values():
            lane.intake.commit(safe)
        bound_raw_buffer()
        if isinstance(result, BatchStats):
            progress.add(result)
        else:
            progress.rows_written += result  # a commit by tick or flush
        return cancelled

    async def step(work: Callable[[], BatchStats | int]) -> bool:
        """Run one stage step in the sink thread, then commit what became safe; True if cancelled."""
        return await settle(asyncio.get_running_loop().run_in_executor(sink_thread, with_safe(work)))

    caught_up = {"raw": True, "ultra": True}
    judging = {"raw": False, "ultra": False}

    def accept(lane: Lane, judged: JudgedBatch, taken: Taken) -> BatchStats:
        """In the sink thread: accept the part of a batch whose partitions were not revoked meanwhile."""
        generations = taken.generations

        def current(c: Coordinates) -> bool:
            return lane.intake.current((c.topic, c.partition), generations.get((c.topic, c.partition), -1))

        if not all(lane.intake.current(tp, g) for tp, g in generations.items()):
            judged = judged.only(current)
        return stage.accept(judged, caught_up=taken.caught_up(lane.batch_size))

    async def run_lane(lane: Lane) -> None:
        """Read batch N+1 and judge batch N in the lane's threads while the sink thread accepts batch N-1."""
        nonlocal running
        loop = asyncio.get_running_loop()
        try:
            await checked()
            await loop.run_in_executor(lane.reader, lane.intake.subscribe)
        except Exception as exc:
            await app.crash(exc)
            return
        running += 1
        size = lane.batch_size
        in_flight: asyncio.Future[tuple[BatchStats | int, dict[TopicPartition, int]]] | None = None
        reading = loop.run_in_executor(lane.reader, lane.intake.take, size, batch_within_s)
        try:
            while not app.should_stop:
                taken = await reading
                reading = loop.run_in_executor(lane.reader, lane.intake.take, size, batch_within_s)
                messages = [
                    m
                    for m in taken.messages
                    if lane.intake.current(
                        (m.coordinates.topic, m.coordinates.partition),
                        taken.generations[(m.coordinates.topic, m.coordinates.partition)],
                    )
                ]
                if not messages and len(taken.messages) < size:
                    caught_up[lane.name] = True
                    if in_flight is not None and in_flight.done():
                        future, in_flight = in_flight, None
                        await settle(future)
                    continue
                held.hold(messages)
                try:
                    judging[lane.name] = True
                    try:
                        judged, cancelled = await run_to_completion(
                            loop, lane.judge, functools.partial(stage.judge, messages)
                        )
                    finally:
                        judging[lane.name] = False
                    if in_flight is not None:
                        cancelled = await settle(in_flight) or cancelled
                    caught_up[lane.name] = taken.caught_up(size)
                    in_flight = loop.run_in_executor(
                        sink_thread, with_safe(functools.partial(accept, lane, judged, taken))
                    )
                    in_flight.add_done_callback(crash_on_failure)
                except Exception as exc:
                    log.exception(
                        "a batch of %d messages could not be written; stopping without committing",
                        len(messages),
                    )
                    await app.crash(exc)
                    return
                if cancelled:
                    raise asyncio.CancelledError
        except Exception as exc:
            log.exception("%s lane failed; stopping without committing", lane.name)
            await app.crash(exc)
        finally:
            running -= 1
            try:
                if in_flight is not None:
                    await settle(in_flight)
                if app.should_stop:
                    await step(stage.flush)
                    log.info("stopping: the decided rows were committed first")
            except Exception:
                log.exception("committing the decided rows at stop failed; the replay redoes them")
            await asyncio.shield(loop.run_in_executor(lane.reader, lane.intake.close))
            if running == 0:
                stage.dead_letters.close()
                if processor.verifier_pool is not None:
                    processor.verifier_pool.close()
                log.info("sink stopped: %s; %d groups pending", progress.summary(), stage.pending_groups)

    def lane_task(lane: Lane) -> Callable[[], Any]:
        async def run() -> None:
            await run_lane(lane)

        run.__name__ = run.__qualname__ = f"lane_{lane.name}"
        return run

    for lane in app.lanes.values():
        app.task(lane_task(lane))

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

    @app.timer(interval=log_every_s)
    async def report_progress() -> None:
        log.info("progress: %s; %d groups pending", progress.summary(), stage.pending_groups)

    return app
