"""One frozen settings object for every rollstream job, on pydantic-settings' own sources.

`Settings.load` folds, highest precedence first: overrides (the command line's flags), environment
variables (``ROLLSTREAM_<NAME>`` at the top level, ``ROLLSTREAM_<SECTION>__<NAME>`` in a section),
the TOML file (``./rollstream.toml`` when present, or the file passed in; keys at the top level or
under ``[rollstream]``, sections as tables), then the defaults. ``Settings(**values)`` takes its
arguments alone. A bad value's error names the flag, variable or file it came from.

Some settings of a section also have a flat name (``kafka_port`` for ``kafka.port``, ``raw_topic``,
...; `FLAT_NAMES`): readable as attributes and accepted as arguments; as variables and file keys
they work with a `SettingsWarning` naming the section's form.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from pydantic import Field, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    InitSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)
from pydantic_settings import SettingsError as SourceError

from infra.exceptions import SettingsError, SettingsWarning
from infra.settings_sections import (
    FLAT_NAMES,
    MANAGED_KAFKA_KEYS,
    SECTIONS,
    KafkaSettings,
    LearnerSettings,
    Options,
    Port,
    ReplaySettings,
    RolloutSettings,
    SandboxSettings,
    Section,
    StreamSettings,
    names_in,
    single_server,
)
from schemas.defaults import DEFAULT_VOCAB_SIZE

__all__ = [
    "DEFAULT_CONFIG_FILE",
    "ENV_PREFIX",
    "MANAGED_KAFKA_KEYS",
    "KafkaSettings",
    "LearnerSettings",
    "ReplaySettings",
    "RolloutSettings",
    "SandboxSettings",
    "Settings",
    "StreamSettings",
    "env_name",
]

DEFAULT_CONFIG_FILE = Path("rollstream.toml")
ENV_PREFIX = "ROLLSTREAM_"
NESTED = "__"
ALIASES = {"lake_dir": "lake_uri"}
"""Other names accepted in every layer: ``lake_dir`` sets ``lake_uri``."""
OBJECT_STORE_SCHEMES = ("s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "azure")
_PATHS = (("state_dir",), ("cache_dir",), ("lake_uri",), ("sandbox", "dir"))
"""Paths a config file may give relative to itself."""

Loc = tuple[str, ...]


def env_name(*loc: str) -> str:
    """The environment variable of a setting: ``ROLLSTREAM_STATE_DIR``, ``ROLLSTREAM_STREAM__GROUP_TIMEOUT``."""
    return ENV_PREFIX + NESTED.join(part.upper() for part in loc)


def _default_state_dir() -> Path:
    return Path(".rollstream").resolve()


def _default_cache_dir() -> Path:
    """Shares the cache that ``infra/run.sh`` uses (``ROLLSTREAM_CACHE``) when it is set."""
    return Path(os.environ.get("ROLLSTREAM_CACHE") or "~/.cache/rollstream").expanduser().resolve()


class Settings(BaseSettings):
    """Where local services run, what the pipeline's shared names are, and each stage's settings."""

    model_config = SettingsConfigDict(
        frozen=True,
        extra="forbid",
        env_prefix=ENV_PREFIX,
        env_nested_delimiter=NESTED,
        env_ignore_empty=True,
        case_sensitive=False,
    )

    state_dir: Path = Field(
        default_factory=_default_state_dir,
        description="Root of everything a local stack writes (broker data and logs, pid files, lake, "
        "tracking store). Default `./.rollstream`, made absolute.",
    )
    cache_dir: Path = Field(
        default_factory=_default_cache_dir,
        description="Per-machine cache; Kafka jars live in `<cache_dir>/kafka-<version>/libs`. "
        "Default `$ROLLSTREAM_CACHE` or `~/.cache/rollstream`.",
    )
    lake_uri: str = Field(
        default="",
        validate_default=True,
        description="Root of the Delta tables: a local directory, or an object-store URI (`s3://`, `gs://`, "
        "`az://`, `abfss://`). `lake_dir` is another name for it. Default `<state_dir>/lake`.",
    )
    storage_options: Options = Field(
        default_factory=lambda: MappingProxyType({}),
        description="Object-store options handed to deltalake and polars with the lake, e.g. "
        '`{AWS_ENDPOINT_URL = "http://127.0.0.1:9000", aws_conditional_put = "etag"}`. In the '
        "environment: a JSON object.",
    )
    tracking_uri: str = Field(
        default="",
        validate_default=True,
        description="MLflow tracking store. Default `sqlite:///<state_dir>/mlflow.db`.",
    )
    mlflow_port: Port = Field(default=5000, description="Port of the optional MLflow tracking server.")
    domain_registry: str = Field(
        default="", description="The domain registry file; empty means the shipped `schemas/domains.toml`."
    )
    profile_path: str = Field(
        default="",
        description="The inference workload profile file the processor buckets by and the learner draws by "
        "(fit one with `rollstream profile fit`). Empty: the shipped profile.",
    )
    vocab_size: int = Field(
        default=DEFAULT_VOCAB_SIZE,
        ge=2,
        description="The tokenizer's vocabulary; token ids outside [0, vocab_size) fail at read time.",
    )
    kafka: KafkaSettings = Field(default_factory=KafkaSettings, description=KafkaSettings.__doc__ or "")
    stream: StreamSettings = Field(default_factory=StreamSettings, description=StreamSettings.__doc__ or "")
    sandbox: SandboxSettings = Field(
        default_factory=SandboxSettings, description=SandboxSettings.__doc__ or ""
    )
    replay: ReplaySettings = Field(default_factory=ReplaySettings, description=ReplaySettings.__doc__ or "")
    learner: LearnerSettings = Field(
        default_factory=LearnerSettings, description=LearnerSettings.__doc__ or ""
    )
    rollout: RolloutSettings = Field(
        default_factory=RolloutSettings, description=RolloutSettings.__doc__ or ""
    )

    def __init__(self, **values: Any) -> None:
        """Validate `values` alone (no file, no environment: that is `load`); errors are SettingsError."""
        layers = values.pop("_build_sources", None)
        if layers is None:
            layers = (_Layer(InitSettingsSource(type(self), values), "argument"),)
        try:
            super().__init__(_build_sources=(layers, {}))
        except ValidationError as exc:
            raise SettingsError(_explain(exc, layers)) from None

    @classmethod
    def load(
        cls, config_file: Path | None = None, *, flags: Mapping[Loc, str] | None = None, **overrides: Any
    ) -> Settings:
        """Fold `overrides` (None = not given), ``ROLLSTREAM_*`` variables, the config file and defaults.

        `overrides` take flat names (``kafka_port=...``) or sections (``stream={"group_timeout": 5}``);
        `flags` names the flag each override came from (``("stream", "group_timeout")`` ->
        ``--group-timeout``) for error messages. Tables (``storage_options``, ``kafka.client``) merge
        key by key across the layers.

        Raises:
            SettingsError: a key is unknown, a value has the wrong type or range, or an explicitly
                named config file does not exist or does not parse.
        """
        if config_file is not None and not Path(config_file).is_file():
            raise SettingsError(f"config file {config_file} does not exist; create it or drop the option")
        given = {key: value for key, value in overrides.items() if value is not None}
        return cls(_build_sources=_layers(cls, config_file, given, dict(flags or {})))

    @field_validator("state_dir", "cache_dir")
    @classmethod
    def _absolute(cls, value: Path) -> Path:
        return value.expanduser().resolve()

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

    @model_validator(mode="after")
    def _mlflow_port_differs(self) -> Settings:
        taken = {port for pair in self.kafka.node_ports() for port in pair}
        if self.mlflow_port in taken:
            raise ValueError(
                f"mlflow_port = {self.mlflow_port} is also a Kafka port ({sorted(taken)}); give it its own"
            )
        return self

    def __repr_args__(self) -> Any:
        for name, value in super().__repr_args__():
            if name == "kafka" and isinstance(value, KafkaSettings):
                value = value.model_copy(update={"client": {k: "***" for k in value.client}})
            yield name, value

    def __getattr__(self, name: str) -> Any:
        """The flat names of settings in a section (``kafka_port`` is ``kafka.port``)."""
        where = FLAT_NAMES.get(name)
        if where is None:
            return super().__getattr__(name)  # type: ignore[misc]
        return getattr(getattr(self, where[0]), where[1])

    if TYPE_CHECKING:  # the flat names, typed for callers; __getattr__ reads them from their section
        kafka_host: str
        kafka_port: int
        controller_port: int
        kafka_version: str
        kafka_heap: str
        brokers: int
        bootstrap_servers: str
        kafka_client: Mapping[str, str]
        raw_topic: str
        ultra_topic: str
        dlq_topic: str
        sandbox_pool_size: int
        verifier_processes: int
        unknown_domains: str
        tasks_topic: str
        task_dlq_topic: str
        task_outcomes_topic: str
        task_group: str
        task_lock_ms: int
        task_deadline_ms: int
        task_max_attempts: int
        task_delivery_limit: int
        task_low_every: int
        task_window: int

    @property
    def sandbox_dir(self) -> Path:
        """The sandbox's directory: ``sandbox.dir``, or ``<state_dir>/sandbox``."""
        return self.sandbox.dir or self.state_dir / "sandbox"

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
        """A librdkafka config: ``bootstrap.servers``, the ``kafka.client`` passthrough, then `ours`."""
        return {"bootstrap.servers": self.kafka.bootstrap_servers, **self.kafka.client, **(ours or {})}

    def node_ports(self) -> list[tuple[int, int]]:
        """(client port, controller port) of each local Kafka node."""
        return self.kafka.node_ports()

    def replace(self, **changes: Any) -> Settings:
        """A copy with `changes` (flat names or sections); derived values (lake, bootstrap list) follow them."""
        return type(self)(
            _build_sources=(
                _Layer(InitSettingsSource(type(self), changes), "argument"),
                _Layer(InitSettingsSource(type(self), self._explicit()), "argument"),
            )
        )

    def _explicit(self) -> dict[str, Any]:
        """The values set explicitly, not derived: what a copy keeps."""
        kept: dict[str, Any] = {}
        for name in self.model_fields_set:
            value = getattr(self, name)
            if isinstance(value, Section):
                own = {field: getattr(value, field) for field in value.model_fields_set}
                if (
                    isinstance(value, KafkaSettings)
                    and own.get("bootstrap_servers") == value.derived_servers()
                ):
                    own.pop("bootstrap_servers")
                kept[name] = own
            else:
                kept[name] = value
        return kept

    def as_env(self) -> dict[str, str]:
        """Every setting as ``ROLLSTREAM_*`` variables, so a child process loads the same values."""
        env: dict[str, str] = {}
        for loc, value in _leaves(self.model_dump(mode="json")):
            if value is not None:
                env[env_name(*loc)] = value if isinstance(value, str) else json.dumps(value)
        return env


