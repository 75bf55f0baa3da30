"""Code prompts: write one small Python function; ``unit_tests`` checks it with plain asserts.

The sandbox contract: run ``response_text`` followed by ``unit_tests`` in one Python process;
exit status 0 means every test passed. The tests also collect under pytest. Expected values
come from a reference implementation, and each sample's score from actually running it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from producers.tasks.base import GroupContent, cut

Cases = list[tuple[Any, ...]]

_WORDS = ("alpha", "beta", "gamma", "delta", "kappa", "sigma", "omega", "tau", "rho", "zeta")


@dataclass(frozen=True)
class _Function:
    name: str
    prompt: str
    correct: str
    bugs: tuple[str, ...]
    cases: Callable[[np.random.Generator, int], Cases]


def _ints(rng: np.random.Generator, lo: int, hi: int, n: int) -> list[int]:
    return [int(v) for v in rng.integers(lo, hi, size=n)]


def _clamp_cases(rng: np.random.Generator, level: int) -> Cases:
    lo = int(rng.integers(-50, 50))
    hi = lo + int(rng.integers(1, 100))
    inside = [int(rng.integers(lo, hi + 1)) for _ in range(level)]
    return [(lo - int(rng.integers(1, 20)), lo, hi), (hi + int(rng.integers(1, 20)), lo, hi)] + [
        (x, lo, hi) for x in inside
    ]


def _text(rng: np.random.Generator, n: int) -> str:
    words = [str(rng.choice(_WORDS)) for _ in range(n)]
    return " ".join(w.upper() if rng.random() < 0.3 else w for w in words)


def _vowel_cases(rng: np.random.Generator, level: int) -> Cases:
    return [(_text(rng, 2) + " ANY",), ("rhythm " + _text(rng, 1),)] + [
        (_text(rng, 1 + level),) for _ in range(level)
    ]


def _palindrome_cases(rng: np.random.Generator, level: int) -> Cases:
    word = str(rng.choice(_WORDS))
    mixed = word.capitalize() + " " + word[::-1]
    cases: Cases = [(mixed,), (word + word[::-1],), (word + "x" + word,)]
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
        (int(v),) for v in rng.integers(1, 200, size=level)
    ]


def _fibonacci_cases(rng: np.random.Generator, level: int) -> Cases:
    return [(0,), (int(rng.integers(2, 6)),)] + [
        (int(v),) for v in rng.integers(6, 12 + 8 * level, size=level)
    ]


def _word_count_cases(rng: np.random.Generator, level: int) -> Cases:
    words = [str(rng.choice(_WORDS[:4])) for _ in range(4 + level)]
    return [("  ".join(words),), (" ".join(words),), (" ".join(words[: 2 + level]) + " " + words[0],)]


def _gcd_cases(rng: np.random.Generator, level: int) -> Cases:
    cases: Cases = []
    for _ in range(2 + level):
        g = int(rng.integers(2, 30))
        a, b = (int(v) for v in rng.choice(np.arange(2, 40), size=2, replace=False))
        cases.append((g * a * 2, g * b * 3))
    return cases


def _digit_sum_cases(rng: np.random.Generator, level: int) -> Cases:
    return [(-int(rng.integers(10, 10**4)),), (int(rng.integers(10**3, 10 ** (4 + level))),), (7,)]


FUNCTIONS: dict[str, _Function] = {
    f.name.replace("_", "-"): f
    for f in (
        _Function(
            "clamp",
            "Write clamp(x, lo, hi) that limits x to the closed interval [lo, hi].",
            "def clamp(x, lo, hi):\n    return max(lo, min(x, hi))\n",
            (
                "def clamp(x, lo, hi):\n    return min(lo, max(x, hi))\n",
                "def clamp(x, lo, hi):\n    if x < lo:\n        return lo\n    return x\n",
            ),
            _clamp_cases,
        ),
        _Function(
            "count_vowels",
            "Write count_vowels(s) returning how many of a, e, i, o, u (any case) s contains.",
            'def count_vowels(s):\n    return sum(1 for ch in s.lower() if ch in "aeiou")\n',
            (
                'def count_vowels(s):\n    return sum(1 for ch in s if ch in "aeiou")\n',
                'def count_vowels(s):\n    return sum(1 for ch in s.lower() if ch in "aeiouy")\n',
            ),
            _vowel_cases,
        ),
        _Function(
            "is_palindrome",
            "Write is_palindrome(s): True when s reads the same backwards, ignoring case and non-alphanumerics.",
            "def is_palindrome(s):\n    chars = [ch.lower() for ch in s if ch.isalnum()]\n"
            "    return chars == chars[::-1]\n",
            (
                "def is_palindrome(s):\n    return s == s[::-1]\n",
                "def is_palindrome(s):\n    chars = [ch for ch in s if ch.isalnum()]\n"
                "    return chars == chars[::-1]\n",
            ),
            _palindrome_cases,
        ),
        _Function(
            "running_sum",
            "Write running_sum(xs) returning the list of prefix sums of xs.",
            "def running_sum(xs):\n    total = 0\n    out = []\n    for x in xs:\n"
            "        total += x\n        out.append(total)\n    return out\n",
            (
                "def running_sum(xs):\n    total = 0\n    out = []\n    for x in xs:\n"
                "        out.append(total)\n        total += x\n    return out\n",
                "def running_sum(xs):\n    return [sum(xs[:i]) for i in range(len(xs))]\n",
            ),
            _running_sum_cases,
        ),
        _Function(
            "second_largest",
            "Write second_largest(xs) returning the second largest distinct value in xs.",
            "def second_largest(xs):\n    return sorted(set(xs))[-2]\n",
            (
                "def second_largest(xs):\n    return sorted(xs)[-2]\n",
                "def second_largest(xs):\n    return sorted(set(xs))[1]\n",
            ),
            _second_largest_cases,
        ),
        _Function(
            "fizzbuzz",
            "Write fizzbuzz(n): 'FizzBuzz' for multiples of 15, 'Fizz' of 3, 'Buzz' of 5, else str(n).",
            'def fizzbuzz(n):\n    if n % 15 == 0:\n        return "FizzBuzz"\n    if n % 3 == 0:\n'
            '        return "Fizz"\n    if n % 5 == 0:\n        return "Buzz"\n    return str(n)\n',
            (
                'def fizzbuzz(n):\n    if n % 3 == 0:\n        return "Fizz"\n    if n % 5 == 0:\n'
                '        return "Buzz"\n    if n % 15 == 0:\n        return "FizzBuzz"\n    return str(n)\n',
                'def fizzbuzz(n):\n    if n % 15 == 0:\n        return "FizzBuzz"\n    if n % 3 == 0:\n'
                '        return "Fizz"\n    if n % 5 == 0:\n        return "Buzz"\n    return n\n',
            ),
            _fizzbuzz_cases,
        ),
        _Function(
            "fibonacci",
            "Write fibonacci(n) returning the n-th Fibonacci number, with fibonacci(0) == 0.",
            "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n",
            (
                "def fibonacci(n):\n    a, b = 1, 1\n    for _ in range(n):\n        a, b = b, a + b\n"
                "    return a\n",
                "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n - 1):\n        a, b = b, a + b\n"
                "    return b\n",
            ),
            _fibonacci_cases,
        ),
        _Function(
            "word_count",
            "Write word_count(s) returning a dict from each whitespace-separated word to its count.",
            "def word_count(s):\n    counts = {}\n    for word in s.split():\n"
            "        counts[word] = counts.get(word, 0) + 1\n    return counts\n",
            (
                'def word_count(s):\n    counts = {}\n    for word in s.split(" "):\n'
                "        counts[word] = counts.get(word, 0) + 1\n    return counts\n",
                "def word_count(s):\n    return {word: 1 for word in s.split()}\n",
            ),
            _word_count_cases,
        ),
        _Function(
            "gcd",
            "Write gcd(a, b) returning the greatest common divisor of two positive integers.",
            "def gcd(a, b):\n    while b:\n        a, b = b, a % b\n    return a\n",
            (
                "def gcd(a, b):\n    while b:\n        a, b = b, a % b\n    return b\n",
                "def gcd(a, b):\n    return min(a, b)\n",
            ),
            _gcd_cases,
        ),
        _Function(
            "digit_sum",
            "Write digit_sum(n) returning the sum of the decimal digits of the integer n (sign ignored).",
            "def digit_sum(n):\n    return sum(int(d) for d in str(abs(n)))\n",
            (
                "def digit_sum(n):\n    return sum(int(d) for d in str(n))\n",
                "def digit_sum(n):\n    return n % 9\n",
            ),
            _digit_sum_cases,
        ),
    )
}
FAMILIES = tuple(FUNCTIONS)


def _compile(source: str, name: str) -> Callable[..., Any] | None:
    namespace: dict[str, Any] = {}
    try:
        exec(compile(source, f"<synthetic {name}>", "exec"), namespace)
    except Exception:
        return None
    fn = namespace.get(name)
    return fn if callable(fn) else None


def _passes(fn: Callable[..., Any] | None, cases: Cases, expected: list[Any]) -> bool:
    if fn is None:
        return False
    try:
        return all(fn(*args) == want for args, want in zip(cases, expected, strict=True))
    except Exception:
        return False


def _variants(spec: _Function) -> tuple[str, ...]:
    stub = f"def {spec.name}(*args):\n    raise NotImplementedError\n"
    head, _, body = spec.correct.partition(":\n")
    return (spec.correct, *spec.bugs, stub, f"{head}\n{body}")


_VARIANTS = {family: _variants(spec) for family, spec in FUNCTIONS.items()}
_COMPILED = {
    family: tuple(_compile(src, FUNCTIONS[family].name) for src in sources)
    for family, sources in _VARIANTS.items()
}
# A wrong sample is one of the family's bugs most of the time, else a stub or a syntax error.
_WRONG_WEIGHTS = np.array([0.4, 0.4, 0.1, 0.1])


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
    spec = FUNCTIONS[family]
    sources, compiled = _VARIANTS[family], _COMPILED[family]
    reference = compiled[0]
    assert reference is not None
    cases = spec.cases(rng, level)
    expected = [reference(*args) for args in cases]
    passing = [_passes(fn, cases, expected) for fn in compiled]
    n = len(quality)
    picks = np.where(
        rng.random(n) < quality, 0, 1 + rng.choice(len(_WRONG_WEIGHTS), size=n, p=_WRONG_WEIGHTS)
    )
    responses: list[str] = []
    scores: list[float] = []
    for pick, cut_off in zip(picks.tolist(), truncated.tolist(), strict=True):
        text = sources[pick]
        ok = passing[pick]
        if cut_off:
            text = cut(rng, text)
            ok = _passes(_compile(text, spec.name), cases, expected)
        responses.append(text)
        scores.append(1.0 if ok else 0.0)
    return GroupContent(
        prompt=spec.prompt,
        responses=responses,
        scores=scores,
        fields={"unit_tests": _tests(spec.name, cases, expected)},
    )
