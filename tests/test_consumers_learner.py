"""consumers/ against a real trajectories Delta table on disk and a real MLflow sqlite store.

The table is written here with deltalake from a pyarrow table of exactly the contract's schema
(two appends, so versions 0 and 1), and every batch is checked against the source rows.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import mlflow
import numpy as np
import pyarrow as pa
import pytest
import torch
from deltalake import write_deltalake
from mlflow.tracking import MlflowClient
from torch.utils.data import DataLoader

from consumers import (
    EmptySnapshotError,
    ForkedReaderError,
    MissingTableError,
    PolicyInputError,
    TinyPolicy,
    TrackingError,
    TrajectoryDataset,
    learn,
    open_snapshot,
    policy_gradient_loss,
    trajectory_loader,
)
from schemas.tables import TRAJECTORIES_SCHEMA as TRAJECTORIES

pytestmark = pytest.mark.timeout(120)

STATUSES = ["ok", "fail", "ok", "error", "fail", "timeout", "skipped"]


def make_rows(count: int, *, first: int, seed: int) -> list[dict[str, Any]]:
    """Rows with varied lengths (some longer than 48 tokens) and every verifier status."""
    rng = np.random.default_rng(seed)
    now = datetime(2026, 1, 1, tzinfo=UTC)
    rows = []
    for i in range(first, first + count):
        prompt = rng.integers(0, 32_768, int(rng.integers(1, 30))).tolist()
        response = rng.integers(0, 32_768, int(rng.integers(0, 40))).tolist()
        status = STATUSES[i % len(STATUSES)]
        reward = 1.0 if status == "ok" else 0.0
        length = len(prompt) + len(response)
        rows.append(
            {
                "trajectory_id": f"t{i:03d}",
                "group_id": f"g{i // 4}",
                "sample_index": i % 4,
                "group_size": 4,
                "domain": "math/algebra",
                "task_type": "math",
                "policy_version": 3,
                "prompt_tokens": prompt,
                "response_tokens": response,
                "response_logprobs": (-rng.random(len(response))).astype(np.float32).tolist(),
                "response_text": "42",
                "finish_reason": "stop",
                "worker_id": "w0",
                "created_at": now,
                "metadata": [("seed", str(seed))],
                "reward": reward,
                "reward_components": [],
                "verifier": "exact_answer",
                "verifier_version": "1",
                "verifier_status": status,
                "domain_reward": reward - 0.5,
                "advantage": float(rng.normal()),
                "group_status": "complete",
                "length": length,
                "bucket": "short" if length <= 16 else "long" if length <= 32 else "ultra_long",
                "profile_id": "test-profile",
                "ingested_at": now,
                "topic": "rollouts.raw",
                "partition": i % 2,
                "offset": i,
            }
        )
    return rows


def write_trajectories(uri: str, rows: list[dict[str, Any]]) -> None:
    table = pa.Table.from_pylist(rows, schema=TRAJECTORIES)
    write_deltalake(uri, table, partition_by=["bucket"], mode="append")


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, dict[str, Any]], set[str]]:
    """(table uri, every row by id, ids of the first append), versions 0 and 1."""
    uri = str(tmp_path_factory.mktemp("lake") / "trajectories")
    first, second = make_rows(35, first=0, seed=1), make_rows(21, first=35, seed=2)
    write_trajectories(uri, first)
    write_trajectories(uri, second)
    by_id = {row["trajectory_id"]: row for row in first + second}
    return uri, by_id, {row["trajectory_id"] for row in first}


def ids_with(
    rows: dict[str, dict[str, Any]], statuses: tuple[str, ...], among: set[str] | None = None
) -> set[str]:
    return {
        i for i, row in rows.items() if row["verifier_status"] in statuses and (among is None or i in among)
    }


def check_batch(batch: dict[str, Any], rows: dict[str, dict[str, Any]], max_length: int) -> None:
    """Every tensor of `batch` against its source rows, including padding to the batch's longest."""
    ids = batch["trajectory_ids"]
    kept = []
    for i, tid in enumerate(ids):
        row = rows[tid]
        prompt, response = row["prompt_tokens"], row["response_tokens"]
        response = response[: max_length - min(len(prompt), 1)]
        p = min(len(prompt), max_length - len(response))
        tokens = prompt[len(prompt) - p :] + response
        kept.append(len(tokens))
        width = batch["input_ids"].shape[1]
        assert batch["input_ids"][i, : len(tokens)].tolist() == tokens
        assert not batch["input_ids"][i, len(tokens) :].any()
        assert batch["attention_mask"][i].tolist() == [t < len(tokens) for t in range(width)]
        assert batch["response_mask"][i].tolist() == [p <= t < len(tokens) for t in range(width)]
        expected_lp = np.zeros(width, dtype=np.float32)
        expected_lp[p : len(tokens)] = np.asarray(row["response_logprobs"], dtype=np.float32)[
            : len(tokens) - p
        ]
        np.testing.assert_array_equal(batch["old_logprobs"][i].numpy(), expected_lp)
        assert batch["advantages"][i].item() == pytest.approx(row["advantage"], rel=1e-6)
        assert batch["rewards"][i].item() == row["reward"]
    assert batch["input_ids"].shape == (len(ids), max(max(kept), 1))
    assert batch["input_ids"].dtype == torch.int64
    assert batch["attention_mask"].dtype == batch["response_mask"].dtype == torch.bool
    assert batch["old_logprobs"].dtype == batch["advantages"].dtype == batch["rewards"].dtype == torch.float32
    assert batch["advantages"].shape == batch["rewards"].shape == (len(ids),)