def _leaves(data: Mapping[str, Any], prefix: Loc = ()) -> Iterator[tuple[Loc, Any]]:
    """(path, value) of every setting in `data`, sections opened; tables are leaves."""
    for key, value in data.items():
        if isinstance(value, Mapping) and not prefix and key in SECTIONS:
            yield from _leaves(value, (key,))
        else:
            yield (*prefix, key), value


def _layers(
    cls: type[Settings], config_file: Path | None, overrides: dict[str, Any], flags: dict[Loc, str]
) -> tuple[PydanticBaseSettingsSource, ...]:
    file = Path(config_file) if config_file is not None else DEFAULT_CONFIG_FILE
    try:
        toml = _TomlSource(cls, toml_file=file)
    except (OSError, ValueError) as exc:  # tomllib.TOMLDecodeError is a ValueError
        raise SettingsError(f"cannot read config file {file}: {exc}; fix or remove it") from None
    return (
        _Layer(InitSettingsSource(cls, overrides), "override", flags=flags),
        _Layer(EnvSettingsSource(cls), "environment"),
        _Layer(_FlatEnvSource(cls), "environment"),
        _Layer(toml, str(file), base=file.resolve().parent),
    )


class _TomlSource(TomlConfigSettingsSource):
    """The TOML file's ``[rollstream]`` table, or its top level when it has none."""

    def _read_file(self, file_path: Any) -> dict[str, Any]:
        data = super()._read_file(file_path)
        table = data.get("rollstream", data)
        if not isinstance(table, dict):
            raise ValueError(f"'rollstream' must be a table ([rollstream]), got {table!r}")
        return table


