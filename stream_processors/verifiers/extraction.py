"""Extraction: per-field precision, recall and F1 of a JSON response against the gold fields,
with numbers, dates, money, percentages and units normalized (normalize.py)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from stream_processors.exceptions import VerifierInputError
from stream_processors.verifiers.base import Verdict, Verifier
from stream_processors.verifiers.field_match import _as_text
from stream_processors.verifiers.normalize import same_value


class ExtractionVerifier(Verifier):
    """Reward = F1 over fields: a field is right when its value means the gold value.

    Precision counts the fields the response gave (non-null scalars), recall the gold fields.
    Components: precision, recall, f1, matched. Status "ok" when every gold field is right and
    nothing else was given, else "fail"; a response that is not a JSON object scores 0.

    Args:
        numeric_tolerance: relative tolerance when comparing numbers.
    """

    name = "extraction"
    version = "2.0.0"

    def __init__(self, *, numeric_tolerance: float = 1e-9) -> None:
        self.numeric_tolerance = numeric_tolerance

    def verify(self, record: Mapping[str, Any]) -> Verdict:
        """Judge an extraction trajectory; raises VerifierInputError without gold_fields."""
        gold = record.get("gold_fields")
        if not gold:
            raise VerifierInputError(
                f"extraction trajectory {record.get('trajectory_id')!r} has gold_fields={gold!r}: "
                "extraction producers must send at least one gold field"
            )
        zero = {"precision": 0.0, "recall": 0.0, "f1": 0.0, "matched": 0.0}
        try:
            parsed = json.loads(record.get("response_text") or "")
        except (ValueError, RecursionError) as exc:
            return self.verdict(0.0, "fail", f"response is not valid JSON: {exc}"[:200], zero)
        if not isinstance(parsed, dict):
            return self.verdict(
                0.0, "fail", f"response JSON is a {type(parsed).__name__}, not an object", zero
            )
        given = {k: t for k, v in parsed.items() if v is not None and (t := _as_text(v)) is not None}
        matched = sum(
            1
            for key, want in gold.items()
            if key in given and same_value(given[key], want, self.numeric_tolerance)
        )
        precision = matched / len(given) if given else 0.0
        recall = matched / len(gold)
        f1 = 2 * precision * recall / (precision + recall) if matched else 0.0
        components = {"precision": precision, "recall": recall, "f1": f1, "matched": float(matched)}
        ok = matched == len(gold) == len(given)
        detail = None if ok else f"{matched}/{len(gold)} gold fields matched, {len(given)} given"
        return self.verdict(f1, "ok" if ok else "fail", detail, components)
