"""The closed loop on the real broker: tasks, `rollstream serve`, a rollout worker, the stream stage,
the learner publishing versions, the server reloading them, until the reward has risen.

`infra.loop.run_loop` runs the pieces (serve and process as child processes, the rollout worker and
the learner in this one) on the suite's broker with a lake and topics of its own. Asserted: every
submitted task ended as one complete group (or a task dead letter); versions advanced; no trained
row was staler than `max_lag`; the held-out evaluation ran at every version; and the training
reward rose beyond noise, on per-group means (a group's samples are correlated): version 0 against
the last two versions, at least 64 groups each, by more than 3 standard errors and 0.15, from an
untrained rate of at least 0.1. The held-out prompts (never trained on) are scored at every
version, and every published version is an MLflow model version of the learner's run.
"""

from __future__ import annotations

import math
from pathlib import Path

import mlflow
import polars as pl
import pytest

from infra.loop import MODEL_NAME, LoopOptions, run_loop
from infra.settings import Settings

pytestmark = pytest.mark.timeout(480)
OPTIONS = LoopOptions(versions=12, publish_every=6, wave=96, time_limit_s=240.0, seed=0)


def _pooled(group_means: list[float]) -> tuple[float, float]:
    n = len(group_means)
    mean = sum(group_means) / n
    var = sum((m - mean) ** 2 for m in group_means) / (n - 1)
    return mean, math.sqrt(var / n)


@pytest.mark.slow(147)
def test_the_loop_raises_the_reward_and_accounts_for_every_task(bootstrap_servers):
    settings = Settings.load()
    summary = run_loop(settings, OPTIONS, progress=print)

    assert summary.accounted_for, summary.as_dict()
    assert summary.submitted > 0 and summary.done + summary.dead == summary.submitted
    assert summary.complete_groups == summary.done == summary.groups_in_table
    assert summary.versions_published >= OPTIONS.versions
    assert 0 <= summary.max_staleness_trained <= OPTIONS.max_lag

    groups = (
        pl.read_delta(summary.table_uri, columns=["group_id", "policy_version", "reward", "task_id"])
        .filter(pl.col("task_id").is_not_null())
        .group_by("group_id")
        .agg(pl.col("policy_version").min(), pl.col("reward").mean(), pl.len().alias("samples"))
    )
    assert (groups["samples"] == 8).all()  # one complete group per task: never two attempts mixed
    last = sorted(groups["policy_version"].unique().to_list())[-2:]
    first = groups.filter(pl.col("policy_version") == 0)["reward"].to_list()
    recent = groups.filter(pl.col("policy_version").is_in(last))["reward"].to_list()
    assert len(first) >= 64 and len(recent) >= 64, (len(first), len(recent), last)
    (base, se1), (now, se2) = _pooled(first), _pooled(recent)
    assert base >= 0.1, base
    gain = now - base
    assert gain > 3 * math.sqrt(se1**2 + se2**2) and gain > 0.15, (base, se1, now, se2)

    client = mlflow.MlflowClient(summary.tracking_uri)
    heldout = client.get_metric_history(summary.run_id, "heldout/reward")
    assert {int(m.step) for m in heldout} >= set(range(OPTIONS.versions + 1))

    # Every published version is a model version of the learner's run, with its table version.
    policies = pl.read_delta(f"{Path(summary.table_uri).parent}/policies")
    registered = {
        int(mv.tags["rollstream.policy_version"]): mv
        for mv in client.search_model_versions(f"name = '{MODEL_NAME}'")
        if mv.run_id == summary.run_id
    }
    assert set(registered) == set(policies["number"].to_list()), sorted(registered)
    for record in policies.iter_rows(named=True):
        model_version = registered[record["number"]]
        assert model_version.source.startswith(f"runs:/{summary.run_id}/")
        assert model_version.tags["rollstream.sha256"] == record["sha256"]
        if record["table_version"] is not None:
            assert model_version.tags["rollstream.table_version"] == str(record["table_version"])
