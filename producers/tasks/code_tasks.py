"""Code prompts: write one small Python function; ``unit_tests`` checks it with plain asserts.

The sandbox contract: run ``response_text`` followed by ``unit_tests`` in one Python process;
exit status 0 means every test passed. The tests also collect under pytest.

No candidate is ever run here. Each is one of a family's variants, whose outcome is known by
construction (see `producers.tasks.code_families`): the reference solution passes; each bug fails
the case that catches it; a stub raises; a header without its colon is a syntax error; a
cut-off response stops inside the ``def`` line, so the function is never defined. Each sample
records which variant it is in its metadata (``candidate``), so tests can re-derive the label.
"""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np
import numpy.typing as npt

from producers.exceptions import ProducerError
from producers.tasks.base import GroupContent
from producers.tasks.code_families import FAMILIES as _SPECS
from producers.tasks.code_families import Cases, CodeFamily

FAMILIES = tuple(_SPECS)
REFERENCE = "reference"
STUB = "stub"
SYNTAX_ERROR = "syntax-error"
# A wrong sample is one of the family's two bugs most of the time, else a stub or a syntax error.
_WRONG_WEIGHTS = np.array([0.4, 0.4, 0.1, 0.1])


def _mutate(source: str, family: str, old: str, new: str) -> str:
    if source.count(old) != 1:
        raise ProducerError(
            f"code family {family!r}: a bug must replace text found exactly once in the reference, "
            f"found {source.count(old)} times: {old!r}; fix the Mutation in code_families.py"
        )
    return source.replace(old, new)


def _variants(family: str, spec: CodeFamily) -> tuple[tuple[str, str], ...]:
    """(candidate name, text) pairs; only the first, the reference, passes its unit tests."""
    source = inspect.getsource(spec.reference)
    name = spec.reference.__name__
    head, _, body = source.partition(":\n")
    return (
        (REFERENCE, source),
        *((f"bug:{bug.slug}", _mutate(source, family, bug.old, bug.new)) for bug in spec.bugs),
        (STUB, f"def {name}(*args):\n    raise NotImplementedError\n"),
        (SYNTAX_ERROR, f"{head}\n{body}"),
    )


VARIANTS: dict[str, tuple[tuple[str, str], ...]] = {f: _variants(f, spec) for f, spec in _SPECS.items()}


def _cut_in_header(rng: np.random.Generator, text: str) -> str:
    """A response cut off inside its ``def`` line: a prefix that can define no function."""
    header = text[: text.index("\n")]
    return text[: int(rng.integers(1, len(header) + 1))]


def _tests(name: str, cases: Cases, expected: list[Any]) -> str:
    lines = [f"def test_{name}():"]
    lines += [
        f"    assert {name}({', '.join(map(repr, args))}) == {want!r}"
        for args, want in zip(cases, expected, strict=True)
    ]
    return "\n".join(lines) + f"\n\n\ntest_{name}()\n"


def generate(
    rng: np.random.Generator,
    family: str,
    level: int,
    quality: npt.NDArray[np.float64],
    truncated: npt.NDArray[np.bool_],
) -> GroupContent:
    """One function to write, its unit tests, and a candidate per sample (right with quality[i])."""
    spec, variants = _SPECS[family], VARIANTS[family]
    cases = spec.cases(rng, level)
    expected = [spec.reference(*args) for args in cases]
    n = len(quality)
    picks = np.where(
        rng.random(n) < quality, 0, 1 + rng.choice(len(_WRONG_WEIGHTS), size=n, p=_WRONG_WEIGHTS)
    )
    responses: list[str] = []
    scores: list[float] = []
    notes: list[dict[str, str]] = []
    for pick, cut_off in zip(picks.tolist(), truncated.tolist(), strict=True):
        candidate, text = variants[pick]
        responses.append(_cut_in_header(rng, text) if cut_off else text)
        scores.append(1.0 if pick == 0 and not cut_off else 0.0)
        notes.append({"candidate": candidate})
    return GroupContent(
        prompt=spec.prompt,
        responses=responses,
        scores=scores,
        fields={"unit_tests": _tests(spec.reference.__name__, cases, expected)},
        sample_metadata=notes,
    )
