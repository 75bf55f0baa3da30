"""Semantic validation, length buckets, advantages and batch processing (no broker needed)."""

from __future__ import annotations

import math
import uuid
from datetime import UTC, datetime

import numpy as np
import pytest

from schemas import TrajectoryCodec, pack_float32, pack_int32
from schemas.profile import load_profile
from stream_processors import (
    BatchProcessor,
    Coordinates,
    SourceMessage,
    validate,
)
from stream_processors.advantages import group_advantages
from stream_processors.exceptions import (
    AttemptError,
    EmptyIdError,
    GroupIndexError,
    LengthMismatchError,
    LossMaskError,
    NonFiniteValueError,
    PackedBufferError,
    TokenIdError,
    VersionSpanError,
)
from stream_processors.validation import MAX_TOKEN_ID, TokenArrays, values_ok

pytestmark = pytest.mark.timeout(30)


def make_record(**changes):
    record = {
        "trajectory_id": str(uuid.uuid4()),
        "group_id": "g-1",
        "sample_index": 0,
        "group_size": 2,
        "domain": "math/algebra-001",
        "task_type": "math",
        "policy_version": 3,
        "prompt_tokens": pack_int32([1, 2, 3]),
        "response_tokens": pack_int32([4, 5]),
        "response_logprobs": pack_float32([-0.5, -0.25]),
        "response_text": "The final answer is \\boxed{4}.",
        "finish_reason": "stop",
        "expected_answer": "4",
        "worker_id": "w-0",
        "created_at": datetime(2025, 1, 1, tzinfo=UTC),
        "metadata": {"k": "v"},
    }
    record.update(changes)
    return record


def test_validate_returns_zero_copy_arrays():
    tokens = validate(make_record())
    assert tokens.prompt_tokens.tolist() == [1, 2, 3]
    assert tokens.response_tokens.dtype == np.dtype("<i4")
    assert tokens.response_logprobs.tolist() == [-0.5, -0.25]
    assert tokens.length == 5


@pytest.mark.parametrize(
    ("changes", "error", "message"),
    [
        ({"prompt_tokens": b"\x01\x02\x03"}, PackedBufferError, r"prompt_tokens: .*3 bytes"),
        ({"response_tokens": b"\x01" * 9}, PackedBufferError, r"response_tokens: .*9 bytes"),
        ({"response_logprobs": b"\x00" * 6}, PackedBufferError, r"response_logprobs: .*6 bytes"),
        (
            {"response_logprobs": pack_float32([-1.0])},
            LengthMismatchError,
            r"len\(response_logprobs\)=1 != .*=2",
        ),
        (
            {"response_logprobs": pack_float32([-1.0, math.nan])},
            NonFiniteValueError,
            r"response_logprobs\[1\]=nan",
        ),
        (
            {"response_logprobs": pack_float32([-math.inf, 0])},
            NonFiniteValueError,
            r"response_logprobs\[0\]=-inf",
        ),
        ({"precomputed_reward": math.nan}, NonFiniteValueError, "precomputed_reward=nan"),
        ({"precomputed_reward": math.inf}, NonFiniteValueError, "precomputed_reward=inf"),
        ({"sample_index": 2}, GroupIndexError, r"sample_index=2 is outside \[0, group_size=2\)"),
        ({"sample_index": -1}, GroupIndexError, "sample_index=-1"),
        ({"group_size": 0, "sample_index": 0}, GroupIndexError, "group_size=0"),
        ({"trajectory_id": ""}, EmptyIdError, "trajectory_id=''"),
        ({"group_id": "  "}, EmptyIdError, "group_id='  '"),
        ({"prompt_tokens": pack_int32([1, -7, 3])}, TokenIdError, r"prompt_tokens\[1\]=-7 is outside"),
        (
            {"response_tokens": pack_int32([4, 2**24])},
            TokenIdError,
            r"response_tokens\[1\]=16777216 is outside \[0, 16777216\)",
        ),
        (
            {"response_tokens": pack_int32([2**31 - 1, -(2**31)])},
            TokenIdError,
            r"response_tokens\[0\]=2147483647 .*\(2 of 2 are\)",
        ),
        ({"loss_mask": b"\x01"}, LengthMismatchError, r"len\(loss_mask\)=1 != len\(response_tokens\)=2"),
        ({"loss_mask": b"\x01\xff"}, LossMaskError, r"loss_mask\[1\]=255 is neither 0 nor 1 \(1 of 2"),
        ({"version_spans": []}, VersionSpanError, r"end at 0, not at len\(response_tokens\)=2"),
        (
            {"version_spans": [{"start": 0, "end": 0, "version": 1}, {"start": 0, "end": 2, "version": 2}]},
            VersionSpanError,
            r"version_spans\[0\]=\[0, 0\) is empty",
        ),
        ({"task_id": "t-1"}, AttemptError, "task_id='t-1' with attempt=0"),
        ({"attempt": -2}, AttemptError, "attempt=-2 must be >= 0"),
        ({"attempt": 1}, AttemptError, "attempt=1 without a task_id"),
        ({"task_id": "", "attempt": 1}, EmptyIdError, "task_id='' is empty"),
    ],
)
def test_validate_names_the_bad_field_and_value(changes, error, message):
    with pytest.raises(error, match=message):
        validate(make_record(**changes))


def test_a_task_sample_keeps_its_mask_as_a_view_and_values_false_leaves_the_bytes_to_the_batch_check():
    record = make_record(
        task_id="t-1", attempt=1, loss_mask=b"\x00\x01", version_spans=[{"start": 0, "end": 2, "version": 3}]
    )
    assert validate(record).loss_mask.tolist() == [0, 1]
    bad = make_record(loss_mask=b"\x01\x02")
    assert validate(bad, values=False).loss_mask.tolist() == [1, 2]
    assert values_ok([validate(record)]) and not values_ok([validate(record), validate(bad, values=False)])


