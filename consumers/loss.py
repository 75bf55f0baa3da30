"""The policy-gradient surrogates the learner minimizes.

`async_policy_loss` is the loss for asynchronous (off-policy) data: importance-corrected against
the behaviour logprobs stored in each row, with the decoupled PPO objective (AReaL) or truncated
importance sampling (verl's `rollout_is`), GRPO or Dr. GRPO aggregation and an optional k3 KL
term. `policy_gradient_loss` and `clipped_policy_loss` are the simpler token-mean surrogates.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from schemas.defaults import LearnerDefaults

Objective = Literal["decoupled_ppo", "tis"]
Aggregation = Literal["grpo", "dr_grpo"]
OBJECTIVES: tuple[Objective, ...] = ("decoupled_ppo", "tis")
AGGREGATIONS: tuple[Aggregation, ...] = ("grpo", "dr_grpo")
_LOG_RATIO_LIMIT = 20.0


def policy_gradient_loss(
    new_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    old_logprobs: torch.Tensor | None = None,
    clip_epsilon: float | None = None,
) -> torch.Tensor:
    """Token-mean REINFORCE / GRPO surrogate, optionally PPO-clipped.

    Without `clip_epsilon`: `-(A[:, None] * logp * mask).sum() / mask.sum()`, whose gradient is
    the policy gradient with each sequence's advantage on each of its tokens. With
    `clip_epsilon` (and `old_logprobs`), the per-token term is
    `min(r * A, clip(r, 1 - eps, 1 + eps) * A)` with `r = exp(logp - old_logp)`. Clipping only
    makes sense when `old_logprobs` came from this policy's earlier weights.

    Args:
        new_logprobs: (B, L) log-probs of the current policy.
        advantages: (B,) one advantage per sequence.
        mask: (B, L) True on the tokens that count (response tokens with a prefix).
        old_logprobs: (B, L) sampling log-probs, needed with `clip_epsilon`.
        clip_epsilon: PPO clip range; None for the plain surrogate.
    """
    weights = mask.to(new_logprobs.dtype)
    per_sequence = advantages.to(new_logprobs.dtype)[:, None]
    if clip_epsilon is None:
        per_token = per_sequence * new_logprobs
    else:
        if old_logprobs is None:
            raise ValueError("clip_epsilon needs old_logprobs: the ratio is exp(new - old)")
        ratio = torch.exp((new_logprobs - old_logprobs) * weights)
        clipped = ratio.clamp(1.0 - clip_epsilon, 1.0 + clip_epsilon)
        per_token = torch.minimum(ratio * per_sequence, clipped * per_sequence)
    return -(per_token * weights).sum() / weights.sum().clamp(min=1.0)


def clipped_policy_loss(
    new_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_epsilon: float = 0.2,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO-clipped surrogate against the stored sampling logprobs, plus an optional KL penalty.

    The importance ratio is `exp(logp - old_logp)` with the log-ratio clamped to [-20, 20] so a
    policy far from the fleet's sampler gives a finite ratio. With `ref_logprobs` and `kl_coef`
    the k3 estimator of KL(policy || reference), `exp(ref - logp) - (ref - logp) - 1`, is added
    per token. Returns the loss and its parts: `pg_loss`, `kl`, `clip_fraction` (the share of
    counted tokens whose ratio left the clip range), `ratio_mean`.
    """
    weights = mask.to(new_logprobs.dtype)
    count = weights.sum().clamp(min=1.0)
    log_ratio = ((new_logprobs - old_logprobs) * weights).clamp(-20.0, 20.0)
    ratio = torch.exp(log_ratio)
    per_sequence = advantages.to(new_logprobs.dtype)[:, None]
    clipped = ratio.clamp(1.0 - clip_epsilon, 1.0 + clip_epsilon)
    pg = -(torch.minimum(ratio * per_sequence, clipped * per_sequence) * weights).sum() / count
    loss = pg
    kl_value = 0.0
    if ref_logprobs is not None and kl_coef > 0:
        delta = ((ref_logprobs - new_logprobs) * weights).clamp(-20.0, 20.0)
        kl = ((torch.exp(delta) - delta - 1.0) * weights).sum() / count
        loss = loss + kl_coef * kl
        kl_value = float(kl.detach())
    outside = ((ratio < 1.0 - clip_epsilon) | (ratio > 1.0 + clip_epsilon)) & mask.bool()
    parts = {
        "pg_loss": float(pg.detach()),
        "kl": kl_value,
        "clip_fraction": float(outside.sum()) / float(count.detach()),
        "ratio_mean": float((ratio.detach() * weights).sum() / count),
    }
    return loss, parts


