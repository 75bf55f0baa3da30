"""`sample`: autoregressive generation from a policy's padded logits, for tests and CPU demos.

No KV cache: each step runs `policy(input_ids, attention_mask)` over the rows still generating
and reads the logits at each row's last token. The returned logprobs are those of the
distribution each token was drawn from, log_softmax(logits / temperature), so they equal the
policy's own token logprobs only at temperature 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from consumers.exceptions import PolicyInputError
from consumers.policies.base import Policy


@dataclass(frozen=True)
class Sample:
    """One generated response: its token ids (the eos included when it stopped on one), their logprobs."""

    tokens: list[int]
    logprobs: list[float]
    finish_reason: Literal["stop", "length"]


@torch.no_grad()
def sample(
    policy: Policy,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    eos_id: int | None = None,
    temperature: float = 1.0,
    generator: torch.Generator | None = None,
) -> list[Sample]:
    """Generate one response per prompt (repeat a prompt n times for a group of n).

    Args:
        policy: called as `policy(input_ids, attention_mask)` on right-padded rows.
        prompts: token ids, at least one per prompt.
        max_new_tokens: the most tokens a response may have; reaching it is finish reason "length".
        eos_id: the token that ends a response ("stop"); None to always run to the limit.
        temperature: > 0 scales the logits; 0 is greedy, with the policy's own (temperature 1) logprobs.
        generator: the random source of the draws, for reproducible samples.

    Raises:
        PolicyInputError: an empty prompt, or a negative limit or temperature.
    """
    if max_new_tokens < 0 or temperature < 0:
        raise PolicyInputError(
            f"need max_new_tokens >= 0 and temperature >= 0, got max_new_tokens={max_new_tokens}, "
            f"temperature={temperature}"
        )
    if any(len(p) == 0 for p in prompts):
        raise PolicyInputError("every prompt needs at least one token to condition on; got an empty prompt")
    device = _device(policy)
    batch = len(prompts)
    lengths = torch.tensor([len(p) for p in prompts], dtype=torch.long, device=device)
    width = int(lengths.max()) + max_new_tokens if batch else 0
    ids = torch.zeros(batch, width, dtype=torch.long, device=device)
    for row, prompt in enumerate(prompts):
        ids[row, : len(prompt)] = torch.as_tensor(list(prompt), dtype=torch.long, device=device)
    starts = lengths.clone()
    logprobs = torch.zeros(batch, max_new_tokens, dtype=torch.float32, device=device)
    active = torch.ones(batch, dtype=torch.bool, device=device)
    stopped = torch.zeros(batch, dtype=torch.bool, device=device)
    for _ in range(max_new_tokens):
        rows = active.nonzero().squeeze(1)
        if rows.numel() == 0:
            break
        span = int(lengths[rows].max())
        mask = torch.arange(span, device=device)[None, :] < lengths[rows, None]
        logits = policy(ids[rows, :span], mask)
        last = logits[torch.arange(rows.numel(), device=device), lengths[rows] - 1].float()
        if temperature == 0:
            logp = torch.log_softmax(last, dim=-1)
            chosen = logp.argmax(dim=-1)
        else:
            logp = torch.log_softmax(last / temperature, dim=-1)
            chosen = torch.multinomial(logp.exp(), 1, generator=generator).squeeze(1)
        logprobs[rows, lengths[rows] - starts[rows]] = logp.gather(1, chosen[:, None]).squeeze(1)
        ids[rows, lengths[rows]] = chosen
        lengths[rows] += 1
        if eos_id is not None:
            ended = rows[chosen == eos_id]
            active[ended] = False
            stopped[ended] = True
        active &= lengths - starts < max_new_tokens
    out = []
    for row in range(batch):
        begin, end = int(starts[row]), int(lengths[row])
        out.append(
            Sample(
                tokens=ids[row, begin:end].tolist(),
                logprobs=logprobs[row, : end - begin].tolist(),
                finish_reason="stop" if bool(stopped[row]) else "length",
            )
        )
    return out


def _device(policy: Policy) -> torch.device:
    if isinstance(policy, nn.Module):
        for parameter in policy.parameters():
            return parameter.device
    return torch.device("cpu")
