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

import functools
import socket
from typing import Any

import faust
from faust.app.base import BootStrategy

from schemas.metrics import Readiness
from schemas.profile import load_profile
from stream_processors.backpressure import Backpressure, Held
from stream_processors.committer import Committer
from stream_processors.compaction import Compactor
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
from stream_processors.verifier_pool import VerifierPool
from stream_processors.verifiers import DomainVerifiers
from stream_processors.worker_options import WorkerOptions, takes_options

__all__ = [
    "MAX_POLL_INTERVAL_MS",
    "PREFLIGHT_RETRY_S",
    "ULTRA_MAX_MESSAGE_BYTES",
    "StreamApp",
    "WorkerOptions",
    "create_app",
    "faust_broker_url",
]

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


@takes_options(WorkerOptions)
def create_app(options: WorkerOptions) -> StreamApp:
    """Build the stream stage's Faust app from `WorkerOptions` (its fields are this function's
    keyword arguments): the worker's parts, composed, attached to the app."""
    o, client = options, dict(options.kafka_client or {})
    partitions = (
        o.raw_partitions or topic_partitions(o.bootstrap_servers, o.topics, kafka_client=client)[o.raw_topic]
    )
    metrics = WorkerMetrics()
    stage, stores = _stage(o, metrics)
    compactors = _compactors(o, stage)
    sink, held = SinkThread(stage), Held()
    names = LANE_NAMES[: len(o.topics)]
    readiness = Readiness(["preflight", *(f"{name}_assigned" for name in names)])
    preflight = Preflight(
        stage,
        bootstrap_servers=o.bootstrap_servers,
        topics=o.topics,
        stores=stores,
        executor=sink.executor,
        kafka_client=client,
        on_passed=lambda: readiness.mark("preflight"),
    )
    listener = RebalanceListener(
        sink, held, lambda: preflight.passed, on_assigned=lambda name: readiness.mark(f"{name}_assigned")
    )
    lanes = {name: _lane(o, name, topic, listener) for name, topic in zip(names, o.topics, strict=True)}
    backpressure = Backpressure(o.raw_topic, lanes["raw"].intake, o.raw_buffer_bytes, held)
    intakes = [lane.intake for lane in lanes.values()]
    committer = Committer(sink, intakes, held, backpressure, on_rows=metrics.stored_rows)
    worker = StreamWorker(
        lanes=lanes,
        sink=sink,
        committer=committer,
        listener=listener,
        preflight=preflight,
        metrics=metrics,
        readiness=readiness,
        close=functools.partial(_close, stage),
        compactors=compactors,
    )
    app = _faust_app(o, partitions)
    worker.attach(
        app,
        tick_s=min(0.1, o.commit_interval_s / 4),
        log_every_s=o.log_every_s,
        compact_every_s=o.compact_every_s,
    )
    app.worker, app.lanes, app.stage = worker, worker.lanes, stage
    return app


def _stage(o: WorkerOptions, metrics: WorkerMetrics) -> tuple[Stage, list[tuple[str, OffsetStore]]]:
    """The Stage over the three tables, and the tables that record source offsets."""
    client = dict(o.kafka_client or {})
    profile = o.profile if o.profile is not None else load_profile()
    processor = BatchProcessor(verifiers=o.verifiers, profile=profile, pool_size=o.sandbox_pool_size)
    if o.verifier_processes > 0 and not processor.verifiers.overrides:
        processor.verifier_pool = VerifierPool(processor.verifiers, o.verifier_processes)
    uri, storage = functools.partial(table_uri, o.lake_dir), o.storage_options
    rows = DeltaSink(uri(TRAJECTORIES_TABLE), app_id=o.app_id, storage_options=storage, profile_id=profile.id)
    letters = DeadLetters(
        uri(DEAD_LETTERS_TABLE),
        bootstrap_servers=o.bootstrap_servers,
        topic=o.dlq_topic,
        app_id=o.app_id,
        storage_options=storage,
        producer_config={**client, **(o.producer_config or {})},
    )
    letters.on_stored = metrics.stored_letters
    audit = ExecutionLog(uri(EXECUTIONS_TABLE), app_id=o.app_id, storage_options=storage)
    stage = Stage(
        processor,
        rows,
        letters,
        executions=audit,
        normalization=o.normalization,
        groups=GroupBuffer(event_timeout_s=o.group_event_timeout_s, wall_timeout_s=o.group_wall_timeout_s),
        decay=o.domain_decay,
        warmup=o.domain_warmup,
        task_window=o.task_window,
        commit_bytes=o.commit_bytes,
        commit_interval_s=o.commit_interval_s,
        idle_commit_s=o.idle_commit_s,
        write_retries=o.write_retries,
        background_commits=True,
        observer=metrics,
    )
    if isinstance(processor.verifiers, DomainVerifiers) and processor.verifiers.needs_sandbox:
        processor.verifiers.sandbox  # noqa: B018 (checked at start-up: fail loudly, never unsandboxed)
    return stage, [(TRAJECTORIES_TABLE, rows), (DEAD_LETTERS_TABLE, letters), (EXECUTIONS_TABLE, audit)]


def _compactors(o: WorkerOptions, stage: Stage) -> list[Compactor]:
    """A compactor per table the worker appends to (none with `compact_files` 0)."""
    if not o.compact_files:
        return []
    tables = [stage.sink.table, stage.dead_letters.table]
    if stage.executions is not None:
        tables.append(stage.executions.table)
    return [
        Compactor(
            t.uri,
            partition_by=t.partition_by[0] if t.partition_by else None,
            min_files=o.compact_files,
            target_bytes=o.compact_target_bytes,
            writer_properties=t.writer_properties,
            storage_options=o.storage_options,
        )
        for t in tables
    ]


def _lane(o: WorkerOptions, name: str, topic: str, listener: RebalanceListener) -> Lane:
    """Lane `name` over `topic`, its intake hooked to the rebalance listener."""
    config = consumer_config(
        lane=name,
        bootstrap_servers=o.bootstrap_servers,
        group=o.group,
        app_id=o.app_id,
        session_timeout_s=o.session_timeout_s,
        instance_id=o.instance_id,
        kafka_client=dict(o.kafka_client or {}),
    )
    intake = Intake(
        topic,
        config,
        stored_next=listener.stored_next,
        on_revoke=listener.on_revoke,
        on_assign=listener.for_lane(name),
    )
    return Lane(name, intake, o.batch_size if name == "raw" else o.ultra_batch_size, o.batch_within_s)


def _close(stage: Stage) -> None:
    """Close what the lanes share: the dead-letter producer and the verifier pool."""
    stage.dead_letters.close()
    if stage.processor.verifier_pool is not None:
        stage.processor.verifier_pool.close()


def _faust_app(o: WorkerOptions, partitions: int) -> StreamApp:
    """The Faust app: no Kafka of its own, tables in memory, its web server on the metrics address."""
    port = o.metrics_port if o.metrics_port is not None else free_port(o.metrics_host)
    options: dict[str, Any] = {} if o.data_dir is None else {"datadir": str(o.data_dir)}
    return StreamApp(
        o.group,
        broker=faust_broker_url(o.bootstrap_servers),
        store="memory://",
        topic_partitions=partitions,
        web_enabled=True,
        web_bind=o.metrics_host,
        web_host=o.metrics_host,
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
