"""Verifiers: right and wrong answers, bad JSON, missing inputs, and the task_type registry."""

from __future__ import annotations

import math

import pytest

from stream_processors.exceptions import NonFiniteValueError, UnknownTaskTypeError, VerifierInputError
from stream_processors.verifiers import (
    CODE_SKIP_DETAIL,
    ExactAnswerVerifier,
    FieldMatchVerifier,
    PrecomputedVerifier,
    SkippedVerifier,
    Verdict,
    VerifierRegistry,
    default_registry,
    final_answer,
)

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize(
    ("response", "expected", "reward"),
    [
        ("Let me think.\nThe final answer is \\boxed{252}.", "252", 1.0),
        ("Let me think.\nThe final answer is \\boxed{251}.", "252", 0.0),
        ("work...\nAnswer:   3/4  \nthanks", "3/4", 1.0),
        ("answer: X = 7.", "x  =  7", 1.0),
        ("Answer: 1\n...Answer: 2", "1", 0.0),
        ("steps\n\n  Forty Two \n", "forty two", 1.0),
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}", 1.0),
        ("", "0", 0.0),
    ],
)
def test_exact_answer(response, expected, reward):
    verdict = ExactAnswerVerifier().verify({"response_text": response, "expected_answer": expected})
    assert verdict.reward == reward
    assert verdict.status == ("ok" if reward == 1.0 else "fail")
    assert verdict.verifier == "exact_answer"
    assert (verdict.detail is None) == (reward == 1.0)


def test_final_answer_prefers_boxed_then_marker_then_last_line():
    assert final_answer("Answer: 3\nso \\boxed{4}") == "4"
    assert final_answer("Answer: 3\nlast line") == "3"
    assert final_answer("a\nb\n") == "b"


def test_exact_answer_without_expected_answer_is_an_input_error():
    with pytest.raises(VerifierInputError, match="expected_answer=None"):
        ExactAnswerVerifier().verify({"trajectory_id": "t1", "response_text": "42", "expected_answer": None})


@pytest.mark.parametrize(
    ("response", "reward", "status"),
    [
        ('{"name": "Ada", "year": "1815", "city": "London"}', 1.0, "ok"),
        ('{"name": "Ada", "year": 1815, "city": "Paris"}', 2 / 3, "fail"),
        ('{"name": "ada"}', 0.0, "fail"),
        ('{"name": ["Ada"], "year": {"v": "1815"}}', 0.0, "fail"),
    ],
)
def test_field_match(response, reward, status):
    gold = {"name": "Ada", "year": "1815", "city": "London"}
    verdict = FieldMatchVerifier().verify({"response_text": response, "gold_fields": gold})
    assert verdict.reward == pytest.approx(reward)
    assert verdict.status == status


@pytest.mark.parametrize(
    "response",
    ["{'name': 'Ada'}", "__import__('os').system('true')", "", "[1, 2]", '"just a string"', "[" * 100_000],
)
def test_field_match_rejects_what_is_not_a_json_object(response):
    verdict = FieldMatchVerifier().verify({"response_text": response, "gold_fields": {"name": "Ada"}})
    assert verdict == Verdict(0.0, "fail", "field_match", verdict.detail)
    assert verdict.detail


def test_field_match_needs_gold_fields():
    with pytest.raises(VerifierInputError, match="gold_fields"):
        FieldMatchVerifier().verify({"response_text": "{}", "gold_fields": {}})


def test_precomputed_reward_is_taken_as_is_and_must_be_finite():
    assert PrecomputedVerifier().verify({"precomputed_reward": 0.25}) == Verdict(0.25, "ok", "precomputed")
    with pytest.raises(NonFiniteValueError, match="nan"):
        PrecomputedVerifier().verify({"precomputed_reward": math.nan})
    with pytest.raises(NonFiniteValueError, match="inf"):
        PrecomputedVerifier().verify({"precomputed_reward": -math.inf})
    with pytest.raises(VerifierInputError, match="precomputed_reward=None"):
        PrecomputedVerifier().verify({"precomputed_reward": None})


def test_code_is_skipped_and_never_executed(tmp_path):
    marker = tmp_path / "executed"
    record = {
        "response_text": f"open({str(marker)!r}, 'w').write('x')",
        "unit_tests": f"open({str(marker)!r}, 'w').write('x')",
    }
    verdict = default_registry()["code"].verify(record)
    assert verdict == Verdict(0.0, "skipped", "skipped", CODE_SKIP_DETAIL)
    assert not marker.exists()


def test_registry_routes_task_types_and_names_unknown_ones():
    registry = default_registry()
    assert isinstance(registry["math"], ExactAnswerVerifier)
    assert isinstance(registry["extraction"], FieldMatchVerifier)
    assert isinstance(registry["precomputed"], PrecomputedVerifier)
    assert isinstance(registry["code"], SkippedVerifier)
    with pytest.raises(UnknownTaskTypeError, match=r"task_type='poetry'.*'code'"):
        registry["poetry"]
    custom = VerifierRegistry()
    custom.register("poetry", SkippedVerifier("no poetry judge"))
    assert custom["poetry"].verify({}).detail == "no poetry judge"
    assert "poetry" not in registry
