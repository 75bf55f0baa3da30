"""The verifier protocol: a record in, a `Verdict` out.

A verifier judges one decoded trajectory. It raises `VerifierInputError` when the record lacks
what it needs (a producer bug: the record becomes a dead letter) and otherwise always returns a
verdict, failing closed (reward 0.0) on responses it cannot read.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from stream_processors.sandbox import Execution

VerdictStatus = Literal["ok", "fail", "error", "timeout", "output_limit", "skipped"]
STATUSES: frozenset[str] = frozenset({"ok", "fail", "error", "timeout", "output_limit", "skipped"})


@dataclass(frozen=True, slots=True)
class Verdict:
    """A verifier's judgement of one trajectory.

    Attributes:
        reward: the scalar reward, finite.
        status: "ok" (verified, passed), "fail" (verified, failed), "error" (could not judge),
            "timeout", "output_limit" (the program's output reached the sandbox's cap and it was
            stopped there), or "skipped" (no verifier runs for this task type yet).
        verifier: name of the verifier that judged.
        detail: a short human-readable explanation, or None.
        verifier_version: the version of the verifier's judging rules.
        reward_components: named parts of the reward (empty when the reward is one number).
        executions: the sandbox executions that produced it (the audit trail), in order.
    """

    reward: float
    status: VerdictStatus
    verifier: str
    detail: str | None = None
    verifier_version: str = "1"
    reward_components: Mapping[str, float] = field(default_factory=dict)
    executions: tuple[Execution, ...] = ()

    def __reduce__(self) -> tuple[type[Verdict], tuple[Any, ...]]:
        """Pickled as its constructor's arguments: the verifier pool returns thousands a second, and
        the default for a frozen slots dataclass looks up its fields once per object."""
        return (
            Verdict,
            (
                self.reward,
                self.status,
                self.verifier,
                self.detail,
                self.verifier_version,
                self.reward_components,
                self.executions,
            ),
        )


class Verifier(ABC):
    """Judges trajectories of one task family; subclasses set `name`, `version` and `verify`.

    `version` changes whenever the judging rules change, so every stored reward names the rules
    that produced it (and `rollstream rescore` can compare two versions).
    """

    name: str = "verifier"
    version: str = "1"

    @abstractmethod
    def verify(self, record: Mapping[str, Any]) -> Verdict:
        """Judge one decoded trajectory record (see `schemas.TrajectoryRecord`)."""

    def verdict(
        self,
        reward: float,
        status: VerdictStatus,
        detail: str | None = None,
        components: Mapping[str, float] | None = None,
        executions: tuple[Execution, ...] = (),
    ) -> Verdict:
        """A Verdict signed with this verifier's name and version."""
        return Verdict(reward, status, self.name, detail, self.version, dict(components or {}), executions)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
