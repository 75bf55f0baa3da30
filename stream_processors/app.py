"""The Faust app of the stream stage: rollouts.raw and rollouts.ultra -> groups -> Delta.

Faust is the process shell: supervision, signals, logging, timers, and its web server for
``/metrics`` and ``/health``. The intake is ours (intake.py): per source topic a lane
(lanes.py) with one confluent-kafka consumer in the worker's consumer group; one sink thread
runs the Stage (groups, statistics, commits) for both lanes (stream_worker.py composes the parts).

Before either lane consumes, the state stored in Delta is loaded and checked against the broker
(startup.py): offsets ahead of a topic and a topic id that changed are refused. Kafka offsets are
committed by us alone and follow `Stage.safe_offsets()`: never past a message whose row or dead
letter is not stored, so never past a pending group's sample (committer.py, rebalance.py).
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import faust
from faust.app.base import BootStrategy

from schemas.metrics import Readiness
from schemas.profile import WorkloadProfile, load_profile
from stream_processors.advantages import GroupNormalization
from stream_processors.backpressure import Backpressure, Held
from stream_processors.committer import Committer
from stream_processors.dead_letters import DeadLetters
from stream_processors.delta_sink import DeltaSink
from stream_processors.executions import ExecutionLog
from stream_processors.groups import GroupBuffer
from stream_processors.intake import Intake
from stream_processors.lanes import MAX_POLL_INTERVAL_MS, ULTRA_MAX_MESSAGE_BYTES, Lane, consumer_config
from stream_processors.metrics import WorkerMetrics
from stream_processors.offsets import table_uri
from stream_processors.preflight import OffsetStore, topic_partitions
from stream_processors.processing import BatchProcessor
from stream_processors.rebalance import RebalanceListener
from stream_processors.sink_thread import SinkThread
from stream_processors.stage import Stage
from stream_processors.startup import PREFLIGHT_RETRY_S, Preflight
from stream_processors.stream_worker import StreamWorker
from stream_processors.task_window import DEFAULT_TASK_WINDOW
from stream_processors.verifier_pool import VerifierPool
from stream_processors.verifiers import DomainVerifiers, VerifierRegistry

__all__ = [
    "MAX_POLL_INTERVAL_MS",
    "PREFLIGHT_RETRY_S",
    "ULTRA_MAX_MESSAGE_BYTES",
    "StreamApp",
    "create_app",
    "faust_broker_url",
]

log = logging.getLogger(__name__)

TRAJECTORIES_TABLE = "trajectories"
DEAD_LETTERS_TABLE = "dead_letters"
EXECUTIONS_TABLE = "executions"
LANE_NAMES = ("raw", "ultra")


def faust_broker_url(bootstrap_servers: str) -> str:
    """Faust's broker URL list ("kafka://a:9092;kafka://b:9092") from Kafka's "a:9092,b:9092"."""
    return ";".join(f"kafka://{server.strip()}" for server in bootstrap_servers.split(",") if server.strip())


class ShellBoot(BootStrategy):
    """Faust starts no Kafka client of its own: the lanes' consumers and the dead-letter producer
    are confluent-kafka clients (a Faust consumer in the same group would also break the group)."""

    enable_kafka = False


class StreamApp(faust.App):
    """The Faust app of the stream stage; `worker` holds its parts, `lanes` and `stage` two of them."""

    BootStrategy = ShellBoot
    worker: StreamWorker
    lanes: dict[str, Lane]
    stage: Stage


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
    metrics_port: int | None = None,
    metrics_host: str = "127.0.0.1",
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
        metrics_port: the port of Faust's web server, which serves ``/metrics`` (Prometheus) and
            ``/health``; default a free port the system picks, logged at start.
        metrics_host: the address it binds; "0.0.0.0" lets a Prometheus on another host scrape.
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
    group = group_id or app_id
    partitions = raw_partitions or topic_partitions(bootstrap_servers, topics, kafka_client=client)[raw_topic]
    profile = profile if profile is not None else load_profile()
    processor = BatchProcessor(verifiers=verifiers, profile=profile, pool_size=sandbox_pool_size)
    if verifier_processes > 0 and not processor.verifiers.overrides:
        processor.verifier_pool = VerifierPool(processor.verifiers, verifier_processes)
    metrics = WorkerMetrics()
    sink_table = DeltaSink(
        table_uri(lake_dir, TRAJECTORIES_TABLE),
        app_id=app_id,
        storage_options=storage_options,
        profile_id=profile.id,
    )
    letters = DeadLetters(
        table_uri(lake_dir, DEAD_LETTERS_TABLE),
        bootstrap_servers=bootstrap_servers,
        topic=dlq_topic,
        app_id=app_id,
        storage_options=storage_options,
        producer_config={**client, **(producer_config or {})},
    )
    letters.on_stored = metrics.stored_letters
    audit = ExecutionLog(
        table_uri(lake_dir, EXECUTIONS_TABLE), app_id=app_id, storage_options=storage_options
    )
    stores: list[tuple[str, OffsetStore]] = [
        (TRAJECTORIES_TABLE, sink_table),
        (DEAD_LETTERS_TABLE, letters),
        (EXECUTIONS_TABLE, audit),
    ]
    stage = Stage(
        processor,
        sink_table,
        letters,
        executions=audit,
        normalization=normalization,
        groups=GroupBuffer(event_timeout_s=group_event_timeout_s, wall_timeout_s=group_wall_timeout_s),
        decay=domain_decay,
        warmup=domain_warmup,
        task_window=task_window,
        commit_bytes=commit_bytes,
        commit_interval_s=commit_interval_s,
        write_retries=write_retries,
        background_commits=True,
        observer=metrics,
    )
    if isinstance(processor.verifiers, DomainVerifiers) and processor.verifiers.needs_sandbox:
        processor.verifiers.sandbox  # noqa: B018 (checked at start-up: fail loudly, never unsandboxed)
    sink, held = SinkThread(stage), Held()
    names = LANE_NAMES[: len(topics)]
    readiness = Readiness(["preflight", *(f"{name}_assigned" for name in names)])
    preflight = Preflight(
        stage,
        bootstrap_servers=bootstrap_servers,
        topics=topics,
        stores=stores,
        executor=sink.executor,
        kafka_client=client,
        on_passed=lambda: readiness.mark("preflight"),
    )
    listener = RebalanceListener(
        sink, held, lambda: preflight.passed, on_assigned=lambda name: readiness.mark(f"{name}_assigned")
    )
    lanes: dict[str, Lane] = {}
    for name, topic, size in zip(names, topics, (batch_size, ultra_batch_size), strict=False):
        config = consumer_config(
            lane=name,
            bootstrap_servers=bootstrap_servers,
            group=group,
            app_id=app_id,
            session_timeout_s=session_timeout_s,
            instance_id=instance_id,
            kafka_client=client,
        )
        intake = Intake(
            topic,
            config,
            stored_next=listener.stored_next,
            on_revoke=listener.on_revoke,
            on_assign=listener.for_lane(name),
        )
        lanes[name] = Lane(name, intake, size, batch_within_s)
    backpressure = Backpressure(raw_topic, lanes["raw"].intake, raw_buffer_bytes, held)
    committer = Committer(
        sink, [lane.intake for lane in lanes.values()], held, backpressure, on_rows=metrics.stored_rows
    )

    def close() -> None:
        stage.dead_letters.close()
        if processor.verifier_pool is not None:
            processor.verifier_pool.close()

    worker = StreamWorker(
        lanes=lanes,
        sink=sink,
        committer=committer,
        listener=listener,
        preflight=preflight,
        metrics=metrics,
        readiness=readiness,
        close=close,
    )
    app = _faust_app(group, bootstrap_servers, partitions, data_dir, metrics_host, metrics_port)
    worker.attach(app, tick_s=min(0.1, commit_interval_s / 4), log_every_s=log_every_s)
    app.worker, app.lanes, app.stage = worker, worker.lanes, stage
    return app


def _faust_app(
    group: str,
    bootstrap_servers: str,
    partitions: int,
    data_dir: Path | str | None,
    host: str,
    port: int | None,
) -> StreamApp:
    """The Faust app: no Kafka of its own, tables in memory, its web server on (host, port)."""
    port = port if port is not None else free_port(host)
    options: dict[str, Any] = {} if data_dir is None else {"datadir": str(data_dir)}
    log.info("metrics at http://%s:%d/metrics, health at /health", host, port)
    return StreamApp(
        group,
        broker=faust_broker_url(bootstrap_servers),
        store="memory://",
        topic_partitions=partitions,
        web_enabled=True,
        web_bind=host,
        web_host=host,
        web_port=port,
        web_router_enabled=False,
        web_tables_enabled=False,
        web_graph_enabled=False,
        web_stats_enabled=False,
        **options,
    )


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on `host` that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])
