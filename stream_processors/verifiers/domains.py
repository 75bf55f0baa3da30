"""Which verifier judges which domain: built from the domain registry (schemas/domains.toml).

Each domain names a verifier and its options; one verifier object is built per distinct
(verifier, version, options) and shared. A record whose domain is not registered raises
`UnknownDomainError` (a dead letter), unless `unknown_domains="task-type"` routes it to its task
type's default verifier.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from schemas.defaults import StreamDefaults
from schemas.domains import DomainRegistry, DomainSpec, default_domains
from stream_processors.exceptions import DomainMismatchError, UnknownDomainError, UnknownTaskTypeError
from stream_processors.sandbox import EMPTY, EnvironmentStore, Limits, Sandbox
from stream_processors.verifiers.base import Verdict, Verifier
from stream_processors.verifiers.code_tests import CodeTestsVerifier
from stream_processors.verifiers.exact_answer import ExactAnswerVerifier
from stream_processors.verifiers.extraction import ExtractionVerifier
from stream_processors.verifiers.field_match import FieldMatchVerifier
from stream_processors.verifiers.math_answer import MathVerifier
from stream_processors.verifiers.precomputed import PrecomputedVerifier
from stream_processors.verifiers.skipped import SkippedVerifier
from stream_processors.verifiers.symbolic import SymbolicChecker
from stream_processors.verifiers.tool_use import ToolUseVerifier

UNKNOWN_DOMAIN_POLICIES = ("dead-letter", "task-type")
SANDBOXED = frozenset({"code_tests", "tool_use"})
WAITING = SANDBOXED | {"math"}
"""Verifiers whose judgement may wait on a child process: the sandbox, or math's symbolic helper."""
LOOKUP_CACHE_SIZE = 4096
"""(domain, task_type) pairs whose verifier is remembered; past it, lookups are computed again."""
_LIMIT_FIELDS = frozenset(f.name for f in dataclasses.fields(Limits))


