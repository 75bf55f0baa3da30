"""`learn`: real policy-gradient steps on one version of the trajectories table, tracked in MLflow.

The thin learner of ARCHITECTURE.md: `TrajectoryDataset` batches, `TinyPolicy`, the
REINFORCE / GRPO surrogate, AdamW. It reads one pinned table version and cycles it when `steps`
outrun one pass; tailing new versions belongs to the replay buffer that comes next.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, fields
from itertools import islice

import polars as pl
import torch

from consumers.batching import TrajectoryBatch
from consumers.dataset import TrajectoryDataset
from consumers.exceptions import EmptySnapshotError
from consumers.loss import policy_gradient_loss
from consumers.policy import DEFAULT_VOCAB_SIZE, TinyPolicy
from consumers.tracking import check_tracking_uri, track_run


@dataclass(frozen=True)
class LearnResult:
    """What a `learn` call did; `reward_mean` is over every row it trained on, `policy` as trained."""

    run_id: str
    experiment_id: str
    table_uri: str
    table_version: int
    steps: int
    final_loss: float
    reward_mean: float
    rows_read: int
    policy: TinyPolicy = field(repr=False, compare=False)

    def as_dict(self) -> dict[str, str | int | float]:
        """The figures of the run, without the trained policy."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "policy"}


def learn(
    *,
    table_uri: str,
    tracking_uri: str,
    experiment: str = "rollstream",
    steps: int = 20,
    batch_size: int = 16,
    max_length: int = 1024,
    lr: float = 1e-3,
    seed: int = 0,
    version: int | None = None,
    storage_options: Mapping[str, str] | None = None,
    progress: Callable[[str], None] | None = None,
) -> LearnResult:
    """Run `steps` optimizer steps on the trajectories table and log them to MLflow.

    Per step it logs `loss`, `reward_mean` (of the batch), `tokens` (scored response tokens)
    and `step_seconds`; at the end `final_loss`, `final_reward_mean` and `rows_read`. The
    policy's vocabulary is 32,768 ids, or more if the table holds larger token ids.

    Args:
        table_uri: the trajectories Delta table, e.g. `<lake>/trajectories`.
        tracking_uri: an explicit MLflow store, e.g. `sqlite:////abs/path/mlflow.db`.
        experiment: MLflow experiment name (created if missing).
        steps: optimizer steps; the table version is cycled if one pass is shorter.
        batch_size: rows per step.
        max_length: prompt ++ response tokens are cut to this many.
        lr: AdamW learning rate.
        seed: seeds torch (weights) and the row shuffle.
        version: table version to train on; None for the latest.
        storage_options: passed through to deltalake and polars.
        progress: called with one line of text per step.

    Raises:
        MissingTableError: no table at `table_uri` (run `rollstream process` first).
        EmptySnapshotError: the version has no verified ('ok' or 'fail') rows.
        TrackingError: `tracking_uri` is not an explicit store URI.
    """
    if steps < 1 or lr <= 0:
        raise ValueError(f"need steps >= 1 and lr > 0, got steps={steps}, lr={lr}")
    check_tracking_uri(tracking_uri)
    torch.manual_seed(seed)
    dataset = TrajectoryDataset(
        table_uri=table_uri,
        batch_size=batch_size,
        max_length=max_length,
        version=version,
        shuffle_seed=seed,
        storage_options=storage_options,
    )
    rows_read = dataset.count_rows()
    if rows_read == 0:
        raise EmptySnapshotError(
            f"version {dataset.version} of {dataset.snapshot.uri!r} has no rows with verifier_status "
            f"in {dataset.statuses}: let `rollstream process` score more trajectories, or pick "
            "another version"
        )
    policy = TinyPolicy(vocab_size=max(DEFAULT_VOCAB_SIZE, _max_token_id(dataset) + 1))
    optimizer = torch.optim.AdamW(policy.parameters(), lr=lr)
    params = {"steps": steps, "batch_size": batch_size, "lr": lr, "max_length": max_length, "seed": seed}
    loss_value, reward_sum, rewarded_rows = float("nan"), 0.0, 0
    with track_run(
        tracking_uri=tracking_uri, experiment=experiment, snapshot=dataset.snapshot, params=params
    ) as run:
        for step, batch in enumerate(islice(_cycle(dataset), steps)):
            started = time.perf_counter()
            loss_value, tokens = _step(policy, optimizer, batch)
            rewards = batch["rewards"]
            reward_sum += float(rewards.sum())
            rewarded_rows += len(rewards)
            metrics = {
                "loss": loss_value,
                "reward_mean": float(rewards.mean()),
                "tokens": float(tokens),
                "step_seconds": time.perf_counter() - started,
            }
            run.log_step(step, metrics)
            if progress is not None:
                progress(
                    f"step {step + 1}/{steps} loss={loss_value:.4f} "
                    f"reward_mean={metrics['reward_mean']:.3f} tokens={tokens}"
                )
        reward_mean = reward_sum / max(rewarded_rows, 1)
        run.log_summary(
            {"final_loss": loss_value, "final_reward_mean": reward_mean, "rows_read": float(rows_read)}
        )
    return LearnResult(
        run_id=run.run_id,
        experiment_id=run.experiment_id,
        table_uri=dataset.snapshot.uri,
        table_version=dataset.version,
        steps=steps,
        final_loss=loss_value,
        reward_mean=reward_mean,
        rows_read=rows_read,
        policy=policy,
    )


def _step(policy: TinyPolicy, optimizer: torch.optim.Optimizer, batch: TrajectoryBatch) -> tuple[float, int]:
    """One optimizer step; returns the loss and how many tokens it scored."""
    scored = batch["response_mask"].clone()
    scored[:, 0] = False
    new_logprobs = policy.logprobs(batch["input_ids"], batch["attention_mask"], where=scored)
    loss = policy_gradient_loss(new_logprobs, batch["advantages"], scored)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return float(loss.detach()), int(scored.sum())


def _cycle(dataset: TrajectoryDataset) -> Iterator[TrajectoryBatch]:
    """Pass over the dataset again and again, reshuffled each epoch."""
    epoch = 0
    while True:
        dataset.set_epoch(epoch)
        yielded = False
        for batch in dataset:
            yielded = True
            yield batch
        if not yielded:
            return
        epoch += 1


def _max_token_id(dataset: TrajectoryDataset) -> int:
    """The largest token id in the rows the dataset yields, so the policy's vocabulary fits."""
    found = (
        dataset.scan_rows()
        .select(
            pl.max_horizontal(
                pl.col("prompt_tokens").list.max().max(), pl.col("response_tokens").list.max().max()
            )
        )
        .collect()
        .item()
    )
    return int(found) if found is not None else 0
