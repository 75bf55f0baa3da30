"""Task types whose verifier does not exist yet: recorded, never judged, never executed."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from stream_processors.verifiers.base import Verdict, Verifier

CODE_SKIP_DETAIL = "sandboxed unit-test verifier not implemented yet"


class SkippedVerifier(Verifier):
    """Returns status "skipped" with reward 0.0, so the row lands but carries no learning signal.

    Used for code tasks until the sandbox lands: untrusted code is never executed here.
    """

    name = "skipped"

    def __init__(self, detail: str = CODE_SKIP_DETAIL) -> None:
        self.detail = detail

    def verify(self, record: Mapping[str, Any]) -> Verdict:
        """Skip judging; the detail says why."""
        return Verdict(0.0, "skipped", self.name, self.detail)

    def __repr__(self) -> str:
        return f"SkippedVerifier(detail={self.detail!r})"
