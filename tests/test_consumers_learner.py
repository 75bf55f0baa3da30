"""The learner on a real trajectories table, a real MLflow sqlite store and real torch.

Includes a learner SIGKILLed mid-run and resumed from its checkpoint, which must neither lose
its place nor train on a row more often than its setting allows.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import mlflow
import pytest
import torch
from mlflow.tracking import MlflowClient
from replay_support import PROFILE, make_rows, trainable, write_rows

from consumers import (
    CheckpointError,
    EmptySnapshotError,
    LearnerOptions,
    MissingTableError,
    PolicyInputError,
    TinyPolicy,
    TokenRangeError,
    TrackingError,
    clipped_policy_loss,
    learn,
    policy_gradient_loss,
)
from consumers.replay import ReplayConfig, load_checkpoint

pytestmark = pytest.mark.timeout(240)
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[dict[str, Any]]]:
    """(table uri, all rows): versions 0..2, policy_version = version."""
    uri = str(tmp_path_factory.mktemp("lake") / "trajectories")
    rows: list[dict[str, Any]] = []
    for k in range(3):
        append = make_rows(150, first=150 * k, seed=k, policy_version=k)
        write_rows(uri, append)
        rows += append
    return uri, rows


def test_policy_scores_each_token_given_its_prefix() -> None:
    torch.manual_seed(0)
    policy = TinyPolicy(vocab_size=37, dim=8)
    states = torch.randn(3, 8)
    total = sum(policy.score(states, torch.full((3,), t)).exp() for t in range(37))
    torch.testing.assert_close(total, torch.ones(3))
    ids = torch.tensor([[5, 7, 9, 0], [3, 4, 0, 0]])
    mask = ids != 0
    out = policy.logprobs(ids, mask)
    assert out.shape == (2, 4)
    assert (out[:, 0] == 0).all() and (out[~mask] == 0).all() and (out[:, 1:][mask[:, 1:]] < 0).all()
    with pytest.raises(PolicyInputError, match="vocab_size"):
        policy.logprobs(torch.tensor([[1, 37]]), torch.ones(1, 2, dtype=torch.bool))


def test_policy_gradient_loss_is_the_masked_token_mean() -> None:
    logp = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.5, -9.0]], requires_grad=True)
    mask = torch.tensor([[False, True, True], [False, True, False]])
    advantages = torch.tensor([1.0, -2.0])
    loss = policy_gradient_loss(logp, advantages, mask)
    assert loss.item() == pytest.approx(-(1 * -2 + 1 * -3 + -2 * -0.5) / 3)


def test_clipped_loss_uses_the_importance_ratio_and_reports_clipping() -> None:
    new = torch.tensor([[0.0, -1.0, -1.0, -1.0]], requires_grad=True)
    old = torch.tensor([[0.0, -1.0, -2.0, -0.5]])
    mask = torch.tensor([[False, True, True, True]])
    loss, parts = clipped_policy_loss(new, old, torch.tensor([1.0]), mask, clip_epsilon=0.2)
    ratios = torch.exp(new - old)[0, 1:].detach()
    expected = -(torch.minimum(ratios, ratios.clamp(0.8, 1.2))).mean()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    assert parts["clip_fraction"] == pytest.approx(2 / 3)  # e^1 and e^-0.5 leave [0.8, 1.2]
    loss.backward()
    assert new.grad is not None and new.grad[0, 1].item() != 0 and new.grad[0, 2].item() == 0
    ref = torch.tensor([[0.0, -1.0, -1.5, -1.0]])
    with_kl, kl_parts = clipped_policy_loss(
        new, old, torch.tensor([1.0]), mask, ref_logprobs=ref, kl_coef=0.5
    )
    delta = torch.tensor(-0.5)
    assert kl_parts["kl"] == pytest.approx(((torch.exp(delta) - delta - 1) / 3).item(), rel=1e-5)
    assert with_kl.item() == pytest.approx(loss.item() + 0.5 * kl_parts["kl"], rel=1e-5)


def test_learn_trains_and_tracks_metrics_lineage_and_profile(
    lake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    uri, rows = lake
    workdir = tmp_path / "cwd"
    workdir.mkdir()
    monkeypatch.chdir(workdir)
    tracking_uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    lines: list[str] = []
    result = learn(
        ReplayConfig(table_uri=uri, token_budget=512, max_length=96),
        LearnerOptions(experiment="t", steps=6, kl_coef=0.1),
        tracking_uri=tracking_uri,
        progress=lines.append,
    )
    assert len(lines) == 6 and lines[-1].startswith("step 6/6 loss=")
    assert result.table_version == 2 and result.first_table_version == 0 and result.steps == 6
    assert math.isfinite(result.final_loss) and result.rows_trained > 0
    initial = TinyPolicy()
    torch.manual_seed(0)
    initial = TinyPolicy()
    assert any(not torch.equal(initial.state_dict()[k], v) for k, v in result.policy.state_dict().items())

    client = MlflowClient(tracking_uri)
    run = client.get_run(result.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.tags["rollstream.table_uri"] == uri
    assert run.data.tags["rollstream.table_version"] == "2"
    assert run.data.tags["rollstream.table_versions"] == "0-2"
    for key, value in {
        "steps": "6",
        "token_budget": "512",
        "max_length": "96",
        "vocab_size": "32768",
        "kl_coef": "0.1",
        "profile_id": PROFILE.id,
    }.items():
        assert run.data.params[key] == value
    history = {
        m: client.get_metric_history(result.run_id, m)
        for m in (
            "loss",
            "clip_fraction",
            "padding_waste",
            "samples_per_s",
            "tokens_per_s",
            "kl",
            "bucket_distance",
            "staleness/lag_0",
            "bucket_share/short",
            "bucket_target/short",
        )
    }
    for name, points in history.items():
        assert [p.step for p in points] == list(range(6)), name
    assert history["loss"][-1].value == pytest.approx(result.final_loss)
    assert history["bucket_target/short"][0].value == pytest.approx(PROFILE.targets["short"])
    domains = {k for k in run.data.metrics if k.startswith("reward/domain/")}
    assert domains and domains <= {
        f"reward/domain/{d}" for d in ("math/algebra", "code/python", "extraction/invoice")
    }
    assert any(k.startswith("reward/task_type/") for k in run.data.metrics)
    lag_bins = [k for k in run.data.metrics if k.startswith("staleness/lag_")]
    assert len(lag_bins) == 5
    (dataset_input,) = run.inputs.dataset_inputs
    assert dataset_input.dataset.name == "trajectories@v0-v2"
    assert mlflow.data.get_source(dataset_input).path == uri
    artifacts = [a.path for a in client.list_artifacts(result.run_id, "profile")]
    assert artifacts == ["profile/azure_conv_2023.toml"]
    assert list(workdir.iterdir()) == []

    again = learn(
        ReplayConfig(table_uri=uri, token_budget=512, max_length=96, start_version=1, end_version=1),
        LearnerOptions(experiment="t", steps=3),
        tracking_uri=tracking_uri,
    )
    found = client.search_runs([result.experiment_id], "tags.`rollstream.table_versions` = '1-1'")
    assert [r.info.run_id for r in found] == [again.run_id]
    assert client.get_run(again.run_id).inputs.dataset_inputs[0].dataset.name == "trajectories@v1"
    assert {r["policy_version"] for r in rows} == {0, 1, 2}


def test_learn_refuses_bad_inputs_clearly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    tracking_uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    with pytest.raises(MissingTableError, match="rollstream process"):
        learn(ReplayConfig(table_uri=str(tmp_path / "nowhere")), tracking_uri=tracking_uri)
    skipped = [dict(row, verifier_status="skipped") for row in make_rows(5, first=0, seed=3)]
    write_rows(str(tmp_path / "skipped"), skipped)
    with pytest.raises(EmptySnapshotError, match="no row to train on"):
        learn(
            ReplayConfig(str(tmp_path / "skipped"), token_budget=512, max_length=64),
            tracking_uri=tracking_uri,
        )
    with pytest.raises(TrackingError, match="no scheme"):
        learn(ReplayConfig(table_uri=str(tmp_path / "skipped")), tracking_uri="mlflow.db")
    write_rows(str(tmp_path / "wide"), make_rows(20, first=0, seed=4, vocab=40_000, all_trainable=True))
    with pytest.raises(TokenRangeError, match="vocab_size"):
        learn(
            ReplayConfig(str(tmp_path / "wide"), token_budget=512, max_length=64), tracking_uri=tracking_uri
        )
    ok = learn(
        ReplayConfig(str(tmp_path / "wide"), vocab_size=40_000, token_budget=512, max_length=64),
        LearnerOptions(steps=1, dim=4),
        tracking_uri=tracking_uri,
    )
    assert ok.steps == 1


_LEARNER = """
import sys
from consumers import LearnerOptions, learn
from consumers.replay import ReplayConfig
learn(ReplayConfig(sys.argv[1], token_budget=256, max_length=64, max_uses=1, profile_matched=False),
      LearnerOptions(experiment="resume", steps=None, checkpoint_path=sys.argv[3], checkpoint_every=1,
                     rows_log=sys.argv[4], dim=32),
      tracking_uri=sys.argv[2])
