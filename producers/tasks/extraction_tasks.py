"""Extraction prompts: pull named fields out of a document; the response is a JSON object.

A sample's score is the F1 of its fields (precision over the fields it gave, recall over the gold
fields), as the extraction verifier computes it; a response cut off mid-JSON scores 0.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from producers.tasks.base import GroupContent, cut

_NAMES = ("Ada Park", "Bram Osei", "Chen Wu", "Dana Silva", "Emil Novak", "Farah Haddad", "Goran Ilic")
_COMPANIES = ("Acme GmbH", "Globex Ltd", "Initech", "Umbrella SA", "Hooli Inc", "Vandelay Co")
_CITIES = ("Lisbon", "Osaka", "Nairobi", "Denver", "Tallinn", "Recife", "Perth")

Field = Callable[[np.random.Generator], str]


def _pick(options: tuple[str, ...]) -> Field:
    return lambda rng: str(rng.choice(options))


def _date(rng: np.random.Generator) -> str:
    return f"2024-{int(rng.integers(1, 13)):02d}-{int(rng.integers(1, 29)):02d}"


def _money(rng: np.random.Generator) -> str:
    return f"{rng.integers(100, 10**6) / 100:.2f}"


def _code(prefix: str, digits: int) -> Field:
    return lambda rng: f"{prefix}{int(rng.integers(10 ** (digits - 1), 10**digits))}"


SCHEMAS: dict[str, dict[str, Field]] = {
    "invoice": {
        "invoice_number": _code("INV-", 6),
        "vendor": _pick(_COMPANIES),
        "total": _money,
        "currency": _pick(("EUR", "USD", "JPY", "GBP")),
        "issue_date": _date,
        "due_date": _date,
    },
    "receipt": {
        "merchant": _pick(_COMPANIES),
        "total": _money,
        "date": _date,
        "payment_method": _pick(("card", "cash", "transfer")),
    },
    "resume": {
        "name": _pick(_NAMES),
        "email": _code("user", 5),
        "title": _pick(("engineer", "analyst", "designer", "nurse", "teacher")),
        "years_experience": lambda rng: str(int(rng.integers(0, 31))),
    },
    "shipping": {
        "tracking_number": _code("1Z", 10),
        "carrier": _pick(("DHL", "UPS", "FedEx", "PostNL")),
        "origin": _pick(_CITIES),
        "destination": _pick(_CITIES),
        "weight_kg": lambda rng: f"{rng.integers(1, 5000) / 10:.1f}",
    },
    "contract": {
        "party_a": _pick(_COMPANIES),
        "party_b": _pick(_NAMES),
        "effective_date": _date,
        "term_months": lambda rng: str(int(rng.choice([6, 12, 24, 36]))),
        "governing_law": _pick(("Portugal", "Japan", "Kenya", "Colorado", "Estonia")),
    },
}
FAMILIES = tuple(SCHEMAS)


def generate(
    rng: np.random.Generator,
    family: str,
    level: int,
    quality: npt.NDArray[np.float64],
    truncated: npt.NDArray[np.bool_],
) -> GroupContent:
    """One document's gold fields and, per sample, a JSON answer with each field right w.p. quality[i]."""
    fields = SCHEMAS[family]
    gold = {name: make(rng) for name, make in fields.items()}
    prompt = f"Extract {', '.join(gold)} from this {family} as a JSON object (difficulty {level})."
    responses: list[str] = []
    scores: list[float] = []
    for q, cut_off in zip(quality.tolist(), truncated.tolist(), strict=True):
        answer: dict[str, str] = {}
        right = 0
        for name, make in fields.items():
            draw = rng.random()
            if draw < q:
                answer[name] = gold[name]
                right += 1
            elif draw < q + (1 - q) * 0.8:
                wrong = make(rng)
                answer[name] = wrong if wrong != gold[name] else wrong + "?"
        text = json.dumps(answer)
        if cut_off:
            text, right = cut(rng, text), 0
        responses.append(text)
        # F1 over fields: precision over the fields given, recall over the gold fields
        precision, recall = (right / len(answer) if answer else 0.0), right / len(fields)
        scores.append(2 * precision * recall / (precision + recall) if right else 0.0)
    return GroupContent(prompt=prompt, responses=responses, scores=scores, fields={"gold_fields": gold})
