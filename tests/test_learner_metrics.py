"""The learner's Prometheus metrics after a real run on a real trajectories table."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from metrics_support import parse, value
from replay_support import make_rows, write_rows

from consumers import LearnerOptions, learn
from consumers.learner_metrics import LearnerMetrics
from consumers.replay import ReplayBuffer, ReplayConfig
from infra.metrics_endpoints import key_figures
from schemas.metrics import exposition

pytestmark = pytest.mark.timeout(120)


def test_the_buffer_depth_is_the_rows_held_and_every_sampled_row_has_a_staleness(tmp_path: Path) -> None:
    uri = str(tmp_path / "trajectories")
    for k in range(3):  # three versions of 100 rows; capacity 150 evicts the older ones
        write_rows(uri, make_rows(100, first=100 * k, seed=k, policy_version=0, all_trainable=True))
    metrics = LearnerMetrics()
    result = learn(
        ReplayConfig(table_uri=uri, token_budget=512, max_length=96, capacity_rows=150, max_lag=8),
        LearnerOptions(experiment="t", steps=3),
        tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}",
        metrics=metrics,
    )
    text = exposition(metrics.registry)[0].decode()
    samples = parse(text)
    assert metrics.buffer is not None
    held = len(metrics.buffer.storage)
    assert 0 < held <= 150
    assert value(samples, "rollstream_learner_buffer_rows") == held
    assert value(samples, "rollstream_learner_buffer_tokens") == metrics.buffer.storage.tokens
    admitted = value(samples, "rollstream_learner_rows_admitted_total")
    stale = value(samples, "rollstream_learner_rows_dropped_total", reason="stale")
    evicted = value(samples, "rollstream_learner_rows_dropped_total", reason="evicted")
    assert admitted - stale - evicted == held and evicted >= 100  # at least one version over capacity

    sampled = value(samples, "rollstream_learner_rows_sampled_total")
    assert value(samples, "rollstream_learner_staleness_versions_count") == sampled == result.rows_trained > 0
    assert value(samples, "rollstream_learner_rows_trained_total") == result.rows_trained
    assert value(samples, "rollstream_learner_tokens_trained_total") == result.tokens_trained
    assert value(samples, "rollstream_learner_steps_total") == 3
    assert value(samples, "rollstream_learner_step_seconds_count") == 3
    assert value(samples, "rollstream_learner_staleness_versions_sum") > 0  # rows of version 0 at steps 1, 2
    assert value(samples, "rollstream_learner_max_staleness_versions") == 8
    assert value(samples, "rollstream_learner_samples_per_insert") == pytest.approx(sampled / admitted)
    assert key_figures("learner", text) == {  # what `rollstream status` shows of a learner
        "steps": 3,
        "buffer_rows": held,
        "max_staleness_versions": 8,
        "version": value(samples, "rollstream_learner_version"),
    }


def test_rows_past_the_staleness_limit_are_counted_as_dropped_stale(tmp_path: Path) -> None:
    uri = str(tmp_path / "trajectories")
    old = make_rows(60, first=0, seed=0, policy_version=0, all_trainable=True)
    new = make_rows(40, first=60, seed=1, policy_version=5, all_trainable=True)
    write_rows(uri, old)
    write_rows(uri, new)
    buffer = ReplayBuffer(ReplayConfig(table_uri=uri, max_lag=1, token_budget=512, max_length=96))
    buffer.version = 5  # the learner's version: rows of policy version 0 lag 5 > max_lag
    metrics = LearnerMetrics()
    metrics.watch(buffer)
    with buffer:
        deadline = time.monotonic() + 60
        while buffer.read_to < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
    assert buffer.read_to == 1
    samples = parse(exposition(metrics.registry)[0].decode())
    assert value(samples, "rollstream_learner_rows_admitted_total") == 100
    assert value(samples, "rollstream_learner_rows_dropped_total", reason="stale") == 60
    assert value(samples, "rollstream_learner_rows_dropped_total", reason="evicted") == 0
    assert value(samples, "rollstream_learner_buffer_rows") == 40
    assert value(samples, "rollstream_learner_max_staleness_versions") == 1