class _FlatEnvSource(EnvSettingsSource):
    """``ROLLSTREAM_<FLAT_NAME>`` variables of settings that live in a section, with a warning each.

    The section's variable (``ROLLSTREAM_<SECTION>__<NAME>``), when set, wins and the flat one is not read.
    """

    def _load_env_vars(self) -> Mapping[str, str | None]:
        self.old_names: dict[Loc, str] = {}
        found: dict[str, str | None] = {}
        for flat, loc in [*((f, w) for f, w in FLAT_NAMES.items()), *((a, (n,)) for a, n in ALIASES.items())]:
            old, new = env_name(flat), env_name(*loc)
            value = os.environ.get(old)
            if not value or os.environ.get(new):
                continue
            warnings.warn(f"{old} is an old name; set {new} instead", SettingsWarning, stacklevel=2)
            found[new.lower()] = value
            self.old_names[loc] = old
        return found


class _Layer(PydanticBaseSettingsSource):
    """One source's values with flat names moved into their sections, remembering who set each.

    Within one layer one bootstrap address is shorthand for ``kafka.host`` and ``kafka.port``, and
    wins over them; a file's relative paths are relative to the file.
    """

    def __init__(
        self,
        inner: PydanticBaseSettingsSource,
        kind: str,
        *,
        flags: Mapping[Loc, str] | None = None,
        base: Path | None = None,
    ) -> None:
        super().__init__(inner.settings_cls)
        self.inner, self.kind, self.base = inner, kind, base
        self.flags: dict[Loc, str] = dict(flags or {})
        self.names: dict[Loc, str] = {}
        self.values: dict[str, Any] | None = None

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # __call__ reads the inner source whole

    def __call__(self) -> dict[str, Any]:
        if self.values is None:
            try:
                raw = self.inner()
            except SourceError as exc:
                raise SettingsError(f"{self.kind}: {exc}; give tables as a JSON object") from None
            self.values = self._normalized(dict(raw))
        return self.values

    def _normalized(self, data: dict[str, Any]) -> dict[str, Any]:
        for key in list(data):
            written = key
            if key in ALIASES:
                if ALIASES[key] in data:
                    raise SettingsError(f"{self.kind}: both {key} and {ALIASES[key]} are set; keep one")
                data[ALIASES[key]] = data.pop(key)
                self.names.setdefault((ALIASES[key],), self._written(written))
            elif key in FLAT_NAMES:
                section, field = FLAT_NAMES[key]
                table = data.setdefault(section, {})
                if not isinstance(table, dict):
                    continue  # validation reports the section
                if field in table:
                    raise SettingsError(
                        f"{self.kind}: both {key} and [{section}] {field} are set; keep [{section}] {field}"
                    )
                table[field] = data.pop(key)
                self.names.setdefault((section, field), self._written(written))
                if self.base is not None:
                    warnings.warn(
                        f"{self.kind}: {key} is an old name; write it as {field} under [{section}]",
                        SettingsWarning,
                        stacklevel=2,
                    )
        kafka = data.get("kafka")
        if isinstance(kafka, dict):
            address = single_server(kafka.get("bootstrap_servers"))
            if address is not None:
                kafka["host"], kafka["port"] = address
                kafka["bootstrap_servers"] = ""
                name = self.names.get(("kafka", "bootstrap_servers"))
                if name:
                    self.names.setdefault(("kafka", "host"), name)
                    self.names.setdefault(("kafka", "port"), name)
        if self.base is not None:
            for loc in _PATHS:
                table = data if len(loc) == 1 else data.get(loc[0])
                value = table.get(loc[-1]) if isinstance(table, dict) else None
                if (
                    isinstance(value, str)
                    and value
                    and "://" not in value
                    and not Path(value).expanduser().is_absolute()
                ):
                    assert isinstance(table, dict)
                    table[loc[-1]] = str(self.base / value)
        return data

    def _written(self, key: str) -> str:
        return env_name(key) if self.kind == "environment" else key

    def source_of(self, loc: Loc) -> str | None:
        """How this layer names the setting at `loc` ("environment variable ROLLSTREAM_X"), or None."""
        node: Any = self()
        for part in loc:
            if not isinstance(node, Mapping) or part not in node:
                return None
            node = node[part]
        if self.kind == "environment":
            old = getattr(self.inner, "old_names", {}).get(loc)
            return f"environment variable {old or self.names.get(loc) or self._env_of(loc)}"
        if loc in self.flags:
            return f"flag {self.flags[loc]}"
        if self.kind in ("override", "argument"):
            return f"{self.kind} {self.names.get(loc) or '.'.join(loc)}"
        written = self.names.get(loc) or (f"[{loc[0]}] {'.'.join(loc[1:])}" if len(loc) > 1 else loc[0])
        return f"{self.kind}: {written}"

    def _env_of(self, loc: Loc) -> str:
        """The variable that set `loc`: its own, or its section's JSON object."""
        for end in range(len(loc), 0, -1):
            if os.environ.get(env_name(*loc[:end])):
                return env_name(*loc[:end])
        return env_name(*loc)


