"""The sections of `Settings`: kafka, stream, sandbox, replay, learner, rollout.

Each field declares its description once, and its default once: a default the stage's library
options share comes from `schemas.defaults`, which both read. `infra/settings_doc.py` writes the
reference from the fields and `infra/cli/common.py` makes the command line's flags from them. A
field's ``flag`` (in ``json_schema_extra``) overrides the flag name, and ``flag=False`` keeps it
off the command line.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    field_validator,
    model_validator,
)

from schemas.defaults import (
    DEFAULT_SEED,
    LearnerDefaults,
    ReplayDefaults,
    RolloutDefaults,
    StreamDefaults,
    TopicDefaults,
)

MANAGED_KAFKA_KEYS = frozenset(
    {"bootstrap.servers", "group.id", "enable.auto.commit", "enable.auto.offset.store", "isolation.level"}
)
"""librdkafka properties rollstream sets itself; ``kafka.client`` may not override them."""

_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")


def _as_servers(value: Any) -> Any:
    """A comma-separated string or a list of ``host:port``, as one normalized comma-separated string."""
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list | tuple) or not all(isinstance(item, str) for item in items):
        raise ValueError("is not a list of 'host:port'; give e.g. 'k1:9092,k2:9092' or a TOML list")
    servers = [item.strip() for item in items if item.strip()]
    for server in servers:
        host, _, port = server.rpartition(":")
        if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
            raise ValueError(f"has {server!r}, not 'host:port'; give e.g. 127.0.0.1:9092")
    return ",".join(servers)


def _as_topic(value: str) -> str:
    if not _TOPIC.match(value) or value in {".", ".."}:
        raise ValueError("is not a valid Kafka topic name; use letters, digits, '.', '_', '-'")
    return value


def single_server(value: Any) -> tuple[str, int] | None:
    """(host, port) when `value` names exactly one valid bootstrap address, else None."""
    try:
        servers = _as_servers(value).split(",") if value else []
    except ValueError:
        return None  # validation reports it, naming its source
    if len(servers) != 1:
        return None
    host, _, port = servers[0].rpartition(":")
    return host, int(port)


def _as_options(value: Any) -> Any:
    """A table of string options; TOML booleans and numbers become the strings the libraries expect."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise ValueError('is not a JSON object; give e.g. \'{"key": "value"}\'') from None
    if not isinstance(value, Mapping):
        raise ValueError("is not a table; give a TOML table or a JSON object of strings")
    out: dict[str, str] = {}
    for key, item in value.items():
        if isinstance(item, bool):
            out[str(key)] = "true" if item else "false"
        elif isinstance(item, str | int | float):
            out[str(key)] = str(item)
        else:
            raise ValueError(f"has {key} = {item!r}; give each option a string, number or boolean")
    return out


Port = Annotated[int, Field(ge=1, le=65535)]
Topic = Annotated[str, AfterValidator(_as_topic)]
Servers = Annotated[str, BeforeValidator(_as_servers)]
Options = Annotated[
    Mapping[str, str],
    BeforeValidator(_as_options),
    AfterValidator(MappingProxyType),
    PlainSerializer(dict, return_type=dict),
]


def no_flag() -> dict[str, Any]:
    return {"flag": False}