def test_batches_equal_the_source_rows_padded_to_each_batch_longest(lake) -> None:
    uri, rows, _ = lake
    dataset = TrajectoryDataset(table_uri=uri, batch_size=7, shuffle_seed=3)
    assert dataset.version == 1
    seen: list[str] = []
    widths = set()
    for batch in dataset:
        check_batch(batch, rows, max_length=2048)
        seen += batch["trajectory_ids"]
        widths.add(batch["input_ids"].shape[1])
    assert len(seen) == len(set(seen)) == dataset.count_rows()
    assert set(seen) == ids_with(rows, ("ok", "fail"))
    assert len(widths) > 1


def test_max_length_keeps_the_response_and_the_prompt_tail(lake) -> None:
    uri, rows, _ = lake
    batches = list(
        TrajectoryDataset(table_uri=uri, batch_size=64, max_length=20, statuses=("ok", "fail", "skipped"))
    )
    assert len(batches) == 1
    check_batch(batches[0], rows, max_length=20)
    assert batches[0]["input_ids"].shape[1] == 20
    kept_response = batches[0]["response_mask"].any(dim=1).tolist()
    has_response = [bool(rows[tid]["response_tokens"]) for tid in batches[0]["trajectory_ids"]]
    assert kept_response == has_response and any(has_response)  # no response is cut away whole


def test_statuses_select_rows(lake) -> None:
    uri, rows, _ = lake
    dataset = TrajectoryDataset(table_uri=uri, batch_size=5, statuses=("error", "timeout"))
    seen = [tid for batch in dataset for tid in batch["trajectory_ids"]]
    assert sorted(seen) == sorted(ids_with(rows, ("error", "timeout")))
    with pytest.raises(ValueError, match="statuses"):
        TrajectoryDataset(table_uri=uri, statuses="ok")


def test_version_zero_reads_only_the_first_append(lake) -> None:
    uri, rows, first = lake
    dataset = TrajectoryDataset(table_uri=uri, batch_size=4, version=0)
    seen = {tid for batch in dataset for tid in batch["trajectory_ids"]}
    assert dataset.version == 0
    assert seen == ids_with(rows, ("ok", "fail"), among=first)
    assert open_snapshot(uri).version == 1


def test_shuffle_is_seeded_per_epoch_and_none_keeps_kafka_order(lake) -> None:
    uri, _, _ = lake

    def order(dataset: TrajectoryDataset) -> list[str]:
        return [tid for batch in dataset for tid in batch["trajectory_ids"]]

    plain = order(TrajectoryDataset(table_uri=uri, shuffle_seed=None))
    assert plain == sorted(plain, key=lambda tid: (int(tid[1:]) % 2, int(tid[1:])))
    shuffled = TrajectoryDataset(table_uri=uri, shuffle_seed=5)
    epoch0 = order(shuffled)
    assert epoch0 == order(shuffled) != plain
    shuffled.set_epoch(1)
    assert order(shuffled) != epoch0
    assert sorted(order(shuffled)) == sorted(plain)


def test_dataloader_workers_yield_disjoint_shares_covering_all(lake) -> None:
    uri, rows, _ = lake
    dataset = TrajectoryDataset(table_uri=uri, batch_size=4, max_length=32)
    batches = list(trajectory_loader(dataset, num_workers=2, timeout=60))
    seen = [tid for batch in batches for tid in batch["trajectory_ids"]]
    assert len(seen) == len(set(seen))
    assert set(seen) == ids_with(rows, ("ok", "fail"))
    for batch in batches:
        check_batch(batch, rows, max_length=32)


def test_forked_workers_fail_fast_instead_of_hanging(lake) -> None:
    dataset = TrajectoryDataset(table_uri=lake[0], batch_size=4)
    # One worker: torch takes ~5 s per worker to shut down after a worker raised.
    loader = DataLoader(dataset, batch_size=None, num_workers=1, multiprocessing_context="fork", timeout=60)
    batches = iter(loader)
    with pytest.raises(ForkedReaderError, match="multiprocessing_context='spawn'"):
        next(batches)
    del batches