def _source(layers: tuple[PydanticBaseSettingsSource, ...], loc: Loc) -> str:
    for layer in layers:
        if isinstance(layer, _Layer):
            found = layer.source_of(loc)
            if found:
                return found
    return "its default"


def _known() -> str:
    names = [name for name in Settings.model_fields if name not in SECTIONS]
    sections = ", ".join(f"[{section}]" for section in SECTIONS)
    return f"{', '.join(names)} and the sections {sections} (docs/configuration.md lists them all)"


def _explain(exc: ValidationError, layers: tuple[PydanticBaseSettingsSource, ...]) -> str:
    """One line per bad value: where it came from, the value, and what to give instead."""
    lines = []
    for error in exc.errors():
        loc = tuple(str(part) for part in error["loc"] if isinstance(part, str))
        message = str(error["msg"]).removeprefix("Value error, ")
        if error["type"] == "extra_forbidden":
            where = _source(layers, loc)
            lines.append(f"{where}: unknown setting; known settings: {_known()}")
            continue
        section = SECTIONS.get(loc[0]) if len(loc) == 1 else None
        if not loc or section is not None:  # a rule over several fields: name where each came from
            fields = section.model_fields if section is not None else Settings.model_fields
            mentioned = [name for name in fields if name in names_in(message)]
            origins = ", ".join(f"{name} from {_source(layers, (*loc, name))}" for name in mentioned)
            lines.append(f"{message}" + (f" ({origins})" if origins else ""))
            continue
        where = _source(layers, loc)
        lines.append(f"{where} = {error.get('input')!r}: {message}")
    return "; ".join(lines)