@dataclass(frozen=True)
class LossOptions:
    """How `async_policy_loss` weighs and aggregates the per-token terms.

    Attributes:
        objective: "decoupled_ppo": PPO clipped against the proximal policy (the behaviour policy
            when no proximal logprobs are given), times the detached weight pi_prox / pi_behav;
            "tis": the plain policy gradient times min(pi / pi_behav, tis_cap), detached.
        aggregation: "grpo": each sequence's token mean, then the mean over sequences with a
            loss token; "dr_grpo": each sequence's token sum divided by `max_length`, then the
            mean over all sequences (no length normalization, so long answers are not favoured).
        clip_epsilon: the PPO clip range below 1 (and above, unless `clip_epsilon_high`).
        clip_epsilon_high: the clip range above 1, if different (DAPO's clip-higher).
        behaviour_weight_cap: decoupled PPO drops tokens whose pi_prox / pi_behav exceeds it
            (None keeps all).
        tis_cap: the truncation C of the importance weight in "tis".
        max_length: the constant divisor of "dr_grpo": the generation length limit.
        kl_coef: weight of the k3 estimate of KL(pi || reference); needs reference logprobs.
    """

    objective: Objective = LearnerDefaults.objective
    aggregation: Aggregation = LearnerDefaults.aggregation
    clip_epsilon: float = LearnerDefaults.clip_epsilon
    clip_epsilon_high: float | None = None
    behaviour_weight_cap: float | None = None
    tis_cap: float = 2.0
    max_length: int | None = None
    kl_coef: float = LearnerDefaults.kl_coef

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES or self.aggregation not in AGGREGATIONS:
            raise ValueError(
                f"objective must be one of {OBJECTIVES} and aggregation one of {AGGREGATIONS}, got "
                f"objective={self.objective!r}, aggregation={self.aggregation!r}"
            )
        high = self.clip_epsilon if self.clip_epsilon_high is None else self.clip_epsilon_high
        if not 0 < self.clip_epsilon < 1 or high <= 0:
            raise ValueError(
                f"need 0 < clip_epsilon < 1 and clip_epsilon_high > 0, got clip_epsilon={self.clip_epsilon}, "
                f"clip_epsilon_high={self.clip_epsilon_high}"
            )
        if self.tis_cap <= 0 or (self.behaviour_weight_cap is not None and self.behaviour_weight_cap <= 0):
            raise ValueError(
                f"need tis_cap > 0 and behaviour_weight_cap > 0 (or None), got tis_cap={self.tis_cap}, "
                f"behaviour_weight_cap={self.behaviour_weight_cap}"
            )
        if self.aggregation == "dr_grpo" and (self.max_length is None or self.max_length < 1):
            raise ValueError(
                f"aggregation='dr_grpo' divides by a constant: set max_length to the generation limit "
                f"(>= 1), got max_length={self.max_length}"
            )
        if self.kl_coef < 0:
            raise ValueError(f"kl_coef must be >= 0, got kl_coef={self.kl_coef}")


