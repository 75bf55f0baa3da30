"""`learn`: importance-corrected policy-gradient steps on batches from the replay buffer, in MLflow.

The policy is any torch policy by name or import path (`consumers.policies.load_policy`); the loss
is `consumers.loss.async_policy_loss` against the behaviour logprobs stored in each row, over the
tokens of the row's loss mask. With `publish` the learner's version is the number of the last
weights it published (`consumers.versioning`), so staleness (learner version - a row's policy
version) counts published updates; without it the version is its count of optimizer steps. Every
`checkpoint_every` steps the weights, the optimizer and the buffer's position go into one file,
atomically, so a restarted learner continues exactly where the checkpoint stands; with a
checkpoint present `learn` resumes from it and continues its MLflow run.
"""

from __future__ import annotations

import copy
import json
import re
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, cast

import torch

from consumers.exceptions import BufferExhausted, CheckpointError, EmptySnapshotError, RateLimitTimeout
from consumers.learner_metrics import LearnerMetrics
from consumers.loss import Aggregation, LossOptions, Objective, async_policy_loss
from consumers.policies import load_policy, token_logprobs_packed, token_logprobs_padded
from consumers.replay import ReplayBuffer, ReplayConfig, load_checkpoint, save_checkpoint
from consumers.replay.collate import PackedBatch, ReplayBatch
from consumers.tracking import check_tracking_uri, track_run
from consumers.versioning import PublishOptions, VersionKeeper
from schemas.defaults import LearnerDefaults
from schemas.policy_version import PolicyVersion

_METRIC_NAME = re.compile(r"[^A-Za-z0-9_\-./ :]")
_LAG_BINS = ((0, 0, "0"), (1, 1, "1"), (2, 3, "2_3"), (4, 7, "4_7"), (8, None, "8_plus"))
_FOLLOW_WAIT_S = 5.0


