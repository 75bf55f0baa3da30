"""The math verifier on tricky answers: formatting, LaTeX, numbers, symbols, hostile input."""

from __future__ import annotations

import pytest

from stream_processors.verifiers import MathVerifier
from stream_processors.verifiers.math_answer import as_number, clean_latex
from stream_processors.verifiers.normalize import MEMO_MAX_CHARS

pytestmark = pytest.mark.timeout(120)

CASES = [
    # (response's final answer, expected, equal?)
    ("\\boxed{0.5}", "1/2", True),
    ("\\boxed{\\frac{1}{2}}", "0.5", True),
    ("\\boxed{\\dfrac{3}{4}}", "\\frac34", True),
    ("\\boxed{\\tfrac{3}{4}}", "0.75", True),
    ("\\boxed{1,000,000}", "1000000", True),
    ("\\boxed{1{,}000}", "1000", False),
    ("\\boxed{12 cm}", "12", True),
    ("\\boxed{12\\text{ cm}}", "12", True),
    ("\\boxed{50\\%}", "50", True),
    ("\\boxed{-\\frac{3}{4}}", "-0.75", True),
    ("\\boxed{33860600}", "33860590", False),
    ("\\boxed{3.1416}", "3.14159265", False),
    ("\\boxed{3.141592}", "3.14159265", True),
    ("\\boxed{0.3333333333}", "1/3", True),
    ("\\boxed{\\sqrt{8}}", "2\\sqrt{2}", True),
    ("\\boxed{x^2+2x+1}", "(x+1)^2", True),
    ("\\boxed{x^2+2x}", "(x+1)^2", False),
    ("\\boxed{\\pi}", "pi", True),
    ("\\boxed{2\\pi}", "6.283185307", True),
    ("\\boxed{(1, 2)}", "(1,2)", True),
    ("\\boxed{(2, 1)}", "(1,2)", False),
    ("\\boxed{\\left( 1, \\frac{1}{2} \\right)}", "(1, 0.5)", True),
    ("Answer: x = 7", "7", True),
    ("The answer is 7.\nAnswer: 8", "7", False),
    ("\\boxed{\\boxed{5}}", "5", True),
    ("\\boxed{$5$}", "5", True),
    ("\\boxed{5.}", "5", True),
    ("\\boxed{1.5e3}", "1500", True),
    ("\\boxed{-0}", "0", True),
    ("\\boxed{}", "0", False),
    ("no answer here", "42", False),
    ("\\boxed{\\frac{\\sqrt{3}}{2}}", "sin(pi/3)", True),
    ("\\boxed{e^{i\\pi}}", "-1", True),
    ("\\boxed{__import__('os').system('true')}", "0", False),
    ("\\boxed{9^9^9^9}", "1", False),  # symbolic time bound: "timeout", never a hang
    ("\\boxed{90^\\circ}", "90", True),
    ("\\boxed{\\$5}", "5", True),
    ("\\boxed{1.2 million}", "1200000", True),
]


@pytest.fixture(name="verifier", scope="module")
def verifier_fixture():
    verifier = MathVerifier(tolerance=1e-6)
    yield verifier
    verifier.checker.close()


@pytest.mark.parametrize(("response", "expected", "equal"), CASES)
def test_math_answers(verifier, response, expected, equal):
    verdict = verifier.verify({"trajectory_id": "t", "response_text": response, "expected_answer": expected})
    assert (verdict.reward == 1.0) == equal, verdict.detail
    assert verdict.status in (("ok",) if equal else ("fail", "timeout"))
    assert verdict.verifier == "math" and verdict.verifier_version == "2.0.0"


def test_a_hostile_expression_is_bounded_in_time(verifier):
    verdict = verifier.verify(
        {"trajectory_id": "t", "response_text": "\\boxed{9^9^9^9}", "expected_answer": "1"}
    )
    assert verdict.status == "timeout" and verdict.reward == 0.0
    # the checker recovers: the next check gets a fresh helper
    assert verifier.compare("2\\sqrt{2}", "\\sqrt{8}")[0] == "equal"


def test_remembered_readings_give_the_verdicts_of_a_fresh_reading(verifier):
    """clean_latex and as_number remember what they read (a group shares its expected answer):
    the second pass over the cases reads from memory and judges every case the same."""

    def judge_all() -> list[tuple[float, str]]:
        return [
            (v.reward, v.status)
            for v in (
                verifier.verify({"trajectory_id": "t", "response_text": r, "expected_answer": e})
                for r, e, _ in CASES
            )
        ]

    clean_latex.cache_clear()
    as_number.cache_clear()
    fresh = judge_all()
    misses = clean_latex.cache_info().misses
    assert judge_all() == fresh
    assert clean_latex.cache_info().misses == misses and clean_latex.cache_info().hits >= len(CASES)


def test_long_answers_are_read_afresh_and_never_remembered(verifier):
    """Model output is untrusted and can be long: only texts of MEMO_MAX_CHARS or fewer are kept."""
    clean_latex.cache_clear()
    long = "1" * (MEMO_MAX_CHARS + 1)
    for _ in range(3):
        verdict = verifier.verify(
            {"trajectory_id": "t", "response_text": f"\\boxed{{{long}}}", "expected_answer": long}
        )
        assert verdict.status == "ok"
    info = clean_latex.cache_info()
    assert info.currsize == 0 and info.hits == 0
