"""Which verifier judges which task_type."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from stream_processors.exceptions import UnknownTaskTypeError
from stream_processors.verifiers.base import Verifier
from stream_processors.verifiers.exact_answer import ExactAnswerVerifier
from stream_processors.verifiers.field_match import FieldMatchVerifier
from stream_processors.verifiers.precomputed import PrecomputedVerifier
from stream_processors.verifiers.skipped import SkippedVerifier


class VerifierRegistry(Mapping[str, Verifier]):
    """A mapping task_type -> verifier; looking up an unknown task_type raises UnknownTaskTypeError."""

    def __init__(self, verifiers: Mapping[str, Verifier] | None = None) -> None:
        self._verifiers: dict[str, Verifier] = dict(verifiers or {})

    def register(self, task_type: str, verifier: Verifier) -> None:
        """Route `task_type` to `verifier`, replacing any earlier choice."""
        self._verifiers[task_type] = verifier

    def __getitem__(self, task_type: str) -> Verifier:
        try:
            return self._verifiers[task_type]
        except KeyError:
            raise UnknownTaskTypeError(
                f"no verifier for task_type={task_type!r}; known task types: "
                f"{sorted(self._verifiers)}. Fix the producer or register a verifier"
            ) from None

    def __contains__(self, task_type: object) -> bool:
        return task_type in self._verifiers

    def __iter__(self) -> Iterator[str]:
        return iter(self._verifiers)

    def __len__(self) -> int:
        return len(self._verifiers)


def default_registry() -> VerifierRegistry:
    """math -> exact answer, extraction -> field match, precomputed -> as given, code -> skipped."""
    return VerifierRegistry(
        {
            "math": ExactAnswerVerifier(),
            "extraction": FieldMatchVerifier(),
            "precomputed": PrecomputedVerifier(),
            "code": SkippedVerifier(),
        }
    )
