"""Math: compare the response's final answer with `expected_answer`, after normalization."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from stream_processors.exceptions import VerifierInputError
from stream_processors.verifiers.base import Verdict, Verifier

_ANSWER_MARKER = re.compile(r"answer\s*:", re.IGNORECASE)
_WHITESPACE = re.compile(r"\s+")
_BOXED = "\\boxed{"


def last_boxed(response: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (braces balanced), or None if there is none."""
    start = response.rfind(_BOXED)
    if start < 0:
        return None
    depth, begin = 0, start + len(_BOXED)
    for i in range(begin, len(response)):
        if response[i] == "{":
            depth += 1
        elif response[i] == "}":
            if depth == 0:
                return response[begin:i]
            depth -= 1
    return None


def final_answer(response: str) -> str:
    """The answer a response commits to, checked in this order.

    The content of the last ``\\boxed{...}``; else the first line after the last 'Answer:' marker
    (any case); else the last non-empty line.
    """
    boxed = last_boxed(response)
    if boxed is not None:
        return boxed
    markers = list(_ANSWER_MARKER.finditer(response))
    if markers:
        after = response[markers[-1].end() :].strip()
        return after.splitlines()[0] if after else ""
    lines = [line for line in response.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def normalize_answer(text: str) -> str:
    """Case-fold, collapse whitespace, and drop one trailing period ('42.' and ' 42 ' equal '42')."""
    folded = _WHITESPACE.sub(" ", text).strip().casefold()
    return folded[:-1].rstrip() if folded.endswith(".") else folded


class ExactAnswerVerifier(Verifier):
    """Reward 1.0 when the normalized final answer equals the normalized expected answer, else 0.0."""

    name = "exact_answer"

    def verify(self, record: Mapping[str, Any]) -> Verdict:
        """Judge a math trajectory; raises VerifierInputError if expected_answer is missing."""
        expected = record.get("expected_answer")
        if expected is None:
            raise VerifierInputError(
                f"math trajectory {record.get('trajectory_id')!r} has expected_answer=None: "
                "math producers must send the exact answer to compare with"
            )
        got = normalize_answer(final_answer(record.get("response_text") or ""))
        want = normalize_answer(expected)
        if got == want:
            return Verdict(1.0, "ok", self.name)
        return Verdict(0.0, "fail", self.name, f"final answer {got[:80]!r} != expected {want[:80]!r}")
