"""The synthetic fleet and the malformed-message generator: determinism, shape, labels."""

from __future__ import annotations

import json
import math
import re
import uuid
from collections import Counter, defaultdict

import numpy as np
import pytest

from producers import MALFORMED_KINDS, SEMANTIC_KINDS, FleetConfigError, SyntheticFleet, malformed_messages
from producers.catalog import MAX_TOKENS
from producers.fleet import VOCAB_SIZE
from schemas import DecodeError, TrajectoryCodec, UnknownSchemaError, unpack_float32, unpack_int32

pytestmark = pytest.mark.timeout(120)
TASK_TYPES = {"math", "code", "extraction", "precomputed"}


@pytest.fixture(scope="module")
def codec() -> TrajectoryCodec:
    return TrajectoryCodec()


@pytest.fixture(scope="module")
def records() -> list:
    return list(SyntheticFleet(42).trajectories(4000))


def test_same_seed_gives_identical_bytes_and_other_seed_differs(codec):
    first = [codec.encode(r) for r in SyntheticFleet(7).trajectories(300)]
    again = [codec.encode(r) for r in SyntheticFleet(7).trajectories(300)]
    other = [codec.encode(r) for r in SyntheticFleet(8).trajectories(300)]
    assert first == again
    assert not set(first) & set(other)


def test_calls_continue_the_stream_without_losing_a_group():
    whole = list(SyntheticFleet(3).trajectories(45))
    fleet = SyntheticFleet(3)
    pieces = list(fleet.trajectories(5)) + list(fleet.trajectories(0)) + list(fleet.trajectories(40))
    assert [r["trajectory_id"] for r in pieces] == [r["trajectory_id"] for r in whole]
    assert len(list(SyntheticFleet(3).trajectories(13))) == 13


def test_catalog_has_over_100_domains_of_every_task_type(records):
    domains = SyntheticFleet(0).domains
    assert len(domains) >= 100
    assert len({d.name for d in domains}) == len(domains)
    assert {d.task_type for d in domains} == TASK_TYPES
    assert all(re.fullmatch(r"(math|code|extraction|precomputed)/[a-z-]+-\d{3}", d.name) for d in domains)
    assert math.isclose(sum(d.weight for d in domains), 1.0)
    assert {r["task_type"] for r in records} == TASK_TYPES
    assert len({r["domain"] for r in records}) >= 100


