"""The policy-gradient surrogate the learner minimizes."""

from __future__ import annotations

import torch


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
