"""One frozen settings object for every rollstream job, folded from a file, the environment and overrides.

Precedence, lowest to highest: field defaults, the TOML file (``./rollstream.toml`` when present, or
the file passed in), environment variables ``ROLLSTREAM_<FIELD>``, explicit overrides (the CLI's
flags). ``lake_uri``, ``sandbox_dir`` and ``tracking_uri`` follow ``state_dir`` unless set themselves.
The model is pydantic-settings'; `Settings.load` reads each layer with its sources so an error can
name the file or variable a bad value came from.
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from collections.abc import Mapping
from contextvars import ContextVar
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    PlainSerializer,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, EnvSettingsSource, PydanticBaseSettingsSource, SettingsConfigDict
from pydantic_settings import SettingsError as SourceError

from infra.exceptions import SettingsError

DEFAULT_CONFIG_FILE = Path("rollstream.toml")
ENV_PREFIX = "ROLLSTREAM_"
BOOTSTRAP_KEY = "bootstrap_servers"
ALIASES = {"lake_dir": "lake_uri"}
"""Old names still accepted in every layer: ``lake_dir`` sets ``lake_uri``."""
OBJECT_STORE_SCHEMES = ("s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "azure")
MANAGED_KAFKA_KEYS = frozenset(
    {"bootstrap.servers", "group.id", "enable.auto.commit", "enable.auto.offset.store", "isolation.level"}
)
"""librdkafka properties rollstream sets itself; ``kafka_client`` may not override them."""

_DERIVED_PATH = Path("<derived from state_dir>")
_HEAP = re.compile(r"^[1-9][0-9]*[kKmMgG]?$")
_VERSION = re.compile(r"^[0-9]+\.[0-9]+\.[0-9]+$")
_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
_SECRET = re.compile(r"password|secret|token|key$", re.IGNORECASE)
_TOPIC_FIELDS = (
    "raw_topic",
    "ultra_topic",
    "dlq_topic",
    "tasks_topic",
    "task_dlq_topic",
    "task_outcomes_topic",
)
_SOURCES: ContextVar[dict[str, str] | None] = ContextVar("rollstream_settings_sources", default=None)


def _default_state_dir() -> Path:
    return Path(".rollstream").resolve()


def _default_cache_dir() -> Path:
    """Shares the cache that ``infra/run.sh`` uses (``ROLLSTREAM_CACHE``) when it is set."""
    return Path(os.environ.get("ROLLSTREAM_CACHE") or "~/.cache/rollstream").expanduser().resolve()


def _as_int(value: Any) -> Any:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    raise ValueError("is not an integer; give a whole number such as 9092")


def _as_str(value: Any) -> Any:
    if not isinstance(value, str):
        raise ValueError("is not a string; quote it")
    return value


def _as_path(value: Any) -> Any:
    if value is _DERIVED_PATH:
        return value
    if not isinstance(value, str | Path) or not str(value):
        raise ValueError("is not a path; give a directory as a string")
    return Path(value).expanduser().resolve()


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


Int = Annotated[int, BeforeValidator(_as_int)]
Str = Annotated[str, BeforeValidator(_as_str)]
Dir = Annotated[Path, BeforeValidator(_as_path)]
Servers = Annotated[str, BeforeValidator(_as_servers)]
Options = Annotated[
    Mapping[str, str],
    BeforeValidator(_as_options),
    AfterValidator(MappingProxyType),
    PlainSerializer(dict, return_type=dict),
]


class Settings(BaseSettings):
    """Where local services run and what the pipeline's shared names are.

    Attributes:
        state_dir: Root of everything a local stack writes (broker data and logs, pid files, lake,
            tracking store). Default ``./.rollstream``, made absolute.
        kafka_host: Address the local broker listens on and clients connect to. Default ``127.0.0.1``.
        kafka_port: The broker's client (PLAINTEXT) port. Default 9092.
        controller_port: The KRaft controller port of the combined node. Default 9093.
        kafka_version: Kafka release whose jars run the broker. Default ``4.3.1``.
        kafka_heap: The broker JVM's ``-Xmx``, e.g. ``512m`` or ``1g``. Default ``1g``.
        lake_uri: Root of the Delta tables: a local directory, or an object-store URI (``s3://``,
            ``gs://``, ``az://``, ``abfss://``). ``lake_dir`` is an alias accepted everywhere. Default
            ``<state_dir>/lake``.
        storage_options: Object-store options handed to deltalake and polars with the lake, e.g.
            ``{AWS_ENDPOINT_URL = "http://127.0.0.1:9000", aws_conditional_put = "etag"}``. In the
            environment: a JSON object. Default empty.
        tracking_uri: MLflow tracking store. Default ``sqlite:///<state_dir>/mlflow.db``.
        mlflow_port: Port of the optional MLflow tracking server. Default 5000.
        raw_topic: Topic of ordinary trajectories, keyed by group_id. Default ``rollouts.raw``.
        ultra_topic: Topic of ultra-long trajectories. Default ``rollouts.ultra``.
        dlq_topic: Dead-letter topic. Default ``rollouts.dlq``.
        cache_dir: Per-machine cache; Kafka jars live in ``<cache_dir>/kafka-<version>/libs``.
            Default ``$ROLLSTREAM_CACHE`` or ``~/.cache/rollstream``.
        sandbox_dir: Sandboxed executions' task directories (``work/``) and the environment
            store (``environments/``). Default ``<state_dir>/sandbox``.
        sandbox_pool_size: Sandboxed judgements run at once per worker. Default 2.
        verifier_processes: Spawned processes per worker judging the CPU-heavy verifiers (math,
            extraction) off the event loop and the worker's GIL; 0 judges them in the worker.
            Default 1.
        domain_registry: The domain registry file; empty means the shipped ``schemas/domains.toml``.
        unknown_domains: ``dead-letter`` (default) or ``task-type``: judge a domain missing from
            the registry with its task type's defaults instead.
        brokers: Kafka nodes `rollstream up` starts on this machine (KRaft, each a broker and a
            controller). Node i listens on ``kafka_port + 2i`` and ``controller_port + 2i``.
            With 3 or more, topics get replication factor 3 and min.insync.replicas 2. Default 1.
        bootstrap_servers: The brokers clients connect to, ``host:port`` comma-separated (or a TOML
            list). One address is shorthand for ``kafka_host`` and ``kafka_port``; several name an
            external cluster and are used as given. Default: the local nodes.
        kafka_client: librdkafka properties added to every Kafka producer, consumer and admin client
            rollstream creates, e.g. ``{"security.protocol" = "SASL_SSL", "sasl.mechanism" =
            "SCRAM-SHA-512", "sasl.username" = "...", "sasl.password" = "...", "ssl.ca.location" =
            "ca.pem"}``. Not allowed: bootstrap.servers, group.id, enable.auto.commit,
            enable.auto.offset.store, isolation.level (rollstream sets those). In the environment:
            a JSON object. Default empty.
        profile_path: The inference workload profile file the processor buckets by (fit one with
            ``rollstream profile fit``). Default empty: the shipped profile
            (schemas/profiles/azure_conv_2023.toml).
        vocab_size: The learner's vocabulary; token ids outside [0, vocab_size) fail at read time.
            Default 32768.
        tasks_topic: Prefix of the task topics, one per priority class: ``<tasks_topic>.high``
            and ``<tasks_topic>.low`` (docs/rollout.md, Tasks). Default ``rollouts.tasks``.
        task_dlq_topic: Task dead letters: a task that failed ``task_max_attempts`` times or does
            not decode, with its reason, attempts, last error and bytes. Default ``rollouts.tasks.dlq``.
        task_outcomes_topic: The task outcome log (started, done, released, requeued, dead) that
            ``rollstream tasks status`` reads. Default ``rollouts.tasks.outcomes``.
        task_group: The share group rollout workers take tasks in. Default ``rollouts.tasks``.
        task_lock_ms: The lease on a taken task: the share group's record lock
            (``share.record.lock.duration.ms``, set by ``rollstream up``); a worker that dies gives
            its tasks back after it. No task's deadline may exceed it. 1000 to 3600000. Default
            900000 (15 minutes).
        task_deadline_ms: The deadline of a task that names none: milliseconds one attempt may
            take, counted from when a worker takes it. Default 600000 (10 minutes).
        task_max_attempts: Attempts (N) after which a failing task becomes a task dead letter.
            Below ``task_delivery_limit``. Default 3.
        task_delivery_limit: Deliveries after which the broker archives a record without a word
            (``group.share.delivery.count.limit`` and the group's ``share.delivery.count.limit``);
            kept above ``task_max_attempts`` so the dead letter is written first. 2 to 10. Default 5.
        task_low_every: Y: while both priority classes wait, at least one start in Y is a
            low-priority task (the others are high). At least 2. Default 4.
        task_window: Completed task ids the stream stage remembers per partition, within which a
            later complete group of the same task is a ``duplicate_attempt`` dead letter. Default 100000.
    """

    model_config = SettingsConfigDict(frozen=True, extra="forbid", env_prefix=ENV_PREFIX)

    state_dir: Dir = Field(default_factory=_default_state_dir)
    kafka_host: Str = "127.0.0.1"
    kafka_port: Int = 9092
    controller_port: Int = 9093
    kafka_version: Str = "4.3.1"
    kafka_heap: Str = "1g"
    lake_uri: Str = Field(default="", validate_default=True)
    storage_options: Options = Field(default_factory=lambda: MappingProxyType({}))
    tracking_uri: Str = Field(default="", validate_default=True)
    mlflow_port: Int = 5000
    raw_topic: Str = "rollouts.raw"
    ultra_topic: Str = "rollouts.ultra"
    dlq_topic: Str = "rollouts.dlq"
    cache_dir: Dir = Field(default_factory=_default_cache_dir)
    sandbox_dir: Dir = Field(default=_DERIVED_PATH, validate_default=True)
    sandbox_pool_size: Int = 2
    verifier_processes: Int = 1
    domain_registry: Str = ""
    unknown_domains: Str = "dead-letter"
    brokers: Int = 1
    bootstrap_servers: Servers = Field(default="", validate_default=True)
    kafka_client: Options = Field(default_factory=lambda: MappingProxyType({}))
    profile_path: Str = ""
    vocab_size: Int = 32_768
    tasks_topic: Str = "rollouts.tasks"
    task_dlq_topic: Str = "rollouts.tasks.dlq"
    task_outcomes_topic: Str = "rollouts.tasks.outcomes"
    task_group: Str = "rollouts.tasks"
    task_lock_ms: Int = 900_000
    task_deadline_ms: Int = 600_000
    task_max_attempts: Int = 3
    task_delivery_limit: Int = 5
    task_low_every: Int = 4
    task_window: Int = 100_000

    def __init__(self, **values: Any) -> None:
        """Validate `values` alone (no file, no environment: that is `load`); errors are SettingsError."""
        try:
            super().__init__(**values)
        except ValidationError as exc:
            raise SettingsError(_explain(exc, _SOURCES.get() or {})) from None

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Constructing takes only its arguments; `load` folds the file and environment itself."""
        return (init_settings,)

    @model_validator(mode="before")
    @classmethod
    def _expand_aliases(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        for old, new in ALIASES.items():
            if old in data:
                if new in data:
                    raise SettingsError(f"both {old} and {new} are set; {old} is an alias of {new}, keep one")
                data[new] = data.pop(old)
        expanded = _single_server(data)
        for name, value in expanded.items():
            if name in data and str(data[name]) != str(value):
                raise SettingsError(
                    f"bootstrap_servers = {data[BOOTSTRAP_KEY]!r} and {name} = {data[name]!r} disagree; "
                    "set one of them"
                )
        if expanded:
            data = {**{k: v for k, v in data.items() if k != BOOTSTRAP_KEY}, **expanded}
        return data

    @field_validator("lake_uri")
    @classmethod
    def _lake(cls, value: str, info: ValidationInfo) -> str:
        state_dir = info.data.get("state_dir", _default_state_dir())
        if not value:
            return str(state_dir / "lake")
        scheme, sep, _ = value.partition("://")
        if not sep:
            return str(Path(value).expanduser().resolve())
        if scheme == "file":
            return str(Path(value.removeprefix("file://")).expanduser().resolve())
        if scheme not in OBJECT_STORE_SCHEMES:
            raise ValueError(
                f"has the scheme {scheme!r}; give a local path or one of "
                + ", ".join(f"{s}://" for s in OBJECT_STORE_SCHEMES)
            )
        return value.rstrip("/")

    @field_validator("tracking_uri")
    @classmethod
    def _tracking(cls, value: str, info: ValidationInfo) -> str:
        return value or f"sqlite:///{info.data.get('state_dir', _default_state_dir()) / 'mlflow.db'}"

    @field_validator("sandbox_dir")
    @classmethod
    def _sandbox(cls, value: Path, info: ValidationInfo) -> Path:
        return (
            info.data.get("state_dir", _default_state_dir()) / "sandbox" if value is _DERIVED_PATH else value
        )

    @field_validator("bootstrap_servers")
    @classmethod
    def _servers(cls, value: str, info: ValidationInfo) -> str:
        if value:
            return value
        host, port, count = (info.data.get(k) for k in ("kafka_host", "kafka_port", "brokers"))
        if not isinstance(host, str) or not isinstance(port, int) or not isinstance(count, int):
            return ""  # a field it follows is invalid and reported on its own
        return ",".join(f"{host}:{port + 2 * i}" for i in range(count))

    @field_validator("kafka_client")
    @classmethod
    def _client(cls, value: Mapping[str, str]) -> Mapping[str, str]:
        managed = sorted(MANAGED_KAFKA_KEYS & set(value))
        if managed:
            raise ValueError(f"sets {', '.join(managed)}, which rollstream manages; remove them")
        return value

    @model_validator(mode="after")
    def _validate(self) -> Settings:
        if not 1 <= self.brokers <= 9:
            raise SettingsError(f"brokers = {self.brokers}; run 1 to 9 local Kafka nodes")
        ports = {"kafka_port": self.kafka_port, "controller_port": self.controller_port}
        ports["mlflow_port"] = self.mlflow_port
        for i, (client, controller) in enumerate(self.node_ports()[1:], start=1):
            ports[f"node {i} client port"] = client
            ports[f"node {i} controller port"] = controller
        for name, port in ports.items():
            if not 1 <= port <= 65535:
                raise SettingsError(f"{name} = {port} is out of range; pick a port in 1..65535")
        if len(set(ports.values())) != len(ports):
            raise SettingsError(
                f"ports must differ, got {ports}; give each service its own port (node i of a cluster "
                "uses kafka_port + 2i and controller_port + 2i)"
            )
        if self.sandbox_pool_size < 1:
            raise SettingsError(f"sandbox_pool_size = {self.sandbox_pool_size} must be at least 1")
        if self.verifier_processes < 0:
            raise SettingsError(f"verifier_processes = {self.verifier_processes} must be at least 0")
        if self.unknown_domains not in ("dead-letter", "task-type"):
            raise SettingsError(
                f"unknown_domains = {self.unknown_domains!r}; use 'dead-letter' or 'task-type'"
            )
        if self.vocab_size < 2:
            raise SettingsError(
                f"vocab_size = {self.vocab_size} is too small; give the tokenizer's vocabulary size"
            )
        if not self.kafka_host:
            raise SettingsError("kafka_host is empty; set it to an address such as 127.0.0.1")
        if not _HEAP.match(self.kafka_heap):
            raise SettingsError(
                f"kafka_heap = {self.kafka_heap!r} is not a JVM size; use e.g. '512m' or '1g'"
            )
        if not _VERSION.match(self.kafka_version):
            raise SettingsError(f"kafka_version = {self.kafka_version!r} is not a release; use e.g. '4.3.1'")
        _check_tasks(self)
        for name in _TOPIC_FIELDS:
            topic = getattr(self, name)
            if not _TOPIC.match(topic) or topic in {".", ".."}:
                raise SettingsError(
                    f"{name} = {topic!r} is not a valid Kafka topic name; use letters, digits, '.', '_', '-'"
                )
        return self

    def __repr_args__(self) -> Any:
        for name, value in super().__repr_args__():
            if name == "kafka_client" and isinstance(value, Mapping):
                value = {k: "***" if _SECRET.search(k) else v for k, v in value.items()}
            yield name, value

    @property
    def lake_is_local(self) -> bool:
        """True when the lake is a directory on this machine, not an object store."""
        return "://" not in self.lake_uri

    @property
    def lake_dir(self) -> Path:
        """The lake as a local directory; for code that reads local paths only (see `lake_table_uri`).

        Raises:
            SettingsError: the lake is an object-store URI.
        """
        if not self.lake_is_local:
            raise SettingsError(
                f"lake_uri = {self.lake_uri!r} is an object store and this step reads a local directory "
                "only; point lake_uri at a local path for it"
            )
        return Path(self.lake_uri)

    def lake_table_uri(self, name: str) -> str:
        """The URI (or absolute local path) of the lake's table `name`, as deltalake and polars take it."""
        if self.lake_is_local:
            return str(Path(self.lake_uri) / name)
        return f"{self.lake_uri}/{name}"

    def delta_storage_options(self) -> dict[str, str] | None:
        """``storage_options`` as deltalake and polars take it: a plain dict, or None when empty."""
        return dict(self.storage_options) or None

    def kafka_config(self, ours: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """A librdkafka config: ``bootstrap.servers``, the ``kafka_client`` passthrough, then `ours`."""
        return {"bootstrap.servers": self.bootstrap_servers, **self.kafka_client, **(ours or {})}

    def node_ports(self) -> list[tuple[int, int]]:
        """(client port, controller port) of each local Kafka node."""
        return [(self.kafka_port + 2 * i, self.controller_port + 2 * i) for i in range(self.brokers)]

    def replace(self, **changes: Any) -> Settings:
        """A copy with `changes`; values derived from a changed field (lake, bootstrap list) follow it."""
        kept = {name: getattr(self, name) for name in self.model_fields_set if name not in changes}
        return type(self)(**kept, **changes)

    def as_env(self) -> dict[str, str]:
        """Every setting as ``ROLLSTREAM_<FIELD>`` variables, so a child process loads the same values."""
        env = {}
        for name in type(self).model_fields:
            value = getattr(self, name)
            text = json.dumps(dict(value)) if isinstance(value, Mapping) else str(value)
            env[ENV_PREFIX + name.upper()] = text
        return env

    @classmethod
    def load(cls, config_file: Path | None = None, **overrides: Any) -> Settings:
        """Fold defaults, the config file, ``ROLLSTREAM_*`` variables and overrides (None = not given).

        Mappings (``storage_options``, ``kafka_client``) merge key by key across the layers.

        Raises:
            SettingsError: a key is unknown, a value has the wrong type or range, or an explicitly
                named config file does not exist.
        """
        layers: list[tuple[str, dict[str, Any]]] = []
        if config_file is not None:
            if not Path(config_file).is_file():
                raise SettingsError(f"config file {config_file} does not exist; create it or drop the option")
            layers.append((str(config_file), _from_file(Path(config_file))))
        elif DEFAULT_CONFIG_FILE.is_file():
            layers.append((str(DEFAULT_CONFIG_FILE), _from_file(DEFAULT_CONFIG_FILE)))
        layers.append(("environment", _from_env(cls)))
        given = {key: value for key, value in overrides.items() if value is not None}
        layers.append(("override", _checked(given, "override")))
        values: dict[str, Any] = {}
        sources: dict[str, str] = {}
        for source, layer in layers:
            expanded = _single_server(layer)
            if expanded:  # one address: shorthand for the local broker's host and port, as before
                # Within one layer the address is the more specific: it wins over kafka_host/kafka_port.
                layer = {**{k: v for k, v in layer.items() if k != BOOTSTRAP_KEY}, **expanded}
                values.pop(BOOTSTRAP_KEY, None)
            for name, value in layer.items():
                old = values.get(name)
                if isinstance(old, Mapping) and isinstance(value, Mapping):
                    value = {**old, **value}
                values[name] = value
                sources[name] = source
        token = _SOURCES.set(sources)
        try:
            return cls(**values)
        finally:
            _SOURCES.reset(token)


def _check_tasks(settings: Settings) -> None:
    """The task queue's lease, attempts and priority settings, against Kafka's share-group bounds."""
    if not 1_000 <= settings.task_lock_ms <= 3_600_000:
        raise SettingsError(
            f"task_lock_ms = {settings.task_lock_ms} is outside Kafka's share-group lock bounds; "
            "give 1000 to 3600000 milliseconds"
        )
    if not 1 <= settings.task_deadline_ms <= settings.task_lock_ms:
        raise SettingsError(
            f"task_deadline_ms = {settings.task_deadline_ms} must be at least 1 and at most "
            f"task_lock_ms = {settings.task_lock_ms}: a lease cannot outlast the lock; lower task_deadline_ms "
            "with the lock"
        )
    if not 2 <= settings.task_delivery_limit <= 10:
        raise SettingsError(
            f"task_delivery_limit = {settings.task_delivery_limit}; Kafka accepts 2 to 10 deliveries"
        )
    if not 1 <= settings.task_max_attempts < settings.task_delivery_limit:
        raise SettingsError(
            f"task_max_attempts = {settings.task_max_attempts} must be at least 1 and below "
            f"task_delivery_limit = {settings.task_delivery_limit}, or the broker archives a failing "
            "task before its dead letter is written; lower it or raise task_delivery_limit"
        )
    if settings.task_low_every < 2:
        raise SettingsError(
            f"task_low_every = {settings.task_low_every}; give 2 or more (1 would serve only low priority)"
        )
    if not settings.task_group:
        raise SettingsError("task_group is empty; name the rollout workers' share group, e.g. rollouts.tasks")


def _known() -> list[str]:
    return [*Settings.model_fields, *ALIASES]


def _checked(raw: Mapping[str, Any], source: str) -> dict[str, Any]:
    """`raw` with aliases renamed, after refusing names that are not settings."""
    unknown = sorted(set(raw) - set(_known()))
    if unknown:
        raise SettingsError(
            f"{source}: unknown setting(s) {', '.join(unknown)}; known settings: {', '.join(_known())}"
        )
    out: dict[str, Any] = {}
    for name, value in raw.items():
        new = ALIASES.get(name, name)
        if new != name and new in raw:
            raise SettingsError(
                f"{source}: both {name} and {new} are set; {name} is an alias of {new}, keep one"
            )
        out[new] = value
    return out


def _from_file(path: Path) -> dict[str, Any]:
    """Read a ``[rollstream]`` table, or top-level keys when the file has no such table."""
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise SettingsError(f"cannot read config file {path}: {exc}; fix or remove it") from exc
    table = data.get("rollstream", data)
    if not isinstance(table, dict):
        raise SettingsError(f"{path}: 'rollstream' must be a table ([rollstream]), got {table!r}")
    values = _checked(table, str(path))
    base = path.resolve().parent
    for name in ("state_dir", "cache_dir", "sandbox_dir", "lake_uri"):
        value = values.get(name)
        if (
            isinstance(value, str)
            and value
            and "://" not in value
            and not Path(value).expanduser().is_absolute()
        ):
            values[name] = str(base / value)  # relative to the file, not the working directory
    return values


def _from_env(settings_cls: type[Settings]) -> dict[str, Any]:
    """Read ``ROLLSTREAM_<FIELD>`` variables; other ``ROLLSTREAM_*`` names belong to scripts and pass."""
    source = EnvSettingsSource(
        settings_cls, env_prefix=ENV_PREFIX, case_sensitive=False, env_ignore_empty=True
    )
    try:
        values = {name: value for name, value in source().items() if value is not None}
    except SourceError as exc:
        raise SettingsError(f"environment: {exc}; give mappings as a JSON object") from None
    for old, new in ALIASES.items():
        text = os.environ.get(ENV_PREFIX + old.upper())
        if text and new not in values:
            values[new] = text
    return values


def _single_server(data: Mapping[str, Any]) -> dict[str, Any]:
    """``kafka_host`` and ``kafka_port`` when `data` names one bootstrap address, else nothing."""
    value = data.get(BOOTSTRAP_KEY)
    try:
        servers = _as_servers(value).split(",") if value else []
    except ValueError:
        return {}  # validation reports it, naming its source
    if len(servers) != 1:
        return {}
    host, _, port = servers[0].rpartition(":")
    return {"kafka_host": host, "kafka_port": int(port)}


def _explain(exc: ValidationError, sources: Mapping[str, str]) -> str:
    """One line per bad value: where it came from, the value, and what to give instead."""
    lines = []
    for error in exc.errors():
        name = str(error["loc"][0]) if error["loc"] else "settings"
        source = sources.get(name, "setting")
        label = (
            f"environment variable {ENV_PREFIX}{name.upper()}"
            if source == "environment"
            else f"{source}: {name}"
        )
        if error["type"] == "extra_forbidden":
            known = ", ".join(_known())
            lines.append(f"{source}: unknown setting(s) {name}; known settings: {known}")
            continue
        message = str(error["msg"]).removeprefix("Value error, ")
        lines.append(f"{label} = {error.get('input')!r} {message}")
    return "; ".join(lines)