@dataclass(frozen=True)
class LearnResult:
    """What a `learn` call did; `reward_mean` is over every row it trained on, `policy` as trained."""

    run_id: str
    experiment_id: str
    table_uri: str
    table_version: int
    first_table_version: int
    steps: int
    resumed_from: int
    final_loss: float
    reward_mean: float
    rows_trained: int
    tokens_trained: int
    padding_waste: float
    bucket_distance: float
    policy_version: int = -1
    policy: torch.nn.Module | None = field(default=None, repr=False, compare=False)

    def as_dict(self) -> dict[str, str | int | float]:
        """The figures of the run, without the trained policy."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "policy"}


@dataclass(frozen=True, kw_only=True)
class LearnerOptions:
    """How `learn` trains; its `ReplayConfig` says what it reads and draws (its seed seeds torch too).

    Attributes:
        experiment: MLflow experiment name (created if missing).
        steps: optimizer steps in total (a resumed run counts its earlier steps); None: until no
            row is left to draw, or with `ReplayConfig.follow` until `stop` or an interrupt.
        policy: "tiny", "transformer" or "module:factory" (built with vocab_size and dim).
        dim: the policy's width.
        objective: "decoupled_ppo" or "tis" (`consumers.loss.LossOptions`).
        aggregation: "grpo" (token mean per sequence) or "dr_grpo" (sum over max_length).
        lr: AdamW learning rate.
        clip_epsilon: PPO clip range of the importance ratio against the stored logprobs.
        kl_coef: weight of the KL penalty to the initial policy (0: none, no reference kept).
        device: "cpu" or "cuda" (batches copied from pinned memory, non-blocking).
        checkpoint_path: one file for weights, optimizer and buffer position; resumed if present.
        checkpoint_every: steps between checkpoints (and one at the end).
        rows_log: a JSON-lines file naming each step's rows (audits, lineage).
    """

    experiment: str = LearnerDefaults.experiment
    steps: int | None = LearnerDefaults.steps
    policy: str = LearnerDefaults.policy
    dim: int = LearnerDefaults.dim
    objective: Objective = LearnerDefaults.objective
    aggregation: Aggregation = LearnerDefaults.aggregation
    lr: float = LearnerDefaults.lr
    clip_epsilon: float = LearnerDefaults.clip_epsilon
    kl_coef: float = LearnerDefaults.kl_coef
    device: str = LearnerDefaults.device
    checkpoint_path: str | Path | None = None
    checkpoint_every: int = LearnerDefaults.checkpoint_every
    rows_log: str | Path | None = None

    def __post_init__(self) -> None:
        if (self.steps is not None and self.steps < 1) or self.lr <= 0:
            raise ValueError(f"need steps >= 1 (or None) and lr > 0, got steps={self.steps}, lr={self.lr}")
        if not 0 < self.clip_epsilon < 1 or self.kl_coef < 0 or self.checkpoint_every < 1:
            raise ValueError(
                f"need 0 < clip_epsilon < 1, kl_coef >= 0, checkpoint_every >= 1, got {self.clip_epsilon}, "
                f"{self.kl_coef}, {self.checkpoint_every}"
            )


def learn(
    replay: ReplayConfig,
    options: LearnerOptions | None = None,
    *,
    tracking_uri: str,
    publish: PublishOptions | None = None,
    on_publish: Callable[[PolicyVersion, torch.nn.Module], None] | None = None,
    progress: Callable[[str], None] | None = None,
    stop: threading.Event | None = None,
    on_step: Callable[[int, int | None], None] | None = None,
    metrics: LearnerMetrics | None = None,
) -> LearnResult:
    """Train on `replay.table_uri` through a `ReplayBuffer`, log to MLflow, checkpoint.

    Without `replay.follow` the buffer reads to the table's latest version at start and the run
    ends after `options.steps` or when no row is left to draw; with it the run tails the table.

    Args:
        replay: what to read, how to draw and how to batch.
        options: how to train; default `LearnerOptions()`.
        tracking_uri: an explicit MLflow store, e.g. `sqlite:////abs/path/mlflow.db`.
        publish: publish weights by version every `publish.every` steps (the learner's version
            is then the published number); None: the version is the step count.
        on_publish: called with each published record and the policy (e.g. a held-out evaluation).
        progress: called with one line of text per step.
        stop: set it to end a following run after the current step.
        on_step: called with (step, total steps or None) after each step, for progress bars.
        metrics: `LearnerMetrics` to report steps and the buffer to (serve its registry).

    Raises:
        MissingTableError: no table at `replay.table_uri` (run `rollstream process` first).
        EmptySnapshotError: the read range holds no row the learner may train on.
        TrackingError: `tracking_uri` is not an explicit store URI.
        TokenRangeError: a token id outside [0, vocab_size).
    """
    options = options or LearnerOptions()
    check_tracking_uri(tracking_uri)
    keeper = None if publish is None else VersionKeeper(publish, on_publish=on_publish)
    learner = _Learner(
        options, replay, progress=progress, stop=stop or threading.Event(), on_step=on_step, keeper=keeper
    )
    learner.metrics = metrics
    if metrics is not None:
        metrics.watch(learner.buffer)
    return learner.run(tracking_uri=tracking_uri)


class _Learner:
    """The training loop's state: policy, optimizer, buffer and running tallies."""

    def __init__(
        self,
        options: LearnerOptions,
        config: ReplayConfig,
        *,
        progress: Callable[[str], None] | None,
        stop: threading.Event,
        on_step: Callable[[int, int | None], None] | None = None,
        keeper: VersionKeeper | None = None,
    ) -> None:
        torch.manual_seed(config.seed)
        self.options = options
        self.config = config
        self.progress = progress
        self.on_step = on_step
        self.stop = stop
        self.keeper = keeper
        self.device = torch.device(options.device)
        self.policy = cast(
            torch.nn.Module, load_policy(options.policy, vocab_size=config.vocab_size, dim=options.dim)
        ).to(self.device)
        self.loss_options = LossOptions(
            objective=options.objective,
            aggregation=options.aggregation,
            clip_epsilon=options.clip_epsilon,
            kl_coef=options.kl_coef,
            max_length=config.max_length if options.aggregation == "dr_grpo" else None,
        )
        self.reference = copy.deepcopy(self.policy).requires_grad_(False) if options.kl_coef > 0 else None
        self.optimizer = torch.optim.AdamW(self.policy.parameters(), lr=options.lr)
        self.buffer = ReplayBuffer(config)
        self.step = 0
        self.run_id: str | None = None
        self.bucket_counts: Counter[str] = Counter()
        self.totals = {"rows": 0, "tokens": 0, "slots": 0, "reward": 0.0}
        self.loss = float("nan")
        self.resumed_from = 0
        self.checkpoint_version: int | None = None
        self.metrics: LearnerMetrics | None = None
        self._resume()

    def _resume(self) -> None:
        if self.options.checkpoint_path is None:
            return
        state = load_checkpoint(self.options.checkpoint_path)
        if state is None:
            return
        saved, now = _position_settings(state["replay_config"]), _position_settings(_comparable(self.config))
        if saved != now:
            changed = sorted(k for k in set(saved) | set(now) if saved.get(k) != now.get(k))
            raise CheckpointError(
                f"{self.options.checkpoint_path} was written with other replay settings ({', '.join(changed)}: "
                f"{[saved.get(k) for k in changed]} then, {[now.get(k) for k in changed]} now): resume with "
                "the same settings, or pass another checkpoint path to start afresh"
            )
        self.policy.load_state_dict(state["policy"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.reference is not None and state.get("reference") is not None:
            self.reference.load_state_dict(state["reference"])
        self.buffer.load_state_dict(state["buffer"])
        torch.set_rng_state(state["torch_rng"])
        self.step = self.resumed_from = int(state["step"])
        self.checkpoint_version = state.get("version")
        self.run_id = state["run_id"]
        self.bucket_counts = Counter(state["bucket_counts"])
        self.totals = dict(state["totals"])

    def _save(self, *, version: int | None = None) -> None:
        """Write the checkpoint; `version` overrides the recorded version (the one about to be published)."""
        if self.options.checkpoint_path is None:
            return
        save_checkpoint(
            self.options.checkpoint_path,
            {
                "step": self.step,
                "version": self.version if version is None else version,
                "run_id": self.run_id,
                "policy": self.policy.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "reference": None if self.reference is None else self.reference.state_dict(),
                "buffer": self.buffer.state_dict(),
                "torch_rng": torch.get_rng_state(),
                "replay_config": _comparable(self.config),
                "bucket_counts": dict(self.bucket_counts),
                "totals": dict(self.totals),
            },
        )

    def run(self, *, tracking_uri: str) -> LearnResult:
        params = {**asdict(self.options), **_comparable(self.config), "profile_id": self.buffer.profile.id}
        params.pop("table_uri")
        with (
            track_run(
                tracking_uri=tracking_uri,
                experiment=self.options.experiment,
                table_uri=self.buffer.uri,
                params=params,
                run_id=self.run_id,
            ) as run,
            self.buffer,
        ):
            self.run_id = run.run_id
            if self.keeper is not None:
                self.keeper.start(
                    self.policy, step=self.step, checkpoint_version=self.checkpoint_version, run_id=run.run_id
                )
            if self.resumed_from == 0:
                run.log_text(self.buffer.profile.to_toml(), f"profile/{_profile_file(self.config)}")
            while self.options.steps is None or self.step < self.options.steps:
                if self.stop.is_set():
                    break
                waited = time.perf_counter()
                batch = self._next_batch()
                if batch is None:
                    break
                wait_s = time.perf_counter() - waited
                run.log_step(self.step, {**self._train(batch), "sample_wait_s": wait_s})
                self._log_rows(batch)
                if self.keeper is not None and self.keeper.due(self.step):
                    self._save(version=self.keeper.version + 1)  # before: a restart publishes it
                    record = self.keeper.publish(
                        self.policy, step=self.step, run_id=run.run_id, table_version=self.buffer.read_to
                    )
                    run.log_step(self.step, {"policy_version": float(record.number)})
                elif self.step % self.options.checkpoint_every == 0:
                    self._save()
            if self.totals["rows"] == 0:
                raise EmptySnapshotError(
                    f"{self.buffer.uri!r} holds no row to train on in versions {self.config.start_version}.."
                    f"{self.buffer.end_version} with verifier_status in {self.config.statuses} and a "
                    "finite advantage (and, with profile matching, a bucket of the profile): let `rollstream process` "
                    "score more trajectories, pick other versions, or pass profile_matched=False (--no-profile-match)"
                )
            self._save()
            run.log_lineage(self.buffer.uri, self.config.start_version, self.buffer.read_to)
            summary = self._summary()
            run.log_summary(summary)
        return LearnResult(
            run_id=run.run_id,
            experiment_id=run.experiment_id,
            table_uri=self.buffer.uri,
            table_version=self.buffer.read_to,
            first_table_version=self.config.start_version,
            steps=self.step,
            resumed_from=self.resumed_from,
            final_loss=self.loss,
            reward_mean=summary["final_reward_mean"],
            rows_trained=int(self.totals["rows"]),
            tokens_trained=int(self.totals["tokens"]),
            padding_waste=summary["padding_waste_total"],
            bucket_distance=summary["bucket_distance_total"],
            policy_version=self.version,
            policy=self.policy,
        )

    @property
    def version(self) -> int:
        """The learner's version: the last published number with a keeper, else the step count."""
        return self.step if self.keeper is None else self.keeper.version

    def _next_batch(self) -> ReplayBatch | PackedBatch | None:
        while True:
            try:
                timeout = _FOLLOW_WAIT_S if self.config.follow else None
                return self.buffer.sample(self.version, timeout=timeout)
            except BufferExhausted:
                return None
            except RateLimitTimeout:
                if not self.config.follow:
                    raise
                if self.stop.is_set():
                    return None
                if self.progress is not None:
                    self.progress(
                        f"waiting for rows at step {self.step} (read to version {self.buffer.read_to})"
                    )

    def _train(self, batch: ReplayBatch | PackedBatch) -> dict[str, float]:
        started = time.perf_counter()
        new, old, scored, advantages, cu_seqlens, ref = self._score(batch)
        loss, parts = async_policy_loss(
            new,
            old,
            advantages,
            scored,
            options=self.loss_options,
            cu_seqlens=cu_seqlens,
            ref_logprobs=ref,
        )
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        lag = (self.version - batch["policy_versions"]).tolist()
        self.step += 1
        self.loss = float(loss.detach())
        seconds = max(time.perf_counter() - started, 1e-9)
        padded: Any = batch
        rows, tokens = len(padded["trajectory_ids"]), int(padded["tokens"])
        self.totals["rows"] += rows
        self.totals["tokens"] += tokens
        self.totals["slots"] += int(
            padded["attention_mask"].numel() if "attention_mask" in padded else tokens
        )
        self.totals["reward"] += float(padded["rewards"].sum())
        self.bucket_counts.update(padded["buckets"])
        metrics = {
            "loss": self.loss,
            **parts,
            "reward_mean": float(padded["rewards"].mean()),
            "learner_version": float(self.version),
            "rows": float(rows),
            "tokens": float(tokens),
            "padding_waste": float(padded["padding_waste"]),
            "samples_per_s": rows / seconds,
            "tokens_per_s": tokens / seconds,
            "staleness/mean": sum(lag) / max(len(lag), 1),
            "staleness/max": float(max(lag, default=0)),
            **_lag_histogram(lag),
            **_grouped_means("reward/domain", padded["domains"], padded["rewards"]),
            **_grouped_means("reward/task_type", padded["task_types"], padded["rewards"]),
            **self._bucket_mix(),
            **{
                f"buffer/{k}": v
                for k, v in self.buffer.stats().items()
                if "/" not in k and k != "bucket_distance"
            },
        }
        if self.progress is not None:
            total = self.options.steps if self.options.steps is not None else "inf"
            self.progress(
                f"step {self.step}/{total} loss={self.loss:.4f} clip={parts['clip_fraction']:.2f} "
                f"rows={rows} tokens={tokens} waste={padded['padding_waste']:.3f} read_to=v{self.buffer.read_to}"
            )
        if self.on_step is not None:
            self.on_step(self.step, self.options.steps)
        if self.metrics is not None:
            self.metrics.trained(lag, tokens, seconds, self.version)
        return metrics

    def _score(
        self, batch: ReplayBatch | PackedBatch
    ) -> tuple[
        torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None
    ]:
        """New, behaviour and reference logprobs of the trained tokens, their mask and the advantages."""
        move = self._to_device
        scored = move(batch["response_mask"]).clone()
        if "attention_mask" in batch:
            padded: ReplayBatch = batch  # type: ignore[assignment]
            ids, attention = move(padded["input_ids"]), move(padded["attention_mask"])
            scored[:, 0] = False

            def score(policy: Any) -> torch.Tensor:
                return token_logprobs_padded(policy, ids, attention, where=scored)

            cu_seqlens = None
        else:
            packed: PackedBatch = batch
            ids, positions = move(packed["input_ids"]), move(packed["position_ids"])
            cu_seqlens = move(packed["cu_seqlens"])
            scored &= positions > 0

            def score(policy: Any) -> torch.Tensor:
                return token_logprobs_packed(policy, ids, positions, cu_seqlens, where=scored)

        new = score(self.policy)
        ref = None
        if self.reference is not None:
            with torch.no_grad():
                ref = score(self.reference)
        return new, move(batch["old_logprobs"]), scored, move(batch["advantages"]), cu_seqlens, ref

    def _to_device(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.device.type == "cpu":
            return tensor
        return tensor.pin_memory().to(self.device, non_blocking=True)

    def _bucket_mix(self) -> dict[str, float]:
        total = max(sum(self.bucket_counts.values()), 1)
        targets = self.buffer.profile.targets
        out = {f"bucket_share/{n}": self.bucket_counts.get(n, 0) / total for n in targets}
        out.update({f"bucket_target/{n}": share for n, share in targets.items()})
        out["bucket_distance"] = (
            self.buffer.profile.distance(dict(self.bucket_counts)) if self.bucket_counts else 1.0
        )
        return out

    def _log_rows(self, batch: ReplayBatch | PackedBatch) -> None:
        if self.options.rows_log is None:
            return
        line = json.dumps({"step": self.step, "ids": batch["trajectory_ids"]})
        with Path(self.options.rows_log).open("a") as out:
            out.write(line + "\n")

    def _summary(self) -> dict[str, float]:
        rows = max(self.totals["rows"], 1)
        return {
            "final_loss": self.loss,
            "final_reward_mean": self.totals["reward"] / rows,
            "rows_trained": float(self.totals["rows"]),
            "tokens_trained": float(self.totals["tokens"]),
            "padding_waste_total": 1.0 - self.totals["tokens"] / max(self.totals["slots"], 1),
            "bucket_distance_total": self._bucket_mix()["bucket_distance"],
        }


def _comparable(config: ReplayConfig) -> dict[str, Any]:
    """The replay settings a checkpoint must match (and MLflow params), as plain values."""
    out = {f.name: getattr(config, f.name) for f in fields(config) if f.name != "storage_options"}
    out["statuses"] = ",".join(config.statuses)
    return {k: ("" if v is None else v) for k, v in out.items()}


def _position_settings(settings: dict[str, Any]) -> dict[str, Any]:
    """The settings that decide which rows a resumed run may see (not how long it waits or runs)."""
    loose = {"follow", "end_version", "sample_timeout_s", "poll_interval_s"}
    return {k: v for k, v in settings.items() if k not in loose}


def _profile_file(config: ReplayConfig) -> str:
    from schemas.profile import DEFAULT_PROFILE_FILE

    return Path(config.profile_path).name if config.profile_path else DEFAULT_PROFILE_FILE


def _lag_histogram(lag: list[int]) -> dict[str, float]:
    out = {}
    for low, high, name in _LAG_BINS:
        out[f"staleness/lag_{name}"] = float(sum(1 for x in lag if x >= low and (high is None or x <= high)))
    return out


def _grouped_means(prefix: str, names: list[str], values: torch.Tensor) -> dict[str, float]:
    sums: dict[str, float] = defaultdict(float)
    counts: Counter[str] = Counter()
    for name, value in zip(names, values.tolist(), strict=True):
        sums[name] += value
        counts[name] += 1
    return {f"{prefix}/{_METRIC_NAME.sub('_', n) or 'none'}": sums[n] / counts[n] for n in counts}
