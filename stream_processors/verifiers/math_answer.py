"""Math: the response's final answer against `expected_answer`, tolerant of how it is written.

Checked in order, the first that decides wins: the same text after LaTeX clean-up (``\\boxed``,
``\\dfrac``, ``\\left``, ``\\text{...}``, ``$``, a leading ``x =``); the same number (1/2 and
0.5, thousands separators, ``\\frac{1}{2}``, a trailing unit or percent sign) within the
relative `tolerance`; tuples element by element; then sympy's symbolic equality, bounded in time
(symbolic.py). A check that runs out of time is a "timeout" verdict.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from stream_processors.exceptions import VerifierInputError
from stream_processors.verifiers.base import Verdict, Verifier
from stream_processors.verifiers.exact_answer import final_answer
from stream_processors.verifiers.normalize import Remembered, exact, parse_number, parse_quantity
from stream_processors.verifiers.symbolic import NAMES, SymbolicChecker

_DROP = ("\\left", "\\right", "\\!", "\\,", "\\;", "\\:", "\\displaystyle", "$", "^\\circ", "^{\\circ}", "°")
_TEXT = re.compile(r"\\(?:text|textbf|mathrm|mathbf|operatorname|mbox)\s*\{([^{}]*)\}")
_FRAC = re.compile(r"\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}")
_FRAC_SHORT = re.compile(r"\\[dt]?frac\s*(\d)\s*(\d)")
_SQRT_N = re.compile(r"\\sqrt\s*\[([^\]]*)\]\s*\{([^{}]*)\}")
_SQRT = re.compile(r"\\sqrt\s*\{([^{}]*)\}")
_ASSIGN = re.compile(r"^[a-zA-Z]\s*=\s*(?=[^=])")
_SPACES = re.compile(r"\s+")
_TRAILING_WORDS = re.compile(r"^([-+]?[\d.,/ ]*\d)\s*(?:[a-zA-Z][a-zA-Z ]*|%)$")
_SCALE_WORDS = frozenset({"thousand", "million", "billion", "trillion"})
_SYMBOLS = {"\\cdot": "*", "\\times": "*", "\\pi": "pi", "\\infty": "oo", "\\ln": "log", "\\log": "log",
            "\\sin": "sin", "\\cos": "cos", "\\tan": "tan", "\\exp": "exp", "\\div": "/"}  # fmt: skip


@Remembered
def clean_latex(answer: str) -> str:
    """The answer without LaTeX decoration, fractions and roots as plain expressions."""
    text = answer.strip().rstrip(".").strip()
    for token in _DROP:
        text = text.replace(token, "")
    text = text.replace("\\%", "%").replace("\\{", "{").replace("\\}", "}")
    if "\\" in text:  # every pattern and symbol below starts with a backslash
        previous = None
        while previous != text:
            previous = text
            text = _TEXT.sub(r"\1", text)
            text = _FRAC.sub(r"((\1)/(\2))", text)
            text = _FRAC_SHORT.sub(r"((\1)/(\2))", text)
            text = _SQRT_N.sub(r"((\2)^(1/(\1)))", text)
            text = _SQRT.sub(r"sqrt(\1)", text)
        for latex, plain in _SYMBOLS.items():
            text = text.replace(latex, f" {plain} " if plain.isalpha() else plain)
    text = text.replace("{", "(").replace("}", ")").replace("\\", "")
    text = _ASSIGN.sub("", text.strip())
    return _SPACES.sub(" ", text).strip()


@Remembered
def as_number(text: str) -> Fraction | None:
    """An exact number from '0.5', '1,234', '3/4', '((1)/(2))', '-((3)/(4))', '50%', '12 cm', or None."""
    t = (
        text.replace("(", "").replace(")", "").replace(" ", "")
        if re.fullmatch(r"[-+()\d./ ]+", text)
        else text
    )
    if (value := parse_number(t)) is not None:
        return value
    if m := re.fullmatch(r"([-+]?\d+(?:\.\d+)?)/(\d+(?:\.\d+)?)", t):
        denominator = Fraction(m[2])
        return Fraction(m[1]) / denominator if denominator else None
    m = _TRAILING_WORDS.match(text)
    rest = text[len(m[1]) :].strip().lower() if m else ""
    if m and rest not in _SCALE_WORDS and not set(rest.split()) & NAMES:
        return as_number(m[1]) if m[1] != text else None  # a trailing unit or percent sign
    quantity = parse_quantity(text)  # "$5", "1.2 million"
    return quantity.value if quantity is not None else None


def _split_tuple(text: str) -> list[str] | None:
    inner = text[1:-1] if text[:1] in "([" and text[-1:] in ")]" else text
    parts, depth, current = [], 0, ""
    for ch in inner:
        depth += ch in "(["
        depth -= ch in ")]"
        if ch == "," and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += ch
    parts.append(current.strip())
    return parts if len(parts) > 1 and all(parts) else None


class MathVerifier(Verifier):
    """Reward 1.0 when the final answer equals `expected_answer` (see the module), else 0.0.

    Args:
        tolerance: relative tolerance for numeric answers.
        symbolic: whether to try sympy when the cheap checks do not decide.
        checker: the symbolic checker (its timeout bounds each check); shared across domains.
    """

    name = "math"
    version = "2.0.0"

    def __init__(
        self, *, tolerance: float = 1e-6, symbolic: bool = True, checker: SymbolicChecker | None = None
    ) -> None:
        self.tolerance = tolerance
        self.symbolic = symbolic
        self.checker = checker or SymbolicChecker()

    def verify(self, record: Mapping[str, Any]) -> Verdict:
        """Judge a math trajectory; raises VerifierInputError if expected_answer is missing."""
        expected = record.get("expected_answer")
        if expected is None:
            raise VerifierInputError(
                f"math trajectory {record.get('trajectory_id')!r} has expected_answer=None: "
                "math producers must send the exact answer to compare with"
            )
        got = final_answer(record.get("response_text") or "")
        result, how = self.compare(got, expected)
        if result == "equal":
            return self.verdict(1.0, "ok", None, {"correct": 1.0})
        if result == "timeout":
            return self.verdict(0.0, "timeout", f"symbolic check exceeded {self.checker.timeout_s:g} s", {})
        return self.verdict(
            0.0, "fail", f"{got[:80]!r} != expected {expected[:80]!r} ({how})", {"correct": 0.0}
        )

    def compare(self, got: str, expected: str) -> tuple[str, str]:
        """("equal" | "different" | "timeout", which check decided)."""
        a, b = clean_latex(got), clean_latex(expected)
        if not a:
            return "different", "no answer"
        if a.casefold() == b.casefold():
            return "equal", "text"
        na, nb = as_number(a), as_number(b)
        if na is not None and nb is not None:
            # integers and fractions compare exactly; the tolerance is for written decimals
            decimal = any(re.search(r"\d\.\d|\de", t) for t in (a, b))
            close = abs(na - nb) <= exact(self.tolerance) * max(abs(na), abs(nb))
            same = na == nb or (decimal and close)
            return ("equal" if same else "different"), "numeric"
        ta, tb = _split_tuple(a), _split_tuple(b)
        if ta is not None and tb is not None:
            if len(ta) != len(tb):
                return "different", "tuple length"
            for x, y in zip(ta, tb, strict=True):
                result, how = self.compare(x, y)
                if result != "equal":
                    return result, f"tuple element: {how}"
            return "equal", "tuple"
        if self.symbolic and (ta is None) == (tb is None):
            result = self.checker.equal(a.replace("^", "**"), b.replace("^", "**"), self.tolerance)
            if result in ("equal", "timeout"):
                return result, "symbolic"
            return "different", f"symbolic: {result}"
        return "different", "text"