"""


@pytest.mark.slow(44)
def test_learner_sigkilled_and_resumed_reuses_no_row_beyond_its_setting(lake, tmp_path: Path) -> None:
    uri, rows = lake
    tracking_uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    checkpoint, rows_log = tmp_path / "learner.ckpt", tmp_path / "rows.jsonl"
    args = [sys.executable, "-c", _LEARNER, uri, tracking_uri, str(checkpoint), str(rows_log)]
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    child = subprocess.Popen(args, cwd=tmp_path, env=env, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and child.poll() is None:
        if rows_log.exists() and len(rows_log.read_text().splitlines()) >= 8:
            break
        time.sleep(0.02)
    assert child.poll() is None, child.stderr.read().decode() if child.stderr else ""
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    assert child.returncode == -signal.SIGKILL
    assert not list(tmp_path.glob("*.partial")) or checkpoint.exists()
    killed_at = len(rows_log.read_text().splitlines())

    resumed = learn(
        ReplayConfig(uri, token_budget=256, max_length=64, max_uses=1, profile_matched=False),
        LearnerOptions(
            experiment="resume",
            steps=None,
            checkpoint_path=checkpoint,
            checkpoint_every=1,
            rows_log=rows_log,
            dim=32,
        ),
        tracking_uri=tracking_uri,
    )
    assert 0 < resumed.resumed_from <= killed_at
    lineage: dict[int, list[str]] = {}
    for line in rows_log.read_text().splitlines():
        entry = json.loads(line)
        lineage[entry["step"]] = entry["ids"]  # a replayed step replaces the one the crash lost
    assert sorted(lineage) == list(range(1, resumed.steps + 1))
    trained = [tid for step in sorted(lineage) for tid in lineage[step]]
    assert len(trained) == len(set(trained))  # max_uses=1: no row twice along the surviving lineage
    assert set(trained) == {r["trajectory_id"] for r in trainable(rows)}
    assert MlflowClient(tracking_uri).get_run(resumed.run_id).data.params["max_uses"] == "1"
    with pytest.raises(CheckpointError, match="max_uses"):
        learn(
            ReplayConfig(uri, token_budget=256, max_length=64, max_uses=2, profile_matched=False),
            LearnerOptions(experiment="resume", checkpoint_path=checkpoint, dim=32),
            tracking_uri=tracking_uri,
        )


@pytest.mark.slow(51)
def test_cli_learn_follow_keeps_training_as_the_table_grows_until_sigterm(tmp_path: Path) -> None:
    lake_dir = tmp_path / "lake"
    uri = str(lake_dir / "trajectories")
    write_rows(uri, make_rows(80, first=0, seed=0, all_trainable=True))
    env = {
        **os.environ,
        "ROLLSTREAM_STATE_DIR": str(tmp_path / "state"),
        "ROLLSTREAM_LAKE_URI": str(lake_dir),
        "ROLLSTREAM_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}",
        "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
    }
    command = [sys.executable, "-m", "infra.cli", "learn", "--follow", "--max-uses", "1", "--token-budget", "512",
               "--max-length", "96", "--checkpoint", str(tmp_path / "ckpt"), "--checkpoint-every", "1", "--no-profile-match"]  # fmt: skip
    child = subprocess.Popen(
        command, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        for k in range(1, 5):
            time.sleep(1.0)
            write_rows(uri, make_rows(40, first=80 * k, seed=k, all_trainable=True))
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and child.poll() is None:
            state = load_checkpoint(tmp_path / "ckpt")
            if state is not None and state["totals"]["rows"] >= 80 + 4 * 40:
                break
            time.sleep(0.5)
        child.send_signal(signal.SIGTERM)
        out, err = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == 0, err[-2000:]
    result = json.loads(out.strip().splitlines()[-1])
    assert result["table_version"] == 4 and result["steps"] > 0
    assert result["rows_trained"] == 80 + 4 * 40
