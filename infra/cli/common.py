"""What every command shares: the settings flags, the `Settings` they fold into, errors and messages."""

import functools
import inspect
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Union

import typer

from infra.settings import Settings
from infra.settings_sections import FLAT_NAMES, SECTIONS, flat_name
from schemas.exceptions import RollstreamError

root = typer.Typer(
    name="rollstream",
    help="The rollstream command line: one sub-command per job, each a thin shell over the library.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


class UsageError(RollstreamError):
    """A flag's value cannot be used; the message says which and what to write."""


INVOCATION: list[str] = []
"""The command line `main` is running (without the program name): `process --workers N` re-runs it per worker."""


def progress(message: str) -> None:
    """One line of what a command is doing, on stderr (stdout carries results)."""
    print(f"[rollstream] {message}", file=sys.stderr, flush=True)


def pairs(items: Sequence[str], flag: str) -> dict[str, str]:
    """``KEY=VALUE`` flags as a dict; anything else is a UsageError naming the flag."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"{flag} {item!r}: give KEY=VALUE, e.g. {flag} security.protocol=SASL_SSL")
        out[key.strip()] = value
    return out


@dataclass(frozen=True)
class Common:
    """The flags every command takes; they override the config file and ``ROLLSTREAM_*``."""

    config: Path | None = None
    state_dir: Path | None = None
    kafka_port: int | None = None
    controller_port: int | None = None
    mlflow_port: int | None = None
    brokers: int | None = None
    bootstrap_servers: str | None = None
    lake_uri: str | None = None
    storage_option: tuple[str, ...] = ()
    kafka_client: tuple[str, ...] = ()
    section_flags: tuple[tuple[str, str, str, Any], ...] = ()
    """(section, field, flag, value) of each section setting given on the command line."""

    def settings(self) -> Settings:
        """Fold defaults, the config file, the environment and these flags."""
        sections: dict[str, dict[str, Any]] = {}
        for section, field, _, value in self.section_flags:
            sections.setdefault(section, {})[field] = value
        return Settings.load(
            self.config,
            flags={
                **_COMMON_FLAGS,
                **{(section, field): flag for section, field, flag, _ in self.section_flags},
            },
            **sections,
            state_dir=self.state_dir,
            kafka_port=self.kafka_port,
            controller_port=self.controller_port,
            mlflow_port=self.mlflow_port,
            brokers=self.brokers,
            bootstrap_servers=self.bootstrap_servers,
            lake_uri=self.lake_uri,
            storage_options=pairs(self.storage_option, "--storage-option") or None,
            kafka_client=pairs(self.kafka_client, "--kafka-client") or None,
        )


def _option(name: str, kind: Any, help_: str, default: Any = None) -> inspect.Parameter:
    flag = "--" + name.replace("_", "-")
    annotation = Annotated[kind, typer.Option(flag, help=help_, rich_help_panel="Settings")]
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)


_COMMON = [
    _option("config", Path | None, "settings file (default ./rollstream.toml if present)"),
    _option("state_dir", Path | None, "where services keep data, logs and pid files"),
    _option("kafka_port", int | None, "the broker's client port on 127.0.0.1"),
    _option("controller_port", int | None, "the KRaft controller port on 127.0.0.1"),
    _option("mlflow_port", int | None, "the MLflow server's port on 127.0.0.1 (up --mlflow-server)"),
    _option("brokers", int | None, "local Kafka nodes (up starts a KRaft cluster of this many; default 1)"),
    _option("bootstrap_servers", str | None, "the brokers clients connect to, host:port[,host:port...]"),
    _option("lake_uri", str | None, "the lake: a directory or s3:// gs:// az:// URI"),
    _option("storage_option", list[str], "KEY=VALUE object-store option for the lake (repeatable)", []),
    _option("kafka_client", list[str], "KEY=VALUE librdkafka setting for every client (repeatable)", []),
]


def section_options(section: str) -> list[tuple[str, str, inspect.Parameter]]:
    """(field, flag, parameter) of each setting of `section` that has a flag, made from its field.

    Every option defaults to None (not given), so the environment and the file still apply; the
    help shows the field's description and default.
    """
    options = []
    for field, info in SECTIONS[section].model_fields.items():
        extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
        if extra.get("flag") is False:
            continue
        flag = str(extra.get("flag") or "--" + flat_name(section, field).replace("_", "-"))
        kind = info.annotation
        default = info.get_default(call_default_factory=True)
        help_ = f"{info.description} (setting {section}.{field}; default {default!r})"
        option = typer.Option(
            flag,
            help=help_,
            metavar=str(extra["metavar"]) if "metavar" in extra else None,
            rich_help_panel=f"Settings: {section}",
            show_default=False,
        )
        annotation = _ANNOTATED[_UNION[kind, None], option]
        name = f"{section}__{field}"
        options.append(
            (field, flag.split("/")[0], inspect.Parameter(name, _KW, default=None, annotation=annotation))
        )
    return options


_KW = inspect.Parameter.KEYWORD_ONLY
_ANNOTATED: Any = Annotated
_UNION: Any = Union


_COMMON_FLAGS: dict[tuple[str, ...], str] = {
    tuple(FLAT_NAMES.get(name, (name,))): "--" + name.replace("_", "-")
    for name in (
        "state_dir",
        "kafka_port",
        "controller_port",
        "mlflow_port",
        "brokers",
        "bootstrap_servers",
        "lake_uri",
    )
}
_COMMON_FLAGS |= {("storage_options",): "--storage-option", ("kafka", "client"): "--kafka-client"}


def command(
    app: typer.Typer, name: str, help_: str, *, sections: tuple[str, ...] = ()
) -> Callable[[Callable[..., int]], Callable[..., int]]:
    """Register `fn(common, **own)` as command `name`, taking its own options, the settings flags and
    a flag per setting of each of `sections` (made from the settings model)."""

    def register(fn: Callable[..., int]) -> Callable[..., int]:
        signature = inspect.signature(fn, eval_str=True)
        own = [p for name_, p in signature.parameters.items() if name_ != "common"]
        generated = {section: section_options(section) for section in sections}
        extra = [parameter for options in generated.values() for _, _, parameter in options]

        @functools.wraps(fn)
        def run(**values: Any) -> int:
            common = {p.name: values.pop(p.name) for p in _COMMON}
            common["storage_option"] = tuple(common["storage_option"] or ())
            common["kafka_client"] = tuple(common["kafka_client"] or ())
            given = []
            for section, options in generated.items():
                for field, flag, parameter in options:
                    value = values.pop(parameter.name)
                    if value is not None:
                        given.append((section, field, flag, value))
            return fn(Common(**common, section_flags=tuple(given)), **values)

        parameters = [*own, *extra, *_COMMON]
        run.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
        run.__annotations__ = {p.name: p.annotation for p in parameters} | {"return": int}
        app.command(name, help=help_, short_help=help_)(run)
        return fn

    return register