class DomainVerifiers:
    """domain -> verifier, per the registry; thread-safe.

    Args:
        domains: the domain registry; default the shipped one.
        sandbox: runs code for the sandboxed verifiers; default one made (and checked) on first use.
        environments: the environment store; default under the sandbox's work root.
        unknown_domains: "dead-letter" (default) or "task-type" (judge with the task type's defaults).
        versions: verifier name -> version to use instead of the newest (rescoring).
        overrides: task type -> verifier object, replacing what the registry names (tests, benches).
    """

    def __init__(
        self,
        domains: DomainRegistry | None = None,
        *,
        sandbox: Sandbox | None = None,
        environments: EnvironmentStore | None = None,
        unknown_domains: str = StreamDefaults.unknown_domains,
        versions: Mapping[str, str] | None = None,
        overrides: Mapping[str, Verifier] | None = None,
    ) -> None:
        if unknown_domains not in UNKNOWN_DOMAIN_POLICIES:
            raise ValueError(
                f"unknown_domains must be one of {UNKNOWN_DOMAIN_POLICIES}, got {unknown_domains!r}"
            )
        self.domains = domains if domains is not None else default_domains()
        self._sandbox = sandbox
        self._environments = environments
        self.unknown_domains = unknown_domains
        self.versions = dict(versions or {})
        self.overrides = dict(overrides or {})
        self._built: dict[tuple[str, str, tuple[tuple[str, Any], ...]], Verifier] = {}
        self._lookups: dict[tuple[str, str], tuple[Verifier, DomainSpec]] = {}
        self._lock = threading.Lock()
        self._checker: SymbolicChecker | None = None

    @property
    def sandbox(self) -> Sandbox:
        """The sandbox; made and checked on first use (raises SandboxUnavailableError)."""
        with self._lock:
            if self._sandbox is None:
                sandbox = Sandbox()
                sandbox.check()
                self._sandbox = sandbox
            return self._sandbox

    @property
    def needs_sandbox(self) -> bool:
        """Whether any registered domain (or its task type's default) runs code in the sandbox."""
        names = {spec.verifier for spec in self.domains.values()}
        if self.unknown_domains == "task-type":
            names |= {verifier for verifier, _ in self.domains.task_types.values()}
        return bool(names & SANDBOXED)

    @property
    def environments(self) -> EnvironmentStore:
        """The environment store (default ``<sandbox work root>/../rollstream-environments``)."""
        if self._environments is None:
            root = Path(self.sandbox.work_root).with_name(Path(self.sandbox.work_root).name + "-environments")
            self._environments = EnvironmentStore(root)
        return self._environments

    def spec(self, record: Mapping[str, Any]) -> DomainSpec:
        """The registry's entry for the record's domain (or its task type's, by policy)."""
        domain = record.get("domain", "")
        task_type = record.get("task_type", "")
        if task_type not in self.domains.task_types and task_type not in self.overrides:
            raise UnknownTaskTypeError(
                f"no verifier for task_type={task_type!r}; known task types: "
                f"{sorted(self.domains.task_types)}. Fix the producer or register the task type"
            )
        if domain in self.domains:
            spec = self.domains[domain]
            if spec.task_type != task_type:
                raise DomainMismatchError(
                    f"domain {domain!r} is task type {spec.task_type!r} in {self.domains.source}, "
                    f"but the record says task_type={task_type!r}; fix the producer or the registry"
                )
            return spec
        if self.unknown_domains == "task-type":
            if task_type not in self.domains.task_types:
                raise UnknownTaskTypeError(
                    f"unknown domain {domain!r} with task_type={task_type!r}, which has no defaults in "
                    f"{self.domains.source}; known task types: {sorted(self.domains.task_types)}"
                )
            verifier, options = self.domains.task_types[task_type]
            return DomainSpec(domain, task_type, verifier, options)
        raise UnknownDomainError(
            f"unknown domain {domain!r} (task_type={task_type!r}): not in the domain registry "
            f"{self.domains.source}; register it there (one line), or run the worker with "
            "unknown_domains='task-type' to judge it by its task type's defaults"
        )

    def lookup(self, record: Mapping[str, Any]) -> tuple[Verifier, DomainSpec]:
        """The verifier for a record and its domain's entry (remembered per domain and task type)."""
        key = (record.get("domain", ""), record.get("task_type", ""))
        found = self._lookups.get(key)
        if found is None:
            spec = self.spec(record)
            verifier = self.overrides.get(spec.task_type) or self.build(spec)
            found = (verifier, spec)
            if len(self._lookups) < LOOKUP_CACHE_SIZE:  # bounded: domains come from the input
                self._lookups[key] = found
        return found

    def waits(self, record: Mapping[str, Any]) -> bool:
        """Whether judging the record may wait: on the sandbox, on the symbolic checker's helper
        process (math), or on an override of unknown cost.

        Such records are judged in the sandbox pool's threads; the rest (answer and field checks,
        precomputed rewards, records that will be dead letters) are cheaper judged in place.
        """
        try:
            _, spec = self.lookup(record)
        except Exception:
            return False
        return spec.verifier in WAITING or spec.task_type in self.overrides

    def judge(self, record: Mapping[str, Any]) -> Verdict:
        """Look up and run the verifier, applying the domain's reward scale."""
        verifier, spec = self.lookup(record)
        verdict = verifier.verify(record)
        if spec.reward_scale != 1.0:
            verdict = dataclasses.replace(verdict, reward=verdict.reward * spec.reward_scale)
        return verdict

    def build(self, spec: DomainSpec, version: str | None = None) -> Verifier:
        """The verifier a domain names, at `version` (default: `versions` or the newest)."""
        versions = FACTORIES.get(spec.verifier)
        if versions is None:
            raise UnknownDomainError(
                f"domain {spec.name!r} names verifier {spec.verifier!r}, which does not exist; "
                f"known verifiers: {sorted(FACTORIES)}"
            )
        version = version or self.versions.get(spec.verifier) or max(versions, key=_version_key)
        if version not in versions:
            raise UnknownDomainError(
                f"verifier {spec.verifier!r} has no version {version!r}; known: {sorted(versions)}"
            )
        key = (spec.verifier, version, tuple(sorted(spec.options.items())))
        with self._lock:
            if key in self._built:
                return self._built[key]
        verifier = versions[version](self, dict(spec.options))
        with self._lock:
            return self._built.setdefault(key, verifier)

    def checker(self, timeout_s: float) -> SymbolicChecker:
        """The shared symbolic checker."""
        with self._lock:
            if self._checker is None:
                self._checker = SymbolicChecker(timeout_s=timeout_s)
            return self._checker

    def limits(self, options: Mapping[str, Any]) -> Limits:
        """The sandbox's default limits with the domain's limit options applied."""
        return self.sandbox.limits.replace(**{k: v for k, v in options.items() if k in _LIMIT_FIELDS})

    def close(self) -> None:
        """Stop the symbolic checker's helper process."""
        if self._checker is not None:
            self._checker.close()


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) if p.isdigit() else 0 for p in version.split("."))


def _sandboxed(
    cls: type[CodeTestsVerifier | ToolUseVerifier],
) -> Callable[[DomainVerifiers, dict[str, Any]], Verifier]:
    def make(ctx: DomainVerifiers, options: dict[str, Any]) -> Verifier:
        name = str(options.get("environment", EMPTY))
        environment = None if name == EMPTY else ctx.environments.get(name)
        return cls(ctx.sandbox, environment=environment, limits=ctx.limits(options))

    return make


FACTORIES: dict[str, dict[str, Callable[[DomainVerifiers, dict[str, Any]], Verifier]]] = {
    "math": {
        "1": lambda ctx, o: ExactAnswerVerifier(),
        "2.0.0": lambda ctx, o: MathVerifier(
            tolerance=float(o.get("tolerance", 1e-6)),
            symbolic=bool(o.get("symbolic", True)),
            checker=ctx.checker(float(o.get("symbolic_timeout_s", 2.0))),
        ),
    },
    "extraction": {
        "1": lambda ctx, o: FieldMatchVerifier(),
        "2.0.0": lambda ctx, o: ExtractionVerifier(numeric_tolerance=float(o.get("numeric_tolerance", 1e-9))),
    },
    "code_tests": {"0": lambda ctx, o: SkippedVerifier(), "1.0.0": _sandboxed(CodeTestsVerifier)},
    "tool_use": {"1.0.0": _sandboxed(ToolUseVerifier)},
    "precomputed": {"1": lambda ctx, o: PrecomputedVerifier()},
}
"""verifier name -> version -> factory(context, options). Older versions stay for rescoring."""
