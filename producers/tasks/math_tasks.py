"""Math prompts with one exact answer; responses end with ``\\boxed{answer}`` (right or wrong)."""

from __future__ import annotations

from fractions import Fraction
from math import comb, gcd

import numpy as np
import numpy.typing as npt

from producers.tasks.base import GroupContent, cut

FAMILIES = ("arithmetic", "algebra", "number-theory", "combinatorics", "geometry", "probability")


def _problem(rng: np.random.Generator, family: str, level: int) -> tuple[str, str]:
    hi = 10 ** (level + 1)
    a, b, c = (int(v) for v in rng.integers(2, hi, size=3))
    if family == "arithmetic":
        return f"Compute {a} * {b} - {c}.", str(a * b - c)
    if family == "algebra":
        x = int(rng.integers(-hi, hi))
        return f"Solve for x: {a}x + {b} = {a * x + b}.", str(x)
    if family == "number-theory":
        g = int(rng.integers(2, 10 * level + 3))
        return f"What is the greatest common divisor of {a * g} and {b * g}?", str(gcd(a * g, b * g))
    if family == "combinatorics":
        n = int(rng.integers(4, 8 + 6 * level))
        k = int(rng.integers(1, n))
        return f"In how many ways can {k} items be chosen from {n} distinct items?", str(comb(n, k))
    if family == "geometry":
        return f"A right triangle has legs {2 * a} and {b}. What is its area?", str(a * b)
    sides = int(rng.choice([4, 6, 8, 12, 20]))
    k = int(rng.integers(1, sides + 1))
    answer = Fraction(sides - k + 1, sides)
    return (
        f"A fair {sides}-sided die is rolled. What is the probability of rolling at least {k}? "
        "Answer as a reduced fraction.",
        f"{answer.numerator}/{answer.denominator}" if answer.denominator != 1 else "1",
    )


def _wrong(rng: np.random.Generator, answer: str) -> str:
    if "/" in answer:
        num, den = (int(p) for p in answer.split("/"))
        return f"{num + int(rng.integers(1, 4))}/{den}"
    value = int(answer)
    offset = int(rng.choice([-10, -2, -1, 1, 2, 10]))
    return str(value * 2 if rng.random() < 0.2 and value != 0 else value + offset)


def generate(
    rng: np.random.Generator,
    family: str,
    level: int,
    quality: npt.NDArray[np.float64],
    truncated: npt.NDArray[np.bool_],
) -> GroupContent:
    """One math prompt and a response per sample; a sample is right with probability quality[i]."""
    prompt, answer = _problem(rng, family, level)
    right = rng.random(len(quality)) < quality
    responses: list[str] = []
    scores: list[float] = []
    for ok, cut_off in zip(right.tolist(), truncated.tolist(), strict=True):
        given = answer if ok else _wrong(rng, answer)
        text = (
            f"We are asked: {prompt}\nLet me work through it step by step.\n"
            f"The final answer is \\boxed{{{given}}}."
        )
        if cut_off:
            text = cut(rng, text)
        responses.append(text)
        scores.append(1.0 if ok and not cut_off else 0.0)
    return GroupContent(prompt=prompt, responses=responses, scores=scores, fields={"expected_answer": answer})