def test_missing_table_or_version_is_a_clear_error(tmp_path: Path, lake) -> None:
    missing = tmp_path / "lake" / "trajectories"
    with pytest.raises(MissingTableError, match="rollstream process") as info:
        TrajectoryDataset(table_uri=str(missing))
    assert str(missing) in str(info.value)
    with pytest.raises(MissingTableError, match="latest version is 1"):
        open_snapshot(lake[0], version=9)


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
    hidden, _ = policy.rnn(policy.embed(ids[:1]))
    torch.testing.assert_close(out[0, 2], policy.score(hidden[0, 1:2], ids[0, 2:3])[0])
    with pytest.raises(PolicyInputError, match="vocab_size"):
        policy.logprobs(torch.tensor([[1, 37]]), torch.ones(1, 2, dtype=torch.bool))


def test_policy_gradient_loss_is_the_masked_token_mean() -> None:
    logp = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.5, -9.0]], requires_grad=True)
    mask = torch.tensor([[False, True, True], [False, True, False]])
    advantages = torch.tensor([1.0, -2.0])
    loss = policy_gradient_loss(logp, advantages, mask)
    assert loss.item() == pytest.approx(-(1 * -2 + 1 * -3 + -2 * -0.5) / 3)
    loss.backward()
    assert logp.grad is not None
    torch.testing.assert_close(logp.grad, torch.tensor([[0, -1 / 3, -1 / 3], [0, 2 / 3, 0]]))
    same = policy_gradient_loss(logp, advantages, mask, old_logprobs=logp.detach(), clip_epsilon=0.2)
    assert same.item() == pytest.approx(-(1 + 1 - 2) / 3)


def test_learn_steps_and_tracks_lineage_in_mlflow(
    lake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    uri, rows, first = lake
    workdir = tmp_path / "cwd"
    workdir.mkdir()
    monkeypatch.chdir(workdir)
    tracking_uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    lines: list[str] = []
    result = learn(
        table_uri=uri,
        tracking_uri=tracking_uri,
        experiment="t",
        steps=4,
        batch_size=8,
        max_length=64,
        seed=0,
        progress=lines.append,
    )
    assert len(lines) == 4 and lines[-1].startswith("step 4/4 loss=")
    assert result.table_version == 1 and result.table_uri == uri
    assert result.rows_read == len(ids_with(rows, ("ok", "fail")))
    assert math.isfinite(result.final_loss)
    assert 0.0 < result.reward_mean < 1.0
    torch.manual_seed(0)
    initial = TinyPolicy().state_dict()
    trained = result.policy.state_dict()
    assert any(not torch.equal(initial[name], trained[name]) for name in initial)

    client = MlflowClient(tracking_uri)
    run = client.get_run(result.run_id)
    assert run.info.status == "FINISHED" and run.info.experiment_id == result.experiment_id
    assert run.data.tags["rollstream.table_uri"] == uri
    assert run.data.tags["rollstream.table_version"] == "1"
    for key, value in {
        "steps": "4",
        "batch_size": "8",
        "max_length": "64",
        "seed": "0",
        "lr": "0.001",
        "table_uri": uri,
        "table_version": "1",
    }.items():
        assert run.data.params[key] == value
    loss_history = client.get_metric_history(result.run_id, "loss")
    assert [m.step for m in loss_history] == [0, 1, 2, 3]
    assert loss_history[-1].value == pytest.approx(result.final_loss)
    assert len(client.get_metric_history(result.run_id, "tokens")) == 4
    assert run.data.metrics["final_reward_mean"] == pytest.approx(result.reward_mean)
    assert run.data.metrics["rows_read"] == result.rows_read
    (dataset_input,) = run.inputs.dataset_inputs
    assert dataset_input.dataset.name == "trajectories@v1"
    assert mlflow.data.get_source(dataset_input).path == uri

    again = learn(table_uri=uri, tracking_uri=tracking_uri, experiment="t", steps=5, batch_size=8, version=0)
    assert again.rows_read == len(ids_with(rows, ("ok", "fail"), among=first)) < 5 * 8
    found = client.search_runs([result.experiment_id], "tags.`rollstream.table_version` = '0'")
    assert [r.info.run_id for r in found] == [again.run_id]
    assert len(client.get_metric_history(again.run_id, "loss")) == 5
    assert list(workdir.iterdir()) == []
    artifacts = client.get_experiment(result.experiment_id).artifact_location
    assert artifacts == (tmp_path / "mlartifacts").as_uri()


def test_learn_refuses_bad_inputs_clearly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    tracking_uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    with pytest.raises(MissingTableError, match="rollstream process"):
        learn(table_uri=str(tmp_path / "nowhere"), tracking_uri=tracking_uri)
    skipped = [dict(row, verifier_status="skipped") for row in make_rows(5, first=0, seed=3)]
    write_trajectories(str(tmp_path / "skipped"), skipped)
    with pytest.raises(EmptySnapshotError, match="no rows with verifier_status"):
        learn(table_uri=str(tmp_path / "skipped"), tracking_uri=tracking_uri)
    with pytest.raises(TrackingError, match="no scheme"):
        learn(table_uri=str(tmp_path / "skipped"), tracking_uri="mlflow.db")
    assert not (tmp_path / "mlflow.db").exists()
