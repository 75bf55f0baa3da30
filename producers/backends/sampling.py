"""The sampling distribution of one step: temperature, then top-k, then top-p, as log-probabilities."""

from __future__ import annotations

import torch

from producers.backends.base import SamplingParams


def processed_logprobs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Log-probabilities (float32, shape of `logits`) of the distribution tokens are drawn from.

    Tokens cut by top-k or top-p get -inf. Temperature 0 is a point mass on the argmax (logprob 0).
    Top-p keeps the smallest set of most likely tokens whose mass reaches `top_p`.
    """
    logits = logits.float()
    if params.temperature == 0:
        out = torch.full_like(logits, float("-inf"))
        return out.scatter_(-1, logits.argmax(dim=-1, keepdim=True), 0.0)
    scaled = logits / params.temperature
    if params.top_k is not None and params.top_k < scaled.shape[-1]:
        kth = torch.topk(scaled, params.top_k, dim=-1).values[..., -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if params.top_p < 1.0:
        ordered, order = torch.sort(scaled, dim=-1, descending=True)
        probs = torch.softmax(ordered, dim=-1)
        mass_before = torch.cumsum(probs, dim=-1) - probs
        cut = mass_before >= params.top_p
        cut[..., 0] = False
        scaled = scaled.scatter(-1, order, ordered.masked_fill(cut, float("-inf")))
    return torch.log_softmax(scaled, dim=-1)


def draw(logprobs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One token per row of `logprobs` (B, V), drawn with `generator`; shape (B,)."""
    return torch.multinomial(logprobs.exp(), 1, generator=generator).squeeze(-1)
