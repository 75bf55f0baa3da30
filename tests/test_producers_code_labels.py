"""The fleet's code labels, re-derived without running any candidate or unit test.

A code record names its variant in ``metadata["candidate"]``. This file holds its own table of
every variant: a snippet that marks the variant's text, and a model of what that variant
returns, written here by hand (never taken from the candidate text). The unit tests' calls and
expected values are read from their syntax tree (ast.parse only); nothing is run. A candidate
should score 1 exactly when its model returns every expected value.
"""

from __future__ import annotations

import ast
from collections import Counter, defaultdict
from collections.abc import Callable
from itertools import accumulate
from math import gcd
from typing import Any

import pytest

from producers import SyntheticFleet
from producers.tasks.code_families import FAMILIES as SPECS

pytestmark = pytest.mark.timeout(120)


def _fib(n: int) -> int:
    seq = [0, 1]
    while len(seq) <= n:
        seq.append(seq[-1] + seq[-2])
    return seq[n]


def _digits(n: int) -> int:
    n, total = abs(n), 0
    while n:
        n, digit = divmod(n, 10)
        total += digit
    return total


def _digits_signed(n: int) -> int:
    if n < 0:
        raise ValueError("int('-') raises")
    return _digits(n)


def _alnum(s: str) -> str:
    return "".join(ch for ch in s if ch.isalnum())


def _fizz(n: int) -> str:
    return "Fizz" * (n % 3 == 0) + "Buzz" * (n % 5 == 0) or str(n)


def _count(s: str, letters: str) -> int:
    return sum(s.count(ch) for ch in letters)


Model = Callable[..., Any]
# family -> candidate -> (snippets that together mark the variant's text, what the variant returns)
ORACLE: dict[str, dict[str, tuple[tuple[str, ...], Model]]] = {
    "clamp": {
        "reference": (("max(lo, min(x, hi))",), lambda x, lo, hi: sorted((x, lo, hi))[1]),
        "bug:swapped-min-max": (("min(lo, max(x, hi))",), lambda x, lo, hi: lo),
        "bug:no-upper-bound": (("return x\n",), lambda x, lo, hi: max(x, lo)),
    },
    "count-vowels": {
        "reference": (('s.lower() if ch in "aeiou")',), lambda s: _count(s.lower(), "aeiou")),
        "bug:case-sensitive": (("in s if",), lambda s: _count(s, "aeiou")),
        "bug:counts-y": (('"aeiouy"',), lambda s: _count(s.lower(), "aeiouy")),
    },
    "is-palindrome": {
        "reference": (("ch.lower() for",), lambda s: _alnum(s).lower() == _alnum(s).lower()[::-1]),
        "bug:no-normalising": (("s == s[::-1]",), lambda s: s == s[::-1]),
        "bug:case-sensitive": (("[ch for ch in s if ch.isalnum()]",), lambda s: _alnum(s) == _alnum(s)[::-1]),
    },
    "running-sum": {
        "reference": (("total += x\n        out.append",), lambda xs: list(accumulate(xs))),
        "bug:appends-before-adding": (
            ("out.append(total)\n        total",),
            lambda xs: [0, *accumulate(xs)][:-1],
        ),
        "bug:exclusive-prefix": (("sum(xs[:i])",), lambda xs: [0, *accumulate(xs)][:-1]),
    },
    "second-largest": {
        "reference": (("sorted(set(xs))[-2]",), lambda xs: max(v for v in xs if v != max(xs))),
        "bug:keeps-duplicates": (("sorted(xs)[-2]",), lambda xs: sorted(xs)[-2]),
        "bug:second-smallest": (("sorted(set(xs))[1]",), lambda xs: sorted(set(xs))[1]),
    },
    "fizzbuzz": {
        "reference": (('"FizzBuzz"\n    if n % 3', "return str(n)"), _fizz),
        "bug:fizz-first": (
            ('return "Buzz"\n    if n % 15',),
            lambda n: "Fizz" if n % 3 == 0 else "Buzz" if n % 5 == 0 else str(n),
        ),
        "bug:returns-int": (("return n\n",), lambda n: n if _fizz(n) == str(n) else _fizz(n)),
    },
    "fibonacci": {
        "reference": (("a, b = 0, 1\n    for _ in range(n):",), _fib),
        "bug:starts-at-one": (("a, b = 1, 1",), lambda n: _fib(n + 1)),
        "bug:off-by-one-loop": (("range(n - 1)",), lambda n: 1 if n == 0 else _fib(n)),
    },
    "word-count": {
        "reference": (("for word in s.split():",), lambda s: dict(Counter(s.split()))),
        "bug:splits-on-single-space": (('s.split(" ")',), lambda s: dict(Counter(s.split(" ")))),
        "bug:ignores-repeats": (("{word: 1 for",), lambda s: dict.fromkeys(s.split(), 1)),
    },
    "gcd": {
        "reference": (("a % b\n    return a",), gcd),
        "bug:returns-remainder": (("return b",), lambda a, b: 0),
        "bug:min-not-gcd": (("return min(a, b)",), min),
    },
    "digit-sum": {
        "reference": (("str(abs(n))",), _digits),
        "bug:keeps-sign": (("in str(n)",), _digits_signed),
        "bug:mod-nine": (("return n % 9",), lambda n: n % 9),
    },
}


