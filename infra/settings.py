"""One frozen settings object for every rollstream job, folded from a file, the environment and overrides.

Precedence, lowest to highest: field defaults, the TOML file (``./rollstream.toml`` when present, or
the file passed in), environment variables ``ROLLSTREAM_<FIELD>``, explicit overrides (the CLI's
flags). ``lake_dir`` and ``tracking_uri`` follow ``state_dir`` unless set themselves.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, get_type_hints

from infra.exceptions import SettingsError

DEFAULT_CONFIG_FILE = Path("rollstream.toml")
ENV_PREFIX = "ROLLSTREAM_"
BOOTSTRAP_KEY = "bootstrap_servers"

_DERIVED_PATH = Path("<derived from state_dir>")
_HEAP = re.compile(r"^[1-9][0-9]*[kKmMgG]?$")
_VERSION = re.compile(r"^[0-9]+\.[0-9]+\.[0-9]+$")
_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")


def _default_state_dir() -> Path:
    return Path(".rollstream").resolve()


def _default_cache_dir() -> Path:
    """Shares the cache that ``infra/run.sh`` uses (``ROLLSTREAM_CACHE``) when it is set."""
    return Path(os.environ.get("ROLLSTREAM_CACHE") or "~/.cache/rollstream").expanduser().resolve()


@dataclass(frozen=True)
class Settings:
    """Where local services run and what the pipeline's shared names are.

    Attributes:
        state_dir: Root of everything a local stack writes (broker data and logs, pid files, lake,
            tracking store). Default ``./.rollstream``, made absolute.
        kafka_host: Address the local broker listens on and clients connect to. Default ``127.0.0.1``.
        kafka_port: The broker's client (PLAINTEXT) port. Default 9092.
        controller_port: The KRaft controller port of the combined node. Default 9093.
        kafka_version: Kafka release whose jars run the broker. Default ``4.1.1``.
        kafka_heap: The broker JVM's ``-Xmx``, e.g. ``512m`` or ``1g``. Default ``1g``.
        lake_dir: Root of the Delta tables. Default ``<state_dir>/lake``.
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
        profile_path: The inference workload profile file the processor buckets by (fit one with
            ``rollstream profile fit``). Default empty: the shipped profile
            (schemas/profiles/azure_conv_2023.toml).
        vocab_size: The learner's vocabulary; token ids outside [0, vocab_size) fail at read time.
            Default 32768.
    """

    state_dir: Path = field(default_factory=_default_state_dir)
    kafka_host: str = "127.0.0.1"
    kafka_port: int = 9092
    controller_port: int = 9093
    kafka_version: str = "4.1.1"
    kafka_heap: str = "1g"
    lake_dir: Path = _DERIVED_PATH
    tracking_uri: str = ""
    mlflow_port: int = 5000
    raw_topic: str = "rollouts.raw"
    ultra_topic: str = "rollouts.ultra"
    dlq_topic: str = "rollouts.dlq"
    cache_dir: Path = field(default_factory=_default_cache_dir)
    sandbox_dir: Path = _DERIVED_PATH
    sandbox_pool_size: int = 2
    verifier_processes: int = 1
    domain_registry: str = ""
    unknown_domains: str = "dead-letter"
    brokers: int = 1
    profile_path: str = ""
    vocab_size: int = 32_768

    def __post_init__(self) -> None:
        object.__setattr__(self, "state_dir", self.state_dir.expanduser().resolve())
        object.__setattr__(self, "cache_dir", self.cache_dir.expanduser().resolve())
        if self.lake_dir is _DERIVED_PATH:
            object.__setattr__(self, "lake_dir", self.state_dir / "lake")
        else:
            object.__setattr__(self, "lake_dir", self.lake_dir.expanduser().resolve())
        if self.sandbox_dir is _DERIVED_PATH:
            object.__setattr__(self, "sandbox_dir", self.state_dir / "sandbox")
        else:
            object.__setattr__(self, "sandbox_dir", self.sandbox_dir.expanduser().resolve())
        if not self.tracking_uri:
            object.__setattr__(self, "tracking_uri", f"sqlite:///{self.state_dir / 'mlflow.db'}")
        self._validate()

    @property
    def bootstrap_servers(self) -> str:
        """The ``host:port[,host:port...]`` clients pass as ``bootstrap.servers``: every local node."""
        return ",".join(f"{self.kafka_host}:{port}" for port, _ in self.node_ports())

    def node_ports(self) -> list[tuple[int, int]]:
        """(client port, controller port) of each local Kafka node."""
        return [(self.kafka_port + 2 * i, self.controller_port + 2 * i) for i in range(self.brokers)]

    @classmethod
    def load(cls, config_file: Path | None = None, **overrides: Any) -> Settings:
        """Fold defaults, the config file, ``ROLLSTREAM_*`` variables and overrides (None = not given).

        Raises:
            SettingsError: a key is unknown, a value has the wrong type or range, or an explicitly
                named config file does not exist.
        """
        values: dict[str, Any] = {}
        if config_file is not None:
            if not Path(config_file).is_file():
                raise SettingsError(f"config file {config_file} does not exist; create it or drop the option")
            values.update(_from_file(Path(config_file)))
        elif DEFAULT_CONFIG_FILE.is_file():
            values.update(_from_file(DEFAULT_CONFIG_FILE))
        values.update(_from_env(os.environ))
        given = {key: value for key, value in overrides.items() if value is not None}
        values.update(_coerce_layer(given, source="override", base=Path.cwd(), strict=True))
        return cls(**values)

    def _validate(self) -> None:
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
            raise SettingsError(f"kafka_version = {self.kafka_version!r} is not a release; use e.g. '4.1.1'")
        for name in ("raw_topic", "ultra_topic", "dlq_topic"):
            topic = getattr(self, name)
            if not _TOPIC.match(topic) or topic in {".", ".."}:
                raise SettingsError(
                    f"{name} = {topic!r} is not a valid Kafka topic name; use letters, digits, '.', '_', '-'"
                )


_FIELD_TYPES: dict[str, Any] = {f.name: get_type_hints(Settings)[f.name] for f in fields(Settings) if f.init}


def _from_file(path: Path) -> dict[str, Any]:
    """Read a ``[rollstream]`` table, or top-level keys when the file has no such table."""
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise SettingsError(f"cannot read config file {path}: {exc}; fix or remove it") from exc
    table = data.get("rollstream", data)
    if not isinstance(table, dict):
        raise SettingsError(f"{path}: 'rollstream' must be a table ([rollstream]), got {table!r}")
    return _coerce_layer(table, source=str(path), base=path.resolve().parent, strict=True)


def _from_env(environ: Mapping[str, str]) -> dict[str, Any]:
    """Read ``ROLLSTREAM_<FIELD>`` variables; other ``ROLLSTREAM_*`` names belong to scripts and pass."""
    names = [*_FIELD_TYPES, BOOTSTRAP_KEY]
    raw = {
        name: environ[ENV_PREFIX + name.upper()] for name in names if environ.get(ENV_PREFIX + name.upper())
    }
    return _coerce_layer(raw, source="environment", base=Path.cwd(), strict=False)


def _coerce_layer(raw: Mapping[str, Any], *, source: str, base: Path, strict: bool) -> dict[str, Any]:
    """Turn one layer's raw values into typed field values; ``bootstrap_servers`` sets host and port."""
    unknown = sorted(set(raw) - set(_FIELD_TYPES) - {BOOTSTRAP_KEY})
    if unknown and strict:
        known = ", ".join([*_FIELD_TYPES, BOOTSTRAP_KEY])
        raise SettingsError(f"{source}: unknown setting(s) {', '.join(unknown)}; known settings: {known}")
    values: dict[str, Any] = {}
    if BOOTSTRAP_KEY in raw:
        values.update(_split_bootstrap(raw[BOOTSTRAP_KEY], _label(source, BOOTSTRAP_KEY)))
    for name, value in raw.items():
        if name in _FIELD_TYPES:
            values[name] = _coerce(value, _FIELD_TYPES[name], _label(source, name), base)
    return values