def async_policy_loss(
    new_logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    options: LossOptions | None = None,
    cu_seqlens: torch.Tensor | None = None,
    proximal_logprobs: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The importance-corrected policy-gradient loss of a batch, and its statistics.

    Per-token tensors are (B, L) padded, or (1, T) packed with `cu_seqlens`; `advantages` has one
    value per sequence (B,). Tokens outside `mask` contribute nothing and get no gradient, even
    where their logprobs are not finite (padding). Log-ratios are clamped to [-20, 20].

    Args:
        new_logprobs: the policy's logprobs of the tokens, with gradient.
        behaviour_logprobs: the logprobs the tokens were sampled with (the row's `response_logprobs`).
        advantages: (B,) one advantage per sequence.
        mask: True on the tokens trained on (response tokens the policy generated).
        options: objective, aggregation and their constants (default `LossOptions()`).
        cu_seqlens: (B + 1,) sequence offsets of the packed layout; None for padded tensors.
        proximal_logprobs: decoupled PPO's proximal policy (e.g. the weights before this update);
            None makes it the behaviour policy.
        ref_logprobs: a reference policy's logprobs, for the KL statistic and term.
        entropy: the policy's per-token entropy, for the statistics only.

    Returns:
        The scalar loss and floats: `pg_loss`, `kl` (with reference logprobs), `ratio_mean`,
        `ratio_max`, `ratio_min` (pi / pi_prox for decoupled PPO, pi / pi_behav for tis),
        `clip_fraction` (tokens whose clip binds, so their gradient is zero), `is_weight_mean`,
        `is_weight_max`, `is_weight_p99` (the detached importance weights applied),
        `truncated_fraction` (tis: tokens at the cap; decoupled PPO: tokens dropped by the cap),
        `logprob_diff_abs_mean` (|pi - pi_behav| in log space), `entropy_mean`, `tokens`, `sequences`.

    Raises:
        ValueError: shapes that do not match, proximal logprobs with "tis", or `kl_coef` without
            reference logprobs.
    """
    options = options or LossOptions()
    if new_logprobs.shape != behaviour_logprobs.shape or new_logprobs.shape != mask.shape:
        raise ValueError(
            f"new_logprobs, behaviour_logprobs and mask must have one shape, got {tuple(new_logprobs.shape)}, "
            f"{tuple(behaviour_logprobs.shape)} and {tuple(mask.shape)}"
        )
    if proximal_logprobs is not None and options.objective == "tis":
        raise ValueError("objective='tis' weighs against the behaviour policy only: drop proximal_logprobs")
    if options.kl_coef > 0 and ref_logprobs is None:
        raise ValueError("kl_coef > 0 needs ref_logprobs (the reference policy's token logprobs)")
    sequence = _sequence_of(new_logprobs.shape, cu_seqlens, advantages.numel()).to(new_logprobs.device)
    keep = mask.bool()
    dtype = new_logprobs.dtype
    adv = advantages.to(dtype)[sequence]
    new = new_logprobs
    behaviour = behaviour_logprobs.to(dtype)

    def log_ratio(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.where(keep, a - b, torch.zeros_like(a)).clamp(-_LOG_RATIO_LIMIT, _LOG_RATIO_LIMIT)

    if options.objective == "decoupled_ppo":
        base = behaviour if proximal_logprobs is None else proximal_logprobs.to(dtype).detach()
        ratio = torch.exp(log_ratio(new, base))
        low = 1.0 - options.clip_epsilon
        high = 1.0 + (
            options.clip_epsilon if options.clip_epsilon_high is None else options.clip_epsilon_high
        )
        unclipped, clipped = -adv * ratio, -adv * ratio.clamp(low, high)
        per_token = torch.maximum(unclipped, clipped)
        binds = (clipped.detach() > unclipped.detach()) & keep
        weight = torch.exp(log_ratio(base, behaviour)).detach()
        dropped = torch.zeros_like(keep)
        if options.behaviour_weight_cap is not None:
            dropped = (weight > options.behaviour_weight_cap) & keep
            keep = keep & ~dropped
        per_token = per_token * weight
        truncated = dropped
    else:
        ratio = torch.exp(log_ratio(new, behaviour))
        weight = ratio.detach().clamp(max=options.tis_cap)
        per_token = -adv * weight * torch.where(keep, new, torch.zeros_like(new))
        binds = torch.zeros_like(keep)
        truncated = (ratio.detach() >= options.tis_cap) & keep
    pg = _aggregate(per_token, keep, sequence, advantages.numel(), options)
    loss = pg
    stats: dict[str, float] = {"pg_loss": float(pg.detach())}
    if ref_logprobs is not None:
        delta = log_ratio(ref_logprobs.to(dtype), new)
        kl = _aggregate(torch.exp(delta) - delta - 1.0, keep, sequence, advantages.numel(), options)
        if options.kl_coef > 0:
            loss = loss + options.kl_coef * kl
        stats["kl"] = float(kl.detach())
    stats.update(_token_stats(ratio, weight, binds, truncated, new, behaviour, entropy, mask.bool()))
    stats["sequences"] = float(advantages.numel())
    return loss, stats


def _sequence_of(shape: torch.Size, cu_seqlens: torch.Tensor | None, sequences: int) -> torch.Tensor:
    """The sequence index of every token, shaped like the per-token tensors."""
    if cu_seqlens is None:
        if len(shape) != 2 or shape[0] != sequences:
            raise ValueError(
                f"padded per-token tensors must be (B, L) with B = {sequences} advantages, got {tuple(shape)}; "
                "pass cu_seqlens for the packed layout"
            )
        return torch.arange(sequences)[:, None].expand(shape)
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    if len(shape) != 2 or shape[0] != 1 or int(cu_seqlens[-1]) != shape[1] or lengths.numel() != sequences:
        raise ValueError(
            f"packed per-token tensors must be (1, T) with T = cu_seqlens[-1] and one advantage per sequence, got "
            f"{tuple(shape)}, cu_seqlens ending at {int(cu_seqlens[-1])} with {lengths.numel()} sequences and "
            f"{sequences} advantages"
        )
    return torch.repeat_interleave(torch.arange(sequences, device=lengths.device), lengths)[None]


def _aggregate(
    per_token: torch.Tensor, keep: torch.Tensor, sequence: torch.Tensor, sequences: int, options: LossOptions
) -> torch.Tensor:
    values = torch.where(keep, per_token, torch.zeros_like(per_token)).reshape(-1)
    index = sequence.reshape(-1)
    sums = values.new_zeros(sequences).index_add(0, index, values)
    if options.aggregation == "dr_grpo":
        assert options.max_length is not None  # checked by LossOptions
        return sums.sum() / (options.max_length * max(sequences, 1))
    counts = values.new_zeros(sequences).index_add(0, index, keep.reshape(-1).to(values.dtype))
    present = counts > 0
    if not bool(present.any()):
        return values.sum() * 0.0
    return (sums[present] / counts[present]).mean()


def _token_stats(
    ratio: torch.Tensor,
    weight: torch.Tensor,
    binds: torch.Tensor,
    truncated: torch.Tensor,
    new: torch.Tensor,
    behaviour: torch.Tensor,
    entropy: torch.Tensor | None,
    mask: torch.Tensor,
) -> dict[str, float]:
    count = int(mask.sum())
    if count == 0:
        nothing = ("ratio_mean", "ratio_max", "ratio_min", "clip_fraction", "is_weight_mean", "is_weight_max",
                   "is_weight_p99", "truncated_fraction", "logprob_diff_abs_mean")  # fmt: skip
        out = dict.fromkeys(nothing, 0.0)
        if entropy is not None:
            out["entropy_mean"] = 0.0
        return {**out, "tokens": 0.0}
    r, w = ratio.detach()[mask].float(), weight.detach()[mask].float()
    out = {
        "ratio_mean": float(r.mean()),
        "ratio_max": float(r.max()),
        "ratio_min": float(r.min()),
        "clip_fraction": float(binds.sum()) / count,
        "is_weight_mean": float(w.mean()),
        "is_weight_max": float(w.max()),
        "is_weight_p99": float(torch.quantile(w, 0.99)) if w.numel() <= 16_000_000 else float(w.max()),
        "truncated_fraction": float(truncated.sum()) / count,
        "logprob_diff_abs_mean": float((new.detach()[mask] - behaviour[mask]).abs().float().mean()),
        "tokens": float(count),
    }
    if entropy is not None:
        out["entropy_mean"] = float(entropy.detach()[mask].float().mean())
    return out
