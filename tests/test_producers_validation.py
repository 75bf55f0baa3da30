"""Validation before send: a broken trajectory raises at the call site, naming the field; nothing is sent."""

from __future__ import annotations

import pytest

from producers import InvalidTrajectoryError, Publisher, SyntheticFleet, TrajectoryValidator
from schemas import pack_float32, pack_int32

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def record() -> dict:
    return dict(next(SyntheticFleet(31).trajectories(1)))


BROKEN = {
    "counts differ": ({"response_logprobs": pack_float32([-0.5] * 3), "response_tokens": pack_int32([1, 2])}, "response_logprobs", "3 logprobs for 2 response tokens"),
    "negative policy_version": ({"policy_version": -1}, "policy_version", "policy_version=-1"),
    "empty response": ({"response_tokens": b"", "response_logprobs": b""}, "response_tokens", "empty"),
    "unknown task type": ({"task_type": "poetry"}, "task_type", "unknown task_type='poetry'"),
    "torn buffer": ({"prompt_tokens": b"\x01\x02\x03"}, "prompt_tokens", "not a multiple of 4"),
    "sample outside group": ({"sample_index": 8, "group_size": 8}, "sample_index", "outside [0, group_size=8)"),
    "empty id": ({"trajectory_id": " "}, "trajectory_id", "non-empty"),
    "not packed": ({"response_tokens": [1, 2, 3]}, "response_tokens", "not packed bytes"),
    "schema": ({"worker_id": 7}, "schema", "does not fit schema"),
    "negative attempt": ({"task_id": "t", "attempt": -1}, "attempt", "attempt=-1 must be an integer >= 0"),
    "task without attempt": ({"task_id": "t"}, "attempt", "task_id='t' with attempt=0"),
    "mask length": ({"task_id": "t", "attempt": 1, "loss_mask": b"\x01"}, "loss_mask", "1 loss mask bytes for"),
    "mask byte": ({"task_id": "t", "attempt": 1, "loss_mask": b"\x01" * 127 + b"\x07"}, "loss_mask", "loss_mask[127]=7 is neither 0 nor 1"),
    "span gap": ({"version_spans": [{"start": 0, "end": 2, "version": 1}, {"start": 4, "end": 128, "version": 2}]}, "version_spans", "starts at 4, not at 2 (a gap)"),
    "span short": ({"version_spans": [{"start": 0, "end": 100, "version": 1}]}, "version_spans", "end at 100, not at the response's 128 tokens"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_each_broken_invariant_is_refused_at_the_call_site(bootstrap_servers, make_topic, record, case):
    change, field, words = BROKEN[case]
    record.update(change)
    topic = make_topic("producers-valid")
    with Publisher(bootstrap_servers=bootstrap_servers, topic=topic) as publisher:
        with pytest.raises(InvalidTrajectoryError) as caught:
            publisher.publish(record)
        assert publisher.pending == 0
    assert caught.value.field == field
    assert words in str(caught.value) and "not sent" in str(caught.value)
    assert caught.value.trajectory_id == str(record["trajectory_id"])
    assert publisher.published == 0


def test_the_fleet_record_has_128_response_tokens_and_a_task_sample_passes(record):
    assert len(record["response_tokens"]) == 4 * 128  # the BROKEN cases above are sized for it
    spans = [{"start": 0, "end": 5, "version": 1}, {"start": 5, "end": 128, "version": 2}]
    task = {**record, "task_id": "t", "attempt": 2, "loss_mask": b"\x01\x00" * 64, "version_spans": spans}
    TrajectoryValidator().check(task)


def test_missing_fields_are_named(record):
    del record["response_logprobs"]
    with pytest.raises(InvalidTrajectoryError, match="missing field") as caught:
        TrajectoryValidator().check(record)
    assert caught.value.field == "response_logprobs"


def test_the_domain_check_is_pluggable(record):
    fleet = SyntheticFleet(31)
    names = {d.name for d in fleet.domains}
    TrajectoryValidator().check(record)  # no registry given: any domain
    TrajectoryValidator(known_domains=names).check(record)
    TrajectoryValidator(known_domains=lambda name: name.startswith(record["task_type"] + "/")).check(record)
    record["domain"] = "math/nowhere-999"
    for check in (names, lambda name: name in names):
        with pytest.raises(InvalidTrajectoryError, match="unknown domain='math/nowhere-999'") as caught:
            TrajectoryValidator(known_domains=check).check(record)
        assert caught.value.field == "domain"


def test_every_fleet_record_passes(record):
    fleet = SyntheticFleet(32)
    validator = TrajectoryValidator(known_domains={d.name for d in fleet.domains})
    for r in fleet.trajectories(2000):
        validator.check(r)