def _literal(node: ast.expr) -> Any:
    """The value a literal's syntax tree spells (constants, lists, tuples, dicts, negation)."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_literal(node.operand)
    if isinstance(node, ast.List):
        return [_literal(item) for item in node.elts]
    if isinstance(node, ast.Tuple):
        return tuple(_literal(item) for item in node.elts)
    if isinstance(node, ast.Dict) and None not in node.keys:
        return {
            _literal(k): _literal(v) for k, v in zip(node.keys, node.values, strict=True) if k is not None
        }
    raise AssertionError(f"not a literal the generator writes: {ast.dump(node)}")


def _cases(unit_tests: str, name: str) -> list[tuple[tuple[Any, ...], Any]]:
    """(arguments, expected) of each ``assert name(...) == expected`` in the unit tests."""
    test_def, call = ast.parse(unit_tests).body
    assert isinstance(test_def, ast.FunctionDef) and test_def.name == f"test_{name}"
    assert ast.unparse(call) == f"test_{name}()"
    cases = []
    for statement in test_def.body:
        assert isinstance(statement, ast.Assert)
        compare = statement.test
        assert isinstance(compare, ast.Compare) and isinstance(compare.ops[0], ast.Eq)
        assert isinstance(compare.left, ast.Call) and ast.unparse(compare.left.func) == name
        cases.append((tuple(map(_literal, compare.left.args)), _literal(compare.comparators[0])))
    return cases


def _passes(model: Model, cases: list[tuple[tuple[Any, ...], Any]]) -> bool:
    try:
        return all(model(*args) == want for args, want in cases)
    except ValueError:
        return False


@pytest.fixture(scope="module")
def code_records() -> list:
    return [r for r in SyntheticFleet(42).trajectories(8000) if r["task_type"] == "code"]


def _family(record) -> str:
    return record["domain"].removeprefix("code/").rsplit("-", 1)[0]


def test_every_code_label_matches_the_variant_model(code_records):
    texts: dict[tuple[str, str], set[str]] = defaultdict(set)
    for r in code_records:
        family, candidate = _family(r), r["metadata"]["candidate"]
        name = family.replace("-", "_")
        text, score = r["response_text"], float(r["metadata"]["synthetic_score"])
        cases = _cases(r["unit_tests"], name)
        assert _passes(ORACLE[family]["reference"][1], cases), (
            f"{family}: the unit tests expect a wrong value"
        )
        if r["finish_reason"] == "length":
            # Cut inside the def line: one line, no body, so nothing ever defines `name`.
            assert text and (f"def {name}(".startswith(text) or text.startswith(f"def {name}(")), text
            assert "\n" not in text and "return" not in text and "raise" not in text
            assert score == 0.0
            continue
        texts[family, candidate].add(text)
        if candidate == "stub":
            assert "raise NotImplementedError" in text and "return" not in text
            assert score == 0.0
        elif candidate == "syntax-error":
            header = text.split("\n", 1)[0]
            # A def header with balanced brackets that does not end in ':' is a syntax error.
            assert header.startswith(f"def {name}(") and header.count("(") == header.count(")")
            assert header.count("[") == header.count("]") and not header.endswith(":")
            assert score == 0.0
        else:
            assert score == float(_passes(ORACLE[family][candidate][1], cases)), (candidate, r["unit_tests"])
    variants = {(f, c) for f, table in ORACLE.items() for c in (*table, "stub", "syntax-error")}
    assert set(texts) == variants
    assert all(len(seen) == 1 for seen in texts.values())


def test_the_marks_tell_each_variant_apart(code_records):
    """Ties each hand-written model to one text: its marks are in that text and no sibling's."""
    texts = {
        (_family(r), r["metadata"]["candidate"]): r["response_text"]
        for r in code_records
        if r["finish_reason"] == "stop"
    }
    for family, table in ORACLE.items():
        for candidate, (marks, _) in table.items():
            for other in table:
                found = all(mark in texts[family, other] for mark in marks)
                assert found == (other == candidate), (family, candidate, other)


def test_each_bug_fails_on_the_case_named_to_catch_it(code_records):
    checked = 0
    for r in code_records:
        family = _family(r)
        cases = _cases(r["unit_tests"], family.replace("-", "_"))
        for bug in SPECS[family].bugs:
            args, want = cases[bug.caught_by]
            assert not _passes(ORACLE[family][f"bug:{bug.slug}"][1], [(args, want)]), (family, bug.slug)
            checked += 1
    assert checked > 1000
