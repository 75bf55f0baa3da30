"""The extraction verifier: values normalized (numbers, money, percentages, units, dates); F1."""

from __future__ import annotations

import json

import pytest

from stream_processors.verifiers import ExtractionVerifier
from stream_processors.verifiers.normalize import same_value

pytestmark = pytest.mark.timeout(60)

SAME = [
    ("1.2 million", "1,200,000", True),
    ("1.2M", "1200000", True),
    ("$1.2m", "USD 1,200,000", True),
    ("(3.4)", "-3.4", True),
    ("($5.00)", "-$5", True),
    ("\u22123.4", "-3.4", True),  # a unicode minus sign
    ("$1,234.50", "USD 1234.5", True),
    ("1.234,50 €", "EUR 1234.50", True),
    ("€10", "$10", False),
    ("10 GBP", "£10", True),
    ("12.5%", "0.125", True),
    ("12.5%", "12.5", True),
    ("12.5 percent", "12.5%", True),
    ("12.5%", "13%", False),
    ("2.5 kg", "2500 g", True),
    ("2.5 kg", "2.5 km", False),
    ("3 ft", "36 in", True),
    ("90 min", "1.5 hours", True),
    ("1 000 000", "1000000", True),
    ("1.234.567", "1234567", True),
    ("0.125", "1/8", False),
    ("March 5, 2024", "2024-03-05", True),
    ("5 Mar 2024", "2024-03-05", True),
    ("5th March 2024", "2024/03/05", True),
    ("03/05/2024", "2024-03-05", True),
    ("25/12/2024", "2024-12-25", True),
    ("2024-02-30", "2024-03-01", False),
    ("Acme GmbH", "acme  gmbh", True),
    ("Acme GmbH", "Acme Ltd", False),
    ("INV-123456", "INV-123456", True),
    ("INV-123456", "INV-123457", False),
    ("1Z1234567890", "1Z1234567890", True),
    ("42", "42.0", True),
    ("", "0", False),
]


@pytest.mark.parametrize(("a", "b", "same"), SAME)
def test_values_are_normalized(a, b, same):
    assert same_value(a, b) == same
    assert same_value(b, a) == same


@pytest.mark.parametrize(
    ("response", "reward", "status"),
    [
        ({"total": "$1,200,000", "date": "March 5, 2024", "rate": "12.5%"}, 1.0, "ok"),
        ({"total": "1.2 million", "date": "2024-03-05"}, 0.8, "fail"),  # p=1, r=2/3
        ({"total": "1.2 million", "date": "2024-03-06", "rate": "0.125"}, 2 / 3, "fail"),
        ({"total": "1.2 million", "date": "2024-03-05", "rate": "0.125", "extra": "x"}, 6 / 7, "fail"),
        ({}, 0.0, "fail"),
    ],
)
def test_f1_over_fields(response, reward, status):
    gold = {"total": "1200000", "date": "2024-03-05", "rate": "12.5%"}
    verdict = ExtractionVerifier().verify({"response_text": json.dumps(response), "gold_fields": gold})
    assert verdict.reward == pytest.approx(reward)
    assert verdict.status == status
    assert set(verdict.reward_components) == {"precision", "recall", "f1", "matched"}
    assert verdict.reward_components["f1"] == pytest.approx(reward)


@pytest.mark.parametrize("response", ["not json", "[1, 2]", '{"total": ', "[" * 100_000])
def test_a_response_that_is_not_an_object_scores_zero(response):
    verdict = ExtractionVerifier().verify({"response_text": response, "gold_fields": {"total": "1"}})
    assert verdict.reward == 0.0 and verdict.status == "fail"
