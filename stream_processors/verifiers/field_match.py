"""Extraction: the response is a JSON object; reward is the fraction of gold fields it matches."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from stream_processors.exceptions import VerifierInputError
from stream_processors.verifiers.base import Verdict, VerdictStatus, Verifier


def _as_text(value: Any) -> str | None:
    """A JSON value as the string a gold field would hold: strings as is, scalars as JSON text."""
    if isinstance(value, str):
        return value
    if value is None or isinstance(value, bool | int | float):
        return json.dumps(value)
    return None


class FieldMatchVerifier(Verifier):
    """Parses the response with `json.loads` (never eval) and counts exact field matches.

    A gold value "42" matches the JSON string "42" and the JSON number 42; nested objects and
    arrays never match. Invalid JSON, or JSON that is not an object, scores 0.0 with status
    "fail". Status is "ok" only when every gold field matches.
    """

    name = "field_match"

    def verify(self, record: Mapping[str, Any]) -> Verdict:
        """Judge an extraction trajectory; raises VerifierInputError without gold_fields."""
        gold = record.get("gold_fields")
        if not gold:
            raise VerifierInputError(
                f"extraction trajectory {record.get('trajectory_id')!r} has gold_fields={gold!r}: "
                "extraction producers must send at least one gold field"
            )
        text = record.get("response_text") or ""
        try:
            parsed = json.loads(text)
        except (ValueError, RecursionError) as exc:
            return Verdict(0.0, "fail", self.name, f"response is not valid JSON: {exc}"[:200])
        if not isinstance(parsed, dict):
            return Verdict(
                0.0, "fail", self.name, f"response JSON is a {type(parsed).__name__}, not an object"
            )
        matched = sum(1 for key, want in gold.items() if key in parsed and _as_text(parsed[key]) == want)
        reward = matched / len(gold)
        status: VerdictStatus = "ok" if matched == len(gold) else "fail"
        return Verdict(reward, status, self.name, f"{matched}/{len(gold)} gold fields matched")
