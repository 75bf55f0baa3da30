"""`Policy`: what every policy model offers, and the token log-probabilities computed from it.

Two layouts. Padded: `input_ids` and a boolean `attention_mask`, both (B, L), right padding;
`forward` returns logits (B, L, V) whose position t predicts token t + 1. Packed (varlen, as in
`consumers.replay.collate.PackedBatch`): all sequences back to back in one (1, T) row,
`position_ids` restarting at 0 per sequence and int32 `cu_seqlens` (B + 1,) their cumulative
lengths; `packed_logits` returns (1, T, V) and never lets one sequence see another.

The helpers align scores with the tokens they score: `out[t] = log p(token t | tokens before t)`,
0 at each sequence's first position and on padding, the alignment of `old_logprobs` and
`response_mask` in the replay batches. A policy whose full logits are costly (a factorized head
over a large vocabulary) may also implement `DirectScoring`; the helpers then call it instead.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol, runtime_checkable

import torch

from consumers.exceptions import PolicyInputError


@runtime_checkable
class Policy(Protocol):
    """A causal language model over token ids in [0, vocab_size)."""

    vocab_size: int

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Logits (B, L, V) of the padded layout; the generation side calls the model this way."""
        ...

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Logits (B, L, V) for right-padded (B, L) ids; position t predicts token t + 1."""
        ...

    def packed_logits(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, cu_seqlens: torch.Tensor
    ) -> torch.Tensor:
        """Logits (1, T, V) of the packed layout; attention stays inside each sequence."""
        ...


@runtime_checkable
class DirectScoring(Protocol):
    """Optional: a policy that scores tokens without materializing (.., V) logits.

    Both methods follow the helpers' alignment; positions outside `where` (when given) are 0 and
    carry no gradient.
    """

    def logprobs(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, where: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Padded layout, (B, L)."""
        ...

    def packed_logprobs(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        cu_seqlens: torch.Tensor,
        where: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Packed layout, (1, T)."""
        ...


class PackedIndex(NamedTuple):
    """Where each packed token sits in a right-padded (batch, width) grid of the same sequences."""

    rows: torch.Tensor
    cols: torch.Tensor
    batch: int
    width: int


def packed_index(cu_seqlens: torch.Tensor, total: int) -> PackedIndex:
    """The grid coordinates of packed tokens 0..total-1; raises PolicyInputError on bad offsets."""
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 1:
        raise PolicyInputError(f"cu_seqlens must be 1-D (B + 1,), got shape {tuple(cu_seqlens.shape)}")
    cu = cu_seqlens.to(dtype=torch.long)
    lengths = cu[1:] - cu[:-1]
    if int(cu[0]) != 0 or int(cu[-1]) != total or bool((lengths < 0).any()):
        raise PolicyInputError(
            f"cu_seqlens must start at 0, never decrease and end at the packed length {total}, got "
            f"{cu_seqlens.tolist()[:8]}{'...' if cu_seqlens.numel() > 8 else ''} (last {int(cu[-1])}): "
            "build it as the cumulative sum of the sequence lengths with a leading 0"
        )
    batch = int(lengths.numel())
    rows = torch.repeat_interleave(torch.arange(batch, device=cu.device), lengths, output_size=total)
    cols = torch.arange(total, device=cu.device) - cu[:-1][rows]
    return PackedIndex(rows, cols, batch, int(lengths.max()) if batch else 0)


def check_padded(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> None:
    """Raise PolicyInputError unless ids and mask are both (B, L)."""
    if input_ids.dim() != 2 or input_ids.shape != attention_mask.shape:
        raise PolicyInputError(
            f"input_ids and attention_mask must both be (B, L), got {tuple(input_ids.shape)} "
            f"and {tuple(attention_mask.shape)}"
        )


def check_packed(
    input_ids: torch.Tensor, position_ids: torch.Tensor, cu_seqlens: torch.Tensor
) -> PackedIndex:
    """Raise PolicyInputError unless ids and positions are both (1, T) and cu_seqlens fits T."""
    if input_ids.dim() != 2 or input_ids.shape[0] != 1 or input_ids.shape != position_ids.shape:
        raise PolicyInputError(
            f"packed input_ids and position_ids must both be (1, T), got {tuple(input_ids.shape)} and "
            f"{tuple(position_ids.shape)}: pack the sequences back to back in one row"
        )
    return packed_index(cu_seqlens, int(input_ids.shape[1]))


def shifted_logprobs(logits: torch.Tensor, input_ids: torch.Tensor, scored: torch.Tensor) -> torch.Tensor:
    """`out[..., t] = log_softmax(logits[..., t - 1])[input_ids[..., t]]` where `scored`, else 0.

    Computed in float32 at least (the precision of stored behaviour logprobs).

    Args:
        logits: (N, L, V), position t predicting token t + 1.
        input_ids: (N, L).
        scored: (N, L) bool; must be False wherever t - 1 is not the same sequence's previous token
            (every first position, padding).
    """
    dtype = torch.promote_types(logits.dtype, torch.float32)
    out = torch.zeros(input_ids.shape, dtype=dtype, device=logits.device)
    take = scored[:, 1:]
    if not bool(take.any()):
        return out + 0.0 * logits.sum()
    rows = torch.log_softmax(logits[:, :-1][take].to(dtype), dim=-1)
    out[:, 1:][take] = rows.gather(1, input_ids[:, 1:][take][:, None]).squeeze(1)
    return out


def shifted_entropy(logits: torch.Tensor, scored: torch.Tensor) -> torch.Tensor:
    """Entropy of the distribution that produced token t, `H(softmax(logits[..., t - 1]))` where `scored`, else 0."""
    dtype = torch.promote_types(logits.dtype, torch.float32)
    out = torch.zeros(scored.shape, dtype=dtype, device=logits.device)
    take = scored[:, 1:]
    if bool(take.any()):
        logp = torch.log_softmax(logits[:, :-1][take].to(dtype), dim=-1)
        probs = logp.exp()
        out[:, 1:][take] = -torch.where(probs > 0, probs * logp, torch.zeros_like(logp)).sum(dim=-1)
    return out


def _padded_scored(attention_mask: torch.Tensor, where: torch.Tensor | None) -> torch.Tensor:
    scored = attention_mask.bool().clone()
    scored[:, 0] = False
    return scored if where is None else scored & where.bool()


def _packed_scored(index: PackedIndex, where: torch.Tensor | None) -> torch.Tensor:
    scored = (index.cols != 0)[None, :]
    return scored if where is None else scored & where.bool()


def token_logprobs_padded(
    policy: Policy,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    where: torch.Tensor | None = None,
) -> torch.Tensor:
    """Log-probability (B, L) of each token given its prefix; 0 at position 0, on padding and outside `where`."""
    check_padded(input_ids, attention_mask)
    if isinstance(policy, DirectScoring):
        return policy.logprobs(input_ids, attention_mask, where)
    logits = policy(input_ids, attention_mask)
    return shifted_logprobs(logits, input_ids, _padded_scored(attention_mask, where))


def token_logprobs_packed(
    policy: Policy,
    input_ids: torch.Tensor,
    position_ids: torch.Tensor,
    cu_seqlens: torch.Tensor,
    *,
    where: torch.Tensor | None = None,
) -> torch.Tensor:
    """Log-probability (1, T) of each packed token given its own sequence's prefix; 0 at each start."""
    index = check_packed(input_ids, position_ids, cu_seqlens)
    if isinstance(policy, DirectScoring):
        return policy.packed_logprobs(input_ids, position_ids, cu_seqlens, where)
    logits = policy.packed_logits(input_ids, position_ids, cu_seqlens)
    return shifted_logprobs(logits, input_ids, _packed_scored(index, where))


def token_entropy_padded(
    policy: Policy, input_ids: torch.Tensor, attention_mask: torch.Tensor
) -> torch.Tensor:
    """Entropy (B, L) of the next-token distribution each token was drawn from (full logits)."""
    check_padded(input_ids, attention_mask)
    return shifted_entropy(policy(input_ids, attention_mask), _padded_scored(attention_mask, None))


def token_entropy_packed(
    policy: Policy, input_ids: torch.Tensor, position_ids: torch.Tensor, cu_seqlens: torch.Tensor
) -> torch.Tensor:
    """Entropy (1, T) of the next-token distribution each packed token was drawn from (full logits)."""
    index = check_packed(input_ids, position_ids, cu_seqlens)
    logits = policy.packed_logits(input_ids, position_ids, cu_seqlens)
    return shifted_entropy(logits, _packed_scored(index, None))
