"""The stream worker's options: one field per option, each default declared and documented once."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from schemas.defaults import StreamDefaults, TopicDefaults
from schemas.profile import WorkloadProfile
from stream_processors.advantages import GroupNormalization
from stream_processors.verifiers import DomainVerifiers, VerifierRegistry

P = ParamSpec("P")
R = TypeVar("R")


@dataclass(frozen=True, kw_only=True)
class WorkerOptions:
    """What a stream worker is built from.

    Attributes:
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
            (less than a batch waits behind their last batches), once the oldest waited
            `idle_commit_s`: the latency of a worker with time to spare, paid for in commits per
            second (one each `idle_commit_s` while rows arrive). While a commit is under way, a
            full outbox waits for it (and so do the lanes), so a commit holds about `commit_bytes`.
        compact_files, compact_target_bytes, compact_every_s: every `compact_every_s` the worker
            compacts each partition of its tables that holds `compact_files` files smaller than
            `compact_target_bytes` into files of about that size (compaction.py), so small commits
            do not slow its commits down over hours; `compact_files` 0 never compacts. Of a
            group, the worker holding partition 0 of `raw_topic` compacts.
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

    bootstrap_servers: str
    lake_dir: Path | str
    raw_topic: str = TopicDefaults.raw
    ultra_topic: str | None = TopicDefaults.ultra
    dlq_topic: str = TopicDefaults.dlq
    app_id: str = StreamDefaults.app_id
    group_id: str | None = None
    batch_size: int = StreamDefaults.batch_size
    ultra_batch_size: int = 4
    batch_within_s: float = StreamDefaults.batch_within_s
    raw_partitions: int | None = None
    profile: WorkloadProfile | None = None
    normalization: GroupNormalization | None = None
    group_event_timeout_s: float = StreamDefaults.group_event_timeout_s
    group_wall_timeout_s: float = StreamDefaults.group_wall_timeout_s
    domain_decay: float = StreamDefaults.domain_decay
    domain_warmup: int = StreamDefaults.domain_warmup
    task_window: int = StreamDefaults.task_window
    commit_bytes: int = StreamDefaults.commit_mib * 2**20
    commit_interval_s: float = StreamDefaults.commit_interval_s
    idle_commit_s: float = StreamDefaults.idle_commit_s
    compact_files: int = StreamDefaults.compact_files
    compact_target_bytes: int = StreamDefaults.compact_target_mib * 2**20
    compact_every_s: float = StreamDefaults.compact_every_s
    raw_buffer_bytes: int = 256 * 2**20
    session_timeout_s: float = StreamDefaults.session_timeout_s
    instance_id: str | None = None
    storage_options: Mapping[str, str] | None = None
    producer_config: Mapping[str, Any] | None = None
    kafka_client: Mapping[str, Any] | None = None
    verifiers: DomainVerifiers | VerifierRegistry | None = None
    sandbox_pool_size: int = StreamDefaults.sandbox_pool_size
    verifier_processes: int = StreamDefaults.verifier_processes
    write_retries: int = StreamDefaults.write_retries
    log_every_s: float = 10.0
    data_dir: Path | str | None = None
    metrics_port: int | None = None
    metrics_host: str = StreamDefaults.metrics_host

    def __post_init__(self) -> None:
        if self.compact_files == 1 or self.compact_files < 0 or self.compact_every_s <= 0:
            raise ValueError(
                "compact_files must be 0 (never compact) or >= 2 and compact_every_s > 0, got "
                f"{self.compact_files} and {self.compact_every_s}"
            )
        if self.verifier_processes < 0:
            raise ValueError(f"verifier_processes must be >= 0, got {self.verifier_processes}")
        if self.batch_size < 1 or self.ultra_batch_size < 1 or self.batch_within_s <= 0:
            raise ValueError(
                "batch_size and ultra_batch_size must be >= 1 and batch_within_s > 0, got "
                f"{self.batch_size}, {self.ultra_batch_size}, {self.batch_within_s}"
            )

    @property
    def topics(self) -> list[str]:
        """The source topics: raw, then ultra if consumed."""
        return [self.raw_topic] if self.ultra_topic is None else [self.raw_topic, self.ultra_topic]

    @property
    def group(self) -> str:
        """The Kafka consumer group."""
        return self.group_id or self.app_id


def takes_options(
    options: Callable[P, WorkerOptions],
) -> Callable[[Callable[[WorkerOptions], R]], Callable[P, R]]:
    """Give a function of `WorkerOptions` the options' keyword arguments (typed, defaults once)."""

    def decorate(build: Callable[[WorkerOptions], R]) -> Callable[P, R]:
        @functools.wraps(build)
        def call(*args: P.args, **kwargs: P.kwargs) -> R:
            return build(options(*args, **kwargs))

        call.__signature__ = inspect.signature(options)  # type: ignore[attr-defined]
        return call

    return decorate