def test_token_ids_up_to_the_limit_are_accepted():
    assert MAX_TOKEN_ID == 2**24
    tokens = validate(make_record(prompt_tokens=pack_int32([0, MAX_TOKEN_ID - 1])))
    assert tokens.prompt_tokens.tolist() == [0, MAX_TOKEN_ID - 1]


def test_group_advantages():
    out = group_advantages(
        ["a", "a", "a", "b", "c", "c", "c"],
        [1.0, 0.0, 0.5, 0.7, 1.0, 1.0, 0.0],
        ["ok", "fail", "ok", "ok", "ok", "ok", "skipped"],
    )
    group_a = np.array([1.0, 0.0, 0.5])
    expected_a = (group_a - group_a.mean()) / (group_a.std() + 1e-6)
    assert out[:3] == pytest.approx(expected_a)
    assert out[3] == 0.0  # a singleton group carries no signal
    assert out[4:6] == pytest.approx([0.0, 0.0])  # equal rewards: no advantage
    assert out[6] == 0.0  # skipped rows get 0 and are left out of their group's statistics
    assert out[:3].sum() == pytest.approx(0.0, abs=1e-9)
    with pytest.raises(ValueError, match="parallel"):
        group_advantages(["a"], [1.0, 2.0], ["ok"])


@pytest.mark.parametrize("status", ["skipped", "error", "timeout"])
def test_records_without_a_signal_are_left_out_of_group_statistics(status):
    judged = group_advantages(["a", "a", "a"], [1.0, 0.0, 0.5], ["ok", "fail", "ok"])
    out = group_advantages(["a"] * 5, [1.0, 0.0, 0.5, 0.0, 0.0], ["ok", "fail", "ok", status, status])
    assert out[:3] == pytest.approx(judged)
    assert out[3:].tolist() == [0.0, 0.0]
    lone = group_advantages(["b", "b"], [1.0, 0.0], ["ok", status])
    assert lone.tolist() == [0.0, 0.0]  # one judged record left: no signal


def test_batch_processor_scores_buckets_and_dead_letters():
    codec = TrajectoryCodec()
    good = [
        make_record(sample_index=0, response_text="\\boxed{4}"),
        make_record(sample_index=1, response_text="\\boxed{5}", prompt_tokens=pack_int32(np.arange(600))),
        make_record(
            group_id="g-2", group_size=1, domain="code/clamp-000", task_type="code", unit_tests="assert False"
        ),
    ]
    values = [codec.encode(r) for r in good]
    values += [b"junk", codec.encode(make_record(task_type="poetry")), None]
    messages = [SourceMessage(Coordinates("raw", 1, 10 + i), b"k", v) for i, v in enumerate(values)]
    out = BatchProcessor().process(messages)
    assert [r.record["trajectory_id"] for r in out.rows] == [r["trajectory_id"] for r in good]
    assert [c.offset for c in out.coordinates] == [10, 11, 12]
    assert [r.verdict.reward for r in out.rows] == [1.0, 0.0, 0.0]
    assert [r.verdict.status for r in out.rows] == ["ok", "fail", "fail"]  # code runs in the sandbox
    assert [r.bucket for r in out.rows] == load_profile().bucket_names([r.length for r in out.rows])
    assert [r.length for r in out.rows] == [5, 602, 5]
    assert out.rows[0].advantage > 0 > out.rows[1].advantage
    assert out.rows[2].advantage == 0.0
    assert [r.domain_reward for r in out.rows] == [0.0, 0.0, 0.0]  # process() keeps no domain statistics
    letters = {d.coordinates.offset: d for d in out.dead_letters}
    assert letters[13].error_type == "DecodeError" and letters[13].raw == b"junk"
    assert letters[14].error_type == "UnknownTaskTypeError" and "poetry" in letters[14].reason
    assert letters[15].error_type == "InvalidRecordError" and "no value" in letters[15].reason
    assert all(d.key == b"k" and d.coordinates.topic == "raw" for d in out.dead_letters)


def test_a_crashing_verifier_yields_an_error_verdict_not_a_dead_letter():
    from stream_processors.verifiers import Verifier, default_registry

    class Broken(Verifier):
        name = "broken"

        def verify(self, record):
            raise ZeroDivisionError("boom")

    registry = default_registry()
    registry.register("math", Broken())
    message = SourceMessage(Coordinates("raw", 0, 0), None, TrajectoryCodec().encode(make_record()))
    out = BatchProcessor(verifiers=registry).process([message])
    assert not out.dead_letters
    verdict = out.rows[0].verdict
    assert (verdict.status, verdict.reward, verdict.verifier) == ("error", 0.0, "broken")
    assert "ZeroDivisionError: boom" in (verdict.detail or "")


def test_values_ok_checks_arrays_that_are_not_views_of_packed_buffers():
    good = validate(make_record())
    ids, logprobs = (
        np.arange(8, dtype=np.int32)[::2],
        np.zeros(8, np.float32)[::2],
    )  # strided: no bytes to join
    assert values_ok([good, TokenArrays(ids, ids, logprobs)])
    assert not values_ok([good, TokenArrays(ids, np.full(8, MAX_TOKEN_ID, np.int32)[::2], logprobs)])
    assert not values_ok([good, TokenArrays(ids, ids, np.full(8, np.nan, np.float32)[::2])])
