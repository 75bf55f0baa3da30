"""The learner's Prometheus metrics after a real run on a real trajectories table."""

from __future__ import annotations

from pathlib import Path

import pytest
from metrics_support import parse, value
from replay_support import make_rows, write_rows

from consumers import learn
from consumers.learner_metrics import LearnerMetrics
from schemas.metrics import exposition

pytestmark = pytest.mark.timeout(120)


def test_the_buffer_depth_is_the_rows_held_and_every_sampled_row_has_a_staleness(tmp_path: Path) -> None:
    uri = str(tmp_path / "trajectories")
    for k in range(3):  # three versions of 100 rows; capacity 150 evicts the older ones
        write_rows(uri, make_rows(100, first=100 * k, seed=k, policy_version=0, all_trainable=True))
    metrics = LearnerMetrics()
    result = learn(
        table_uri=uri,
        tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}",
        experiment="t",
        steps=3,
        token_budget=512,
        max_length=96,
        capacity_rows=150,
        max_lag=8,
        metrics=metrics,
    )
    samples = parse(exposition(metrics.registry)[0].decode())
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