def _label(source: str, name: str) -> str:
    if source == "environment":
        return f"environment variable {ENV_PREFIX}{name.upper()}"
    return f"{source}: {name}"


def _coerce(value: Any, kind: Any, label: str, base: Path) -> Any:
    if kind is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().isdigit():
            return int(value)
        raise SettingsError(f"{label} = {value!r} is not an integer; give a whole number such as 9092")
    if kind is Path:
        if not isinstance(value, str | Path) or not str(value):
            raise SettingsError(f"{label} = {value!r} is not a path; give a directory as a string")
        path = Path(value).expanduser()
        return path if path.is_absolute() else (base / path).resolve()
    if not isinstance(value, str):
        raise SettingsError(f"{label} = {value!r} is not a string; quote it")
    return value


def _split_bootstrap(value: Any, label: str) -> dict[str, Any]:
    if not isinstance(value, str) or "," in value or ":" not in value:
        raise SettingsError(
            f"{label} = {value!r}: expected one 'host:port' (rollstream runs against one bootstrap address)"
        )
    host, _, port = value.strip().rpartition(":")
    if not host or not port.isdigit():
        raise SettingsError(f"{label} = {value!r}: expected 'host:port', e.g. 127.0.0.1:9092")
    return {"kafka_host": host, "kafka_port": int(port)}
