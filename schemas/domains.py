"""The domain registry: which verifier judges each task domain, with which options.

One declarative TOML file (``schemas/domains.toml`` by default) holds task-type defaults and one
line per domain. A domain line is either the name of its task type or an inline table with
``task_type`` and the options it overrides. This module is the format and its reader; producers
validate the domains they emit against it, and the stream stage picks verifiers from it. It
imports nothing of ours but the contract's exceptions.

    [task_types.code]
    verifier = "code_tests"
    options = { environment = "python", wall_s = 20 }

    [domains]
    "code/fizzbuzz-000" = "code"
    "code/fizzbuzz-001" = { task_type = "code", wall_s = 40 }
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from schemas.exceptions import DomainRegistryError

DEFAULT_REGISTRY = Path(__file__).with_name("domains.toml")
OptionValue = str | int | float | bool


@dataclass(frozen=True, slots=True)
class DomainSpec:
    """One domain: its task type, the verifier that judges it and that verifier's options.

    Attributes:
        name: the domain's name, as trajectories carry it (e.g. 'math/algebra-001').
        task_type: the task type it belongs to; its defaults apply.
        verifier: the verifier's registered name (e.g. 'math', 'code_tests').
        options: the task type's options overlaid with the domain's own (tolerance,
            environment, limits, reward_scale, ...).
    """

    name: str
    task_type: str
    verifier: str
    options: Mapping[str, OptionValue] = field(default_factory=dict)

    @property
    def reward_scale(self) -> float:
        """The factor the verifier's reward is multiplied by (option `reward_scale`, default 1)."""
        return float(self.options.get("reward_scale", 1.0))


def _options(raw: Any, where: str) -> dict[str, OptionValue]:
    if not isinstance(raw, dict):
        raise DomainRegistryError(f"{where}: options must be a table, got {raw!r}")
    for key, value in raw.items():
        if not isinstance(value, str | int | float | bool):
            raise DomainRegistryError(
                f"{where}: option {key!r} = {value!r} is not a string, number or boolean"
            )
    return dict(raw)


class DomainRegistry(Mapping[str, DomainSpec]):
    """The registry read from one file: a read-only mapping domain name -> DomainSpec.

    Args:
        task_types: task type -> (verifier, default options).
        domains: the domains, each already merged with its task type's defaults.
        source: where it was read from, for messages.
    """

    def __init__(
        self,
        task_types: Mapping[str, tuple[str, Mapping[str, OptionValue]]],
        domains: Mapping[str, DomainSpec],
        source: str = "<memory>",
    ) -> None:
        self.task_types = MappingProxyType(dict(task_types))
        self._domains = dict(domains)
        self.source = source

    @classmethod
    def from_toml(cls, text: str, source: str = "<string>") -> DomainRegistry:
        """Parse a registry's text; raises DomainRegistryError naming the bad entry."""
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise DomainRegistryError(f"{source}: not valid TOML: {exc}") from exc
        types_raw = data.get("task_types")
        if not isinstance(types_raw, dict) or not types_raw:
            raise DomainRegistryError(f"{source}: needs a [task_types.<name>] table per task type")
        task_types: dict[str, tuple[str, dict[str, OptionValue]]] = {}
        for name, spec in types_raw.items():
            where = f"{source}: task_types.{name}"
            if not isinstance(spec, dict) or not isinstance(spec.get("verifier"), str):
                raise DomainRegistryError(f'{where}: needs verifier = "<name>"')
            task_types[name] = (spec["verifier"], _options(spec.get("options", {}), where))
        domains: dict[str, DomainSpec] = {}
        for name, line in (data.get("domains") or {}).items():
            where = f"{source}: domains.{name!r}"
            entry = {"task_type": line} if isinstance(line, str) else line
            if not isinstance(entry, dict) or not isinstance(entry.get("task_type"), str):
                raise DomainRegistryError(
                    f'{where}: expected "<task type>" or {{ task_type = "...", <option> = ... }}, got {line!r}'
                )
            own = dict(entry)
            task_type = own.pop("task_type")
            if task_type not in task_types:
                raise DomainRegistryError(
                    f"{where}: task type {task_type!r} has no [task_types.{task_type}] table; "
                    f"known: {sorted(task_types)}"
                )
            verifier, defaults = task_types[task_type]
            verifier = own.pop("verifier", verifier)
            domains[name] = DomainSpec(name, task_type, verifier, {**defaults, **_options(own, where)})
        if not domains:
            raise DomainRegistryError(f"{source}: the [domains] table is empty")
        return cls(task_types, domains, source)

    @classmethod
    def load(cls, path: Path | str | None = None) -> DomainRegistry:
        """Read a registry file (default the shipped `schemas/domains.toml`)."""
        file = Path(path) if path is not None else DEFAULT_REGISTRY
        try:
            text = file.read_text()
        except OSError as exc:
            raise DomainRegistryError(f"cannot read the domain registry {file}: {exc}") from exc
        return cls.from_toml(text, str(file))

    def __getitem__(self, name: str) -> DomainSpec:
        try:
            return self._domains[name]
        except KeyError:
            raise DomainRegistryError(
                f"unknown domain {name!r}: not in the domain registry {self.source} "
                f"({len(self._domains)} domains); register it there (one line) or fix the producer"
            ) from None

    def __contains__(self, name: object) -> bool:
        return name in self._domains

    def get(self, name: str, default: DomainSpec | None = None) -> DomainSpec | None:  # type: ignore[override]
        """The domain's entry, or `default` when it is not registered."""
        return self._domains.get(name, default)

    def __iter__(self) -> Iterator[str]:
        return iter(self._domains)

    def __len__(self) -> int:
        return len(self._domains)


_default: DomainRegistry | None = None


def default_domains() -> DomainRegistry:
    """The shipped registry, read once per process."""
    global _default
    if _default is None:
        _default = DomainRegistry.load()
    return _default
