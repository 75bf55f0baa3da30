"""The code task families: a reference solution, two known bugs, and test cases that catch them.

A bug is a `Mutation` of the reference's source text. Each one names the test case that catches
it (`caught_by`, an index into the cases) and says why; every family's case generator always
makes that case. So whether a candidate passes its unit tests is known when it is chosen, and
no candidate is ever run to find out.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from producers.tasks import code_solutions as sol

Cases = list[tuple[Any, ...]]

_WORDS = ("alpha", "beta", "gamma", "delta", "kappa", "sigma", "omega", "tau", "rho", "zeta")
_PRIMES = (2, 3, 5, 7, 11, 13)


@dataclass(frozen=True)
class Mutation:
    """A bug: `old` replaced by `new` in the reference's source (`old` occurs there once).

    Attributes:
        slug: the bug's name, recorded with each candidate as ``bug:<slug>``.
        old: the reference text the bug replaces.
        new: what replaces it.
        caught_by: index of the case on which the buggy function returns a wrong value or raises.
        why: what the buggy function does on that case.
    """

    slug: str
    old: str
    new: str
    caught_by: int
    why: str


@dataclass(frozen=True)
class CodeFamily:
    """One function to write: its prompt, reference solution, bugs and case generator."""

    prompt: str
    reference: Callable[..., Any]
    bugs: tuple[Mutation, ...]
    cases: Callable[[np.random.Generator, int], Cases]


def _ints(rng: np.random.Generator, lo: int, hi: int, n: int) -> list[int]:
    return [int(v) for v in rng.integers(lo, hi, size=n)]


def _text(rng: np.random.Generator, n: int) -> str:
    words = [str(rng.choice(_WORDS)) for _ in range(n)]
    return " ".join(w.upper() if rng.random() < 0.3 else w for w in words)


def _clamp_cases(rng: np.random.Generator, level: int) -> Cases:
    lo = int(rng.integers(-50, 50))
    hi = lo + int(rng.integers(1, 100))
    below, above = lo - int(rng.integers(1, 20)), hi + int(rng.integers(1, 20))
    return [(below, lo, hi), (above, lo, hi)] + [(x, lo, hi) for x in _ints(rng, lo, hi + 1, level)]


def _vowel_cases(rng: np.random.Generator, level: int) -> Cases:
    return [(_text(rng, 2) + " ANY",), ("rhythm " + _text(rng, 1),)] + [
        (_text(rng, 1 + level),) for _ in range(level)
    ]


def _palindrome_cases(rng: np.random.Generator, level: int) -> Cases:
    word = str(rng.choice(_WORDS))
    cases: Cases = [(word.capitalize() + " " + word[::-1],), (word + word[::-1],), (word + "x" + word,)]
    return cases + [(_text(rng, 2),) for _ in range(level)]


def _running_sum_cases(rng: np.random.Generator, level: int) -> Cases:
    return [(_ints(rng, 1, 50, int(rng.integers(2, 4 + 2 * level))),) for _ in range(2 + level)]


def _second_largest_cases(rng: np.random.Generator, level: int) -> Cases:
    cases: Cases = []
    for _ in range(2 + level):
        xs = [int(v) for v in rng.choice(100, size=4 + level, replace=False)]
        xs.append(max(xs))
        cases.append(([int(v) for v in rng.permutation(xs)],))
    return cases


def _fizzbuzz_cases(rng: np.random.Generator, level: int) -> Cases:
    k = int(rng.integers(1, 20))
    return [(15 * k,), (3 * (5 * k + 1),), (5 * (3 * k + 1),), (15 * k + 1,)] + [
        (v,) for v in _ints(rng, 1, 200, level)
    ]


def _fibonacci_cases(rng: np.random.Generator, level: int) -> Cases:
    return [(0,), (int(rng.integers(2, 6)),)] + [(v,) for v in _ints(rng, 6, 12 + 8 * level, level)]


def _word_count_cases(rng: np.random.Generator, level: int) -> Cases:
    words = [str(rng.choice(_WORDS[:4])) for _ in range(4 + level)]
    return [("  ".join(words),), (" ".join(words),), (" ".join(words[: 2 + level]) + " " + words[0],)]


def _gcd_cases(rng: np.random.Generator, level: int) -> Cases:
    p, q = (int(v) for v in rng.choice(_PRIMES, size=2, replace=False))
    g = int(rng.integers(2, 30))
    cases: Cases = [(g * p, g * q)]
    for _ in range(1 + level):
        g = int(rng.integers(2, 30))
        a, b = (int(v) for v in rng.choice(np.arange(2, 40), size=2, replace=False))
        cases.append((g * a * 2, g * b * 3))
    return cases


def _digit_sum_cases(rng: np.random.Generator, level: int) -> Cases:
    return [
        (-int(rng.integers(10, 10**4)),),
        (9 * int(rng.integers(2, 10 ** (2 + level))),),
        (int(rng.integers(10**3, 10 ** (4 + level))),),
        (7,),
    ]


FAMILIES: dict[str, CodeFamily] = {
    "clamp": CodeFamily(
        "Write clamp(x, lo, hi) that limits x to the closed interval [lo, hi].",
        sol.clamp,
        (
            Mutation("swapped-min-max", "max(lo, min(x, hi))", "min(lo, max(x, hi))", 1, "gives lo, not hi"),
            Mutation(
                "no-upper-bound",
                "    return max(lo, min(x, hi))\n",
                "    if x < lo:\n        return lo\n    return x\n",
                1,
                "gives x, which is above hi",
            ),
        ),
        _clamp_cases,
    ),
    "count-vowels": CodeFamily(
        "Write count_vowels(s) returning how many of a, e, i, o, u (any case) s contains.",
        sol.count_vowels,
        (
            Mutation("case-sensitive", "s.lower()", "s", 0, "misses the A of 'ANY'"),
            Mutation("counts-y", '"aeiou"', '"aeiouy"', 1, "counts the y of 'rhythm'"),
        ),
        _vowel_cases,
    ),
    "is-palindrome": CodeFamily(
        "Write is_palindrome(s): True when s reads the same backwards, ignoring case and non-alphanumerics.",
        sol.is_palindrome,
        (
            Mutation(
                "no-normalising",
                "    chars = [ch.lower() for ch in s if ch.isalnum()]\n    return chars == chars[::-1]\n",
                "    return s == s[::-1]\n",
                0,
                "'Alpha ahpla' reversed is 'alpha ahplA': False",
            ),
            Mutation("case-sensitive", "[ch.lower() for", "[ch for", 0, "'A' differs from 'a': False"),
        ),
        _palindrome_cases,
    ),
    "running-sum": CodeFamily(
        "Write running_sum(xs) returning the list of prefix sums of xs.",
        sol.running_sum,
        (
            Mutation(
                "appends-before-adding",
                "        total += x\n        out.append(total)\n",
                "        out.append(total)\n        total += x\n",
                0,
                "starts with 0, not xs[0] >= 1",
            ),
            Mutation(
                "exclusive-prefix",
                "    total = 0\n    out = []\n    for x in xs:\n        total += x\n"
                "        out.append(total)\n    return out\n",
                "    return [sum(xs[:i]) for i in range(len(xs))]\n",
                0,
                "starts with 0, not xs[0] >= 1",
            ),
        ),
        _running_sum_cases,
    ),
    "second-largest": CodeFamily(
        "Write second_largest(xs) returning the second largest distinct value in xs.",
        sol.second_largest,
        (
            Mutation("keeps-duplicates", "sorted(set(xs))", "sorted(xs)", 0, "the maximum appears twice"),
            Mutation("second-smallest", "[-2]", "[1]", 0, "with 4+ distinct values index 1 is not -2"),
        ),
        _second_largest_cases,
    ),
    "fizzbuzz": CodeFamily(
        "Write fizzbuzz(n): 'FizzBuzz' for multiples of 15, 'Fizz' of 3, 'Buzz' of 5, else str(n).",
        sol.fizzbuzz,
        (
            Mutation(
                "fizz-first",
                '    if n % 15 == 0:\n        return "FizzBuzz"\n    if n % 3 == 0:\n        return "Fizz"\n'
                '    if n % 5 == 0:\n        return "Buzz"\n',
                '    if n % 3 == 0:\n        return "Fizz"\n    if n % 5 == 0:\n        return "Buzz"\n'
                '    if n % 15 == 0:\n        return "FizzBuzz"\n',
                0,
                "gives 'Fizz' for a multiple of 15",
            ),
            Mutation("returns-int", "return str(n)", "return n", 3, "15k + 1 comes back as an int"),
        ),
        _fizzbuzz_cases,
    ),
    "fibonacci": CodeFamily(
        "Write fibonacci(n) returning the n-th Fibonacci number, with fibonacci(0) == 0.",
        sol.fibonacci,
        (
            Mutation("starts-at-one", "a, b = 0, 1", "a, b = 1, 1", 0, "fibonacci(0) gives 1"),
            Mutation(
                "off-by-one-loop",
                "    for _ in range(n):\n        a, b = b, a + b\n    return a\n",
                "    for _ in range(n - 1):\n        a, b = b, a + b\n    return b\n",
                0,
                "fibonacci(0) gives 1",
            ),
        ),
        _fibonacci_cases,
    ),
    "word-count": CodeFamily(
        "Write word_count(s) returning a dict from each whitespace-separated word to its count.",
        sol.word_count,
        (
            Mutation("splits-on-single-space", "s.split()", 's.split(" ")', 0, "double spaces count ''"),
            Mutation(
                "ignores-repeats",
                "    counts: dict[str, int] = {}\n    for word in s.split():\n"
                "        counts[word] = counts.get(word, 0) + 1\n    return counts\n",
                "    return {word: 1 for word in s.split()}\n",
                2,
                "the first word is repeated",
            ),
        ),
        _word_count_cases,
    ),
    "gcd": CodeFamily(
        "Write gcd(a, b) returning the greatest common divisor of two positive integers.",
        sol.gcd,
        (
            Mutation("returns-remainder", "return a", "return b", 0, "the loop ends with b == 0"),
            Mutation(
                "min-not-gcd",
                "    while b:\n        a, b = b, a % b\n    return a\n",
                "    return min(a, b)\n",
                0,
                "g*p and g*q, p != q primes: the gcd is g, the min at least 2g",
            ),
        ),
        _gcd_cases,
    ),
    "digit-sum": CodeFamily(
        "Write digit_sum(n) returning the sum of the decimal digits of the integer n (sign ignored).",
        sol.digit_sum,
        (
            Mutation("keeps-sign", "str(abs(n))", "str(n)", 0, "int('-') raises on a negative n"),
            Mutation(
                "mod-nine",
                "sum(int(d) for d in str(abs(n)))",
                "n % 9",
                1,
                "a positive multiple of 9 has digit sum >= 9 but n % 9 == 0",
            ),
        ),
        _digit_sum_cases,
    ),
}