class Section(BaseModel):
    """A frozen group of settings; unknown keys are errors."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class KafkaSettings(Section):
    """The brokers, the clients' options and the pipeline's topics."""

    host: str = Field(
        default="127.0.0.1",
        min_length=1,
        description="Address the local broker listens on and clients connect to.",
    )
    port: Port = Field(default=9092, description="The local broker's client (PLAINTEXT) port.")
    controller_port: Port = Field(default=9093, description="The KRaft controller port of the combined node.")
    version: str = Field(
        default="4.3.1",
        pattern=r"^[0-9]+\.[0-9]+\.[0-9]+$",
        description="Kafka release whose jars run the broker.",
    )
    heap: str = Field(
        default="1g", pattern=r"^[1-9][0-9]*[kKmMgG]?$", description="The broker JVM's `-Xmx`, e.g. `512m`."
    )
    brokers: int = Field(
        default=1,
        ge=1,
        le=9,
        description="Kafka nodes `rollstream up` starts on this machine (KRaft, each a broker and a controller); "
        "node i listens on `port + 2i` and `controller_port + 2i`. With 3 or more, topics get replication "
        "factor 3 and min.insync.replicas 2.",
    )
    bootstrap_servers: Servers = Field(
        default="",
        validate_default=True,
        description="The brokers clients connect to, `host:port` comma-separated (or a TOML list). One address "
        "is shorthand for `host` and `port`; several name an external cluster and are used as given. "
        "Default: the local nodes.",
    )
    client: Options = Field(
        default_factory=lambda: MappingProxyType({}),
        description="librdkafka properties added to every Kafka producer, consumer and admin client, e.g. "
        '`{"security.protocol" = "SASL_SSL", "sasl.mechanism" = "SCRAM-SHA-512"}`. Not allowed: '
        + ", ".join(sorted(MANAGED_KAFKA_KEYS))
        + " (rollstream sets those). In the environment: a JSON object.",
        json_schema_extra=no_flag(),
    )
    raw_topic: Topic = Field(
        default=TopicDefaults.raw, description="Topic of ordinary trajectories, keyed by group_id."
    )
    ultra_topic: Topic = Field(default=TopicDefaults.ultra, description="Topic of ultra-long trajectories.")
    dlq_topic: Topic = Field(default=TopicDefaults.dlq, description="Dead-letter topic.")

    @field_validator("bootstrap_servers")
    @classmethod
    def _servers(cls, value: str, info: Any) -> str:
        if value:
            return value
        host, port, count = (info.data.get(k) for k in ("host", "port", "brokers"))
        if not isinstance(host, str) or not isinstance(port, int) or not isinstance(count, int):
            return ""  # a field it follows is invalid and reported on its own
        return ",".join(f"{host}:{port + 2 * i}" for i in range(count))

    @field_validator("client")
    @classmethod
    def _client(cls, value: Mapping[str, str]) -> Mapping[str, str]:
        managed = sorted(MANAGED_KAFKA_KEYS & set(value))
        if managed:
            raise ValueError(f"sets {', '.join(managed)}, which rollstream manages; remove them")
        return value

    @model_validator(mode="after")
    def _ports_differ(self) -> KafkaSettings:
        ports = {"port": self.port, "controller_port": self.controller_port}
        for i, (client, controller) in enumerate(self.node_ports()[1:], start=1):
            ports[f"node {i} client port"] = client
            ports[f"node {i} controller port"] = controller
        for name, value in ports.items():
            if value > 65535:
                raise ValueError(
                    f"{name} = {value} is out of range; pick ports so every node's fit in 1..65535"
                )
        if len(set(ports.values())) != len(ports):
            raise ValueError(
                f"ports must differ, got {ports}; give each its own port (node i of a cluster uses "
                "port + 2i and controller_port + 2i)"
            )
        return self

    def node_ports(self) -> list[tuple[int, int]]:
        """(client port, controller port) of each local Kafka node."""
        return [(self.port + 2 * i, self.controller_port + 2 * i) for i in range(self.brokers)]

    def derived_servers(self) -> str:
        """The bootstrap list the local nodes give: what `bootstrap_servers` is when not set."""
        return ",".join(f"{self.host}:{client}" for client, _ in self.node_ports())


class StreamSettings(Section):
    """The stream stage (`rollstream process`): consuming, judging, grouping, committing."""

    app_id: str = Field(
        default=StreamDefaults.app_id,
        min_length=1,
        description="Names the offsets and state stored in Delta (the exactly-once identity); keep it stable.",
    )
    group_id: str | None = Field(default=None, description="The Kafka consumer group. Default: the app id.")
    ultra: bool = Field(
        default=True,
        description="Consume the ultra-long topic too.",
        json_schema_extra={"flag": "--ultra/--no-ultra"},
    )
    batch_size: int = Field(
        default=StreamDefaults.batch_size, ge=1, description="Most messages per batch from the raw topic."
    )
    batch_within: float = Field(
        default=StreamDefaults.batch_within_s,
        gt=0,
        description="Seconds a partial batch waits before it is judged.",
    )
    write_retries: int = Field(
        default=StreamDefaults.write_retries,
        ge=1,
        description="Retries of a failing Delta or dead-letter write before the worker stops.",
    )
    advantage: Literal["grpo", "dr_grpo"] = Field(
        default=StreamDefaults.advantage,
        description="Group advantage: GRPO `(r - mean) / std` or Dr. GRPO `r - mean`.",
    )
    per_component: bool = Field(
        default=StreamDefaults.per_component,
        description="Normalize each named reward component, then sum.",
        json_schema_extra={"flag": "--per-component/--no-per-component"},
    )
    band_pass: tuple[float, float] | None = Field(
        default=None,
        description="Flag groups whose success rate lies outside [LO, HI]. Default: none flagged.",
        json_schema_extra={"metavar": "LO HI"},
    )
    overlong: tuple[int, int] | None = Field(
        default=None,
        description="DAPO overlong penalty: (max tokens, cache tokens). Default: none.",
        json_schema_extra={"metavar": "MAX CACHE"},
    )
    group_timeout: float = Field(
        default=StreamDefaults.group_event_timeout_s, gt=0, description="Event-time group timeout, seconds."
    )
    group_wall_timeout: float = Field(
        default=StreamDefaults.group_wall_timeout_s, gt=0, description="Wall-clock group timeout, seconds."
    )
    domain_decay: float = Field(
        default=StreamDefaults.domain_decay,
        gt=0,
        le=1,
        description="Weight a domain's statistics keep per reward, (0, 1].",
    )
    domain_warmup: int = Field(
        default=StreamDefaults.domain_warmup,
        ge=0,
        description="Rewards a domain collects before it standardizes.",
    )
    commit_mb: int = Field(
        default=StreamDefaults.commit_mib,
        ge=1,
        description="Commit once the decided rows hold this many MiB.",
    )
    commit_interval: float = Field(
        default=StreamDefaults.commit_interval_s, gt=0, description="Commit at least this often, seconds."
    )
    idle_commit: float = Field(
        default=StreamDefaults.idle_commit_s,
        gt=0,
        description="While the worker is caught up, commit once the oldest decided row waited this long, "
        "seconds: lower is less latency and more commits per second.",
    )
    compact_files: int = Field(
        default=StreamDefaults.compact_files,
        ge=0,
        description="Compact a partition of the worker's tables once it holds this many small files "
        "(0: never; `rollstream maintain` then has to).",
    )
    compact_target_mb: int = Field(
        default=StreamDefaults.compact_target_mib,
        ge=1,
        description="Files below this many MiB count as small; compaction writes files of about this size.",
    )
    compact_every: float = Field(
        default=StreamDefaults.compact_every_s,
        gt=0,
        description="How often to look for small files, seconds.",
    )
    session_timeout: float = Field(
        default=StreamDefaults.session_timeout_s,
        gt=0,
        description="Kafka session timeout: how long a killed worker holds its partitions, seconds.",
    )
    task_window: int = Field(
        default=StreamDefaults.task_window,
        ge=1,
        description="Completed task ids remembered per source partition, within which a later complete "
        "attempt of the same task is a `duplicate_attempt` dead letter.",
    )
    verifier_processes: int = Field(
        default=StreamDefaults.verifier_processes,
        ge=0,
        description="Spawned processes per worker judging the CPU-heavy verifiers (math, extraction) off the "
        "event loop and the worker's GIL; 0 judges them in the worker.",
    )
    unknown_domains: Literal["dead-letter", "task-type"] = Field(
        default=StreamDefaults.unknown_domains,
        description="`dead-letter`, or `task-type`: judge a domain missing from the registry with its task "
        "type's defaults.",
        json_schema_extra=no_flag(),
    )
    metrics_port: int | None = Field(
        default=None,
        ge=1,
        le=65535,
        description="Port of the worker's `/metrics` and `/health`; with `--workers N`, worker i listens on "
        "`metrics_port + i`. Default: a free port, logged at start.",
    )
    metrics_host: str = Field(
        default=StreamDefaults.metrics_host,
        min_length=1,
        description="Address the metrics server binds; `0.0.0.0` lets a Prometheus on another host scrape.",
    )

    @field_validator("band_pass")
    @classmethod
    def _band(cls, value: tuple[float, float] | None) -> tuple[float, float] | None:
        if value is not None and not 0 <= value[0] <= value[1] <= 1:
            raise ValueError(f"is ({value[0]}, {value[1]}); give LO HI with 0 <= LO <= HI <= 1")
        return value


class SandboxSettings(Section):
    """Sandboxed executions of code-task verifiers."""

    dir: Path | None = Field(
        default=None,
        description="Task directories (`work/`) and the environment store (`environments/`). "
        "Default: `<state_dir>/sandbox`.",
        json_schema_extra=no_flag(),
    )
    pool_size: int = Field(
        default=StreamDefaults.sandbox_pool_size,
        ge=1,
        description="Sandboxed judgements run at once per worker.",
    )

    @field_validator("dir")
    @classmethod
    def _absolute(cls, value: Path | None) -> Path | None:
        return None if value is None else value.expanduser().resolve()


class ReplaySettings(Section):
    """What the learner reads from the trajectories table and how its replay buffer draws."""

    start_version: int = Field(
        default=ReplayDefaults.start_version, ge=0, description="First table version read (time travel)."
    )
    end_version: int | None = Field(
        default=None, ge=0, description="Last table version read. Default: latest at start."
    )
    follow: bool = Field(
        default=ReplayDefaults.follow,
        description="Keep training as the table grows, until SIGTERM / Ctrl-C.",
        json_schema_extra={"flag": "--follow/--no-follow"},
    )
    token_budget: int = Field(
        default=ReplayDefaults.token_budget, ge=1, description="Padded slots (or packed tokens) per batch."
    )
    max_length: int = Field(
        default=ReplayDefaults.max_length, ge=1, description="Prompt + response tokens kept per row."
    )
    layout: Literal["padded", "packed"] = Field(default=ReplayDefaults.layout, description="Batch layout.")
    profile_matched: bool = Field(
        default=ReplayDefaults.profile_matched,
        description="Draw buckets in the workload profile's shares.",
        json_schema_extra={"flag": "--profile-match/--no-profile-match"},
    )
    max_uses: int | None = Field(
        default=None, ge=1, description="Each row at most this many times, oldest first."
    )
    max_lag: int | None = Field(
        default=None, ge=0, description="Hard limit on learner version - policy_version."
    )
    half_life: float | None = Field(
        default=None, gt=0, description="Freshness weight halves per this much lag."
    )
    priority_alpha: float | None = Field(
        default=None, ge=0, description="Prioritized by |advantage| ** alpha."
    )
    samples_per_insert: float | None = Field(
        default=None, gt=0, description="Rate limit: rows sampled per row inserted. Default: no limit."
    )
    min_size: int = Field(
        default=ReplayDefaults.min_size, ge=1, description="Rows inserted before the first sample."
    )
    capacity_rows: int | None = Field(
        default=None, ge=1, description="Most rows held. Default: no row bound."
    )
    capacity_tokens: int = Field(
        default=ReplayDefaults.capacity_tokens,
        ge=1,
        description="Most prompt + response tokens held (about 8 bytes each).",
    )
    eviction: Literal["oldest", "stalest"] = Field(
        default=ReplayDefaults.eviction, description="What goes first once over capacity."
    )


class LearnerSettings(Section):
    """The learner (`rollstream learn`): the policy, the optimizer, checkpoints, publishing."""

    experiment: str = Field(
        default=LearnerDefaults.experiment, min_length=1, description="MLflow experiment name."
    )
    steps: int | None = Field(
        default=None,
        ge=1,
        description=f"Optimizer steps. Default: {LearnerDefaults.steps}, or until stopped with `follow`.",
    )
    policy: str = Field(
        default=LearnerDefaults.policy,
        description='`"tiny"`, `"transformer"` or an import path `"module:factory"`.',
    )
    dim: int = Field(default=LearnerDefaults.dim, ge=1, description="The policy's width.")
    objective: Literal["decoupled_ppo", "tis"] = Field(
        default=LearnerDefaults.objective, description="The policy loss."
    )
    aggregation: Literal["grpo", "dr_grpo"] = Field(
        default=LearnerDefaults.aggregation,
        description="`grpo` (token mean per sequence) or `dr_grpo` (sum over max_length).",
    )
    lr: float = Field(default=LearnerDefaults.lr, gt=0, description="AdamW learning rate.")
    clip_epsilon: float = Field(
        default=LearnerDefaults.clip_epsilon,
        gt=0,
        lt=1,
        description="PPO clip range of the importance ratio.",
    )
    kl_coef: float = Field(
        default=LearnerDefaults.kl_coef, ge=0, description="KL penalty to the initial policy (0: none)."
    )
    seed: int = Field(default=DEFAULT_SEED, description="Seeds torch (weights) and the draws.")
    device: str = Field(default=LearnerDefaults.device, description="`cpu` or `cuda`.")
    checkpoint: Path | None = Field(
        default=None, description="One file for weights, optimizer and buffer position; resumed if present."
    )
    checkpoint_every: int = Field(
        default=LearnerDefaults.checkpoint_every,
        ge=1,
        description="Steps between checkpoints (and one at the end).",
    )
    rows_log: Path | None = Field(default=None, description="A JSON-lines file naming each step's rows.")
    publish_every: int | None = Field(
        default=None,
        ge=1,
        description="Publish the weights by version every N steps (lake/weights, the policies table); the "
        "learner's version is then the published number.",
    )
    register_model: str | None = Field(
        default=None, description="Also register each version as this MLflow model."
    )
    announce: bool = Field(
        default=False,
        description="Announce each version on the compacted rollouts.policies topic.",
        json_schema_extra={"flag": "--announce/--no-announce"},
    )


class RolloutSettings(Section):
    """Rollout workers (`rollstream rollout`) and the task queue they take their work from."""

    concurrency: int = Field(
        default=RolloutDefaults.concurrency, ge=1, description="Tasks a worker generates at once."
    )
    dialect: Literal["openai", "generate", "sglang"] = Field(
        default="openai", description="The inference server's API."
    )
    max_lag: int | None = Field(
        default=None,
        ge=0,
        description="Start a task only while newest - served version < K (needs the worker's --lake).",
    )
    on_weight_change: Literal["finish", "abort"] = Field(
        default=RolloutDefaults.on_weight_change,
        description="A group whose weights changed mid-generation: publish it, or requeue its task.",
    )
    tasks_topic: Topic = Field(
        default="rollouts.tasks",
        description="Prefix of the task topics, one per priority class: `<tasks_topic>.high` and "
        "`<tasks_topic>.low` (docs/rollout.md, Tasks).",
        json_schema_extra=no_flag(),
    )
    task_dlq_topic: Topic = Field(
        default="rollouts.tasks.dlq",
        description="Task dead letters: a task that failed `task_max_attempts` times or does not decode.",
        json_schema_extra=no_flag(),
    )
    task_outcomes_topic: Topic = Field(
        default="rollouts.tasks.outcomes",
        description="The task outcome log (started, done, released, requeued, dead) `rollstream tasks status` reads.",
        json_schema_extra=no_flag(),
    )
    task_group: str = Field(
        default="rollouts.tasks",
        min_length=1,
        description="The share group rollout workers take tasks in.",
        json_schema_extra=no_flag(),
    )
    task_lock_ms: int = Field(
        default=900_000,
        ge=1_000,
        le=3_600_000,
        description="The lease on a taken task: the share group's record lock (`share.record.lock.duration.ms`, "
        "set by `rollstream up`); a worker that dies gives its tasks back after it. No task's deadline may "
        "exceed it.",
        json_schema_extra=no_flag(),
    )
    task_deadline_ms: int = Field(
        default=600_000,
        ge=1,
        description="The deadline of a task that names none: milliseconds one attempt may take, counted from "
        "when a worker takes it.",
        json_schema_extra=no_flag(),
    )
    task_max_attempts: int = Field(
        default=RolloutDefaults.task_max_attempts,
        ge=1,
        description="Attempts after which a failing task becomes a task dead letter; below `task_delivery_limit`.",
        json_schema_extra=no_flag(),
    )
    task_delivery_limit: int = Field(
        default=5,
        ge=2,
        le=10,
        description="Deliveries after which the broker archives a record without a word "
        "(`group.share.delivery.count.limit`); kept above `task_max_attempts` so the dead letter is written first.",
        json_schema_extra=no_flag(),
    )
    task_low_every: int = Field(
        default=RolloutDefaults.task_low_every,
        ge=2,
        description="While both priority classes wait, at least one start in this many is a low-priority task.",
        json_schema_extra=no_flag(),
    )

    @model_validator(mode="after")
    def _queue_bounds(self) -> RolloutSettings:
        if self.task_deadline_ms > self.task_lock_ms:
            raise ValueError(
                f"task_deadline_ms = {self.task_deadline_ms} must be at least 1 and at most task_lock_ms = {self.task_lock_ms}: "
                "a lease cannot outlast the lock; lower task_deadline_ms with the lock"
            )
        if self.task_max_attempts >= self.task_delivery_limit:
            raise ValueError(
                f"task_max_attempts = {self.task_max_attempts} must be at least 1 and below task_delivery_limit = "
                f"{self.task_delivery_limit}, or the broker archives a failing task before its dead letter is "
                "written; lower it or raise task_delivery_limit"
            )
        return self


SECTIONS: dict[str, type[Section]] = {
    "kafka": KafkaSettings,
    "stream": StreamSettings,
    "sandbox": SandboxSettings,
    "replay": ReplaySettings,
    "learner": LearnerSettings,
    "rollout": RolloutSettings,
}

FLAT_NAMES: dict[str, tuple[str, str]] = {
    "kafka_host": ("kafka", "host"),
    "kafka_port": ("kafka", "port"),
    "controller_port": ("kafka", "controller_port"),
    "kafka_version": ("kafka", "version"),
    "kafka_heap": ("kafka", "heap"),
    "brokers": ("kafka", "brokers"),
    "bootstrap_servers": ("kafka", "bootstrap_servers"),
    "kafka_client": ("kafka", "client"),
    "raw_topic": ("kafka", "raw_topic"),
    "ultra_topic": ("kafka", "ultra_topic"),
    "dlq_topic": ("kafka", "dlq_topic"),
    "sandbox_dir": ("sandbox", "dir"),
    "sandbox_pool_size": ("sandbox", "pool_size"),
    "verifier_processes": ("stream", "verifier_processes"),
    "unknown_domains": ("stream", "unknown_domains"),
    "task_window": ("stream", "task_window"),
    "tasks_topic": ("rollout", "tasks_topic"),
    "task_dlq_topic": ("rollout", "task_dlq_topic"),
    "task_outcomes_topic": ("rollout", "task_outcomes_topic"),
    "task_group": ("rollout", "task_group"),
    "task_lock_ms": ("rollout", "task_lock_ms"),
    "task_deadline_ms": ("rollout", "task_deadline_ms"),
    "task_max_attempts": ("rollout", "task_max_attempts"),
    "task_delivery_limit": ("rollout", "task_delivery_limit"),
    "task_low_every": ("rollout", "task_low_every"),
}
"""The flat names of settings that live in a section: accepted as arguments, file keys and
``ROLLSTREAM_<NAME>`` variables (the latter two with a warning), and readable as `Settings` attributes."""

SECTION_OF_FLAT = {where: flat for flat, where in FLAT_NAMES.items()}


def flat_name(section: str, field: str) -> str:
    """The attribute and flag name of a section's field: its flat name where it has one, else the field's."""
    return SECTION_OF_FLAT.get((section, field), field)


_IDENT = re.compile(r"\b[a-z_]+\b")


def names_in(text: str) -> set[str]:
    """The lower-case identifiers in an error message, to name the sources of the fields it mentions."""
    return set(_IDENT.findall(text))