def test_lengths_are_heavy_tailed_and_capped(records):
    response = np.array([len(r["response_tokens"]) // 4 for r in records])
    prompt = np.array([len(r["prompt_tokens"]) // 4 for r in records])
    assert np.percentile(response, 99) / np.median(response) > 4
    assert np.percentile(prompt, 99) / np.median(prompt) > 4
    assert 150 < np.median(prompt) < 600 and 200 < np.median(response) < 800
    assert response.max() > 8000
    assert response.max() <= MAX_TOKENS and prompt.max() <= MAX_TOKENS and response.min() >= 1
    caps = {d.name: d.max_new_tokens for d in SyntheticFleet(0).domains}
    finish = Counter(r["finish_reason"] for r in records)
    assert set(finish) == {"stop", "length"} and finish["stop"] > 0.95 * len(records)
    for r, n in zip(records, response, strict=True):
        assert (r["finish_reason"] == "length") == (n == caps[r["domain"]])


def test_group_structure_and_buffers(records):
    groups: dict[str, list] = defaultdict(list)
    order = []
    for r in records:
        if r["group_id"] not in groups:
            order.append(r["group_id"])
        groups[r["group_id"]].append(r)
    assert len(records) == 4000 and len(groups) == 500
    assert len({r["trajectory_id"] for r in records}) == len(records)
    for group_id in order:
        members = groups[group_id]
        assert [m["sample_index"] for m in members] == list(range(8))
        assert uuid.UUID(group_id).version == 4
        for field in ("group_size", "domain", "task_type", "prompt_tokens", "worker_id", "policy_version"):
            assert len({repr(m[field]) for m in members}) == 1, field
        assert len({repr((m["expected_answer"], m["unit_tests"], m["gold_fields"])) for m in members}) == 1
        assert members[0]["group_size"] == 8
    # Groups arrive one after another, never interleaved.
    assert [r["group_id"] for r in records] == [g for g in order for _ in range(8)]
    for r in records[:400]:
        tokens = unpack_int32(r["response_tokens"])
        logprobs = unpack_float32(r["response_logprobs"])
        assert len(tokens) == len(logprobs)
        assert (logprobs < 0).all() and np.isfinite(logprobs).all()
        assert (tokens >= 0).all() and (tokens < VOCAB_SIZE).all()
        assert uuid.UUID(r["trajectory_id"]).version == 4
        assert r["created_at"].tzinfo is not None


def test_verifier_fields_match_task_type(records):
    for r in records:
        kind = r["task_type"]
        assert (r["expected_answer"] is not None) == (kind == "math")
        assert (r["unit_tests"] is not None) == (kind == "code")
        assert (r["gold_fields"] is not None) == (kind == "extraction")
        assert (r["precomputed_reward"] is not None) == (kind == "precomputed")
        if kind == "precomputed":
            assert math.isfinite(r["precomputed_reward"])


def _check(record) -> float:
    """Score a record the way a correct verifier would, independently of the generators."""
    text = record["response_text"]
    if record["task_type"] == "math":
        boxed = re.findall(r"\\boxed\{([^}]*)\}", text)
        return float(bool(boxed) and boxed[-1] == record["expected_answer"])
    try:
        answer = json.loads(text)
    except ValueError:
        return 0.0
    gold = record["gold_fields"]
    right = sum(answer.get(k) == v for k, v in gold.items())
    precision, recall = (right / len(answer) if answer else 0.0), right / len(gold)
    return 2 * precision * recall / (precision + recall) if right else 0.0


def test_synthetic_scores_are_what_a_verifier_would_give(records):
    checked = Counter()
    for r in records:
        if r["task_type"] == "precomputed":
            assert float(r["metadata"]["synthetic_score"]) == pytest.approx(r["precomputed_reward"], rel=1e-5)
            continue
        if r["task_type"] == "code":
            continue  # never run here: test_producers_code_labels.py re-derives code labels
        assert _check(r) == pytest.approx(float(r["metadata"]["synthetic_score"]), abs=1e-5), r["domain"]
        checked[r["task_type"]] += 1
    assert set(checked) == {"math", "extraction"} and min(checked.values()) > 300
    scores: dict[str, set] = defaultdict(set)
    for r in records:
        scores[r["group_id"]].add(r["metadata"]["synthetic_score"])
    varied = sum(len(s) > 1 for s in scores.values())
    assert varied > 0.5 * len(scores)
    right = [float(r["metadata"]["synthetic_score"]) for r in records if r["task_type"] in ("math", "code")]
    assert 0.2 < np.mean(right) < 0.8


def test_records_round_trip_through_the_codec(records, codec):
    defaults = {"task_id": None, "attempt": 0, "loss_mask": None, "version_spans": None, "logprob_mode": None}
    for r in records[:500]:
        assert codec.decode(codec.encode(r)) == {**defaults, **r}


@pytest.mark.parametrize(
    "kwargs", [{"group_size": 0}, {"num_domains": 3}, {"worker_count": 0}, {"policy_version": -1}]
)
def test_impossible_settings_are_refused(kwargs):
    with pytest.raises(FleetConfigError):
        SyntheticFleet(0, **kwargs)


def test_malformed_messages_cover_every_kind_deterministically(codec):
    messages = list(malformed_messages(9, 70))
    assert messages == list(malformed_messages(9, 70))
    assert messages != list(malformed_messages(10, 70))
    assert len(messages) == 70
    for start in range(0, 70, 7):
        assert sorted(kind for _, _, kind in messages[start : start + 7]) == sorted(MALFORMED_KINDS)
    for key, value, kind in messages:
        assert key is None or isinstance(key, bytes)
        if kind in SEMANTIC_KINDS:
            record = codec.decode(value)
            if kind == "nan_reward":
                assert record["task_type"] == "precomputed" and math.isnan(record["precomputed_reward"])
            else:
                assert len(record["response_logprobs"]) != len(record["response_tokens"])
            continue
        expected = UnknownSchemaError if kind == "unknown_fingerprint" else DecodeError
        with pytest.raises(expected):
            codec.decode(value)
        if kind == "empty":
            assert value == b""
        if kind == "json":
            assert isinstance(json.loads(value), dict)
