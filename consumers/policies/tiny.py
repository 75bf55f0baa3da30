"""`TinyPolicy`: a small causal language model that makes the learner step real and CPU-fast.

It stands in for the real policy: an embedding, one GRU layer and a two-level class-factorized
softmax over a 32k vocabulary, p(token) = p(class) * p(token | class) (Goodman, 2001). Both
levels are exact, normalized softmaxes over about sqrt(vocab) entries, so scoring a token costs
about 2 * sqrt(vocab) * dim multiplies instead of vocab * dim: a plain 64 x 32k head spent about
4 s per 10k scored tokens on two cores, which would make the learner's step the demo's
bottleneck. So `TinyPolicy` scores tokens directly (`DirectScoring`, both layouts) and builds
full logits (`forward`, `packed_logits`) only on request, exactly but at vocab * dim per position:
fine for generation over short contexts, not for scoring training batches. A GRU reads left to
right, so the padded layout must be right-padded.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from consumers.exceptions import PolicyInputError
from consumers.policies.base import PackedIndex, check_packed, check_padded
from schemas.defaults import DEFAULT_VOCAB_SIZE


class TinyPolicy(nn.Module):
    """Embedding, GRU and factorized softmax head; `logprobs` scores each token given its prefix.

    Its logits are normalized log-probabilities (log p(class) + log p(token | class)).

    Args:
        vocab_size: token ids must lie in [0, vocab_size).
        dim: embedding and hidden width.
    """

    def __init__(self, *, vocab_size: int = DEFAULT_VOCAB_SIZE, dim: int = 64) -> None:
        super().__init__()
        if vocab_size < 2 or dim < 1:
            raise ValueError(f"need vocab_size >= 2 and dim >= 1, got vocab_size={vocab_size}, dim={dim}")
        self.vocab_size = vocab_size
        self.classes = 2 ** math.ceil(math.log2(vocab_size) / 2)
        self.per_class = math.ceil(vocab_size / self.classes)
        self.embed = nn.Embedding(vocab_size, dim)
        self.rnn = nn.GRU(dim, dim, batch_first=True)
        self.class_head = nn.Linear(dim, self.classes)
        self.class_embed = nn.Embedding(self.classes, dim)
        self.word_head = nn.Linear(dim, self.per_class)
        self.empty_classes: torch.Tensor
        self.register_buffer(
            "empty_classes", torch.arange(self.classes) * self.per_class >= vocab_size, persistent=False
        )

    def logprobs(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        where: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Log-probability of each token given the tokens before it, shape (B, L).

        `out[b, t] = log p(input_ids[b, t] | input_ids[b, :t])`: the hidden state at t - 1
        predicts token t (the standard shift), so the result aligns with `response_mask` and
        `old_logprobs`. Position 0 (no prefix), padding, and positions outside `where` (if
        given) are 0 and carry no gradient.
        """
        check_padded(input_ids, attention_mask)
        self._check_ids(input_ids)
        hidden, _ = self.rnn(self.embed(input_ids))
        scored = attention_mask[:, 1:].bool()
        if where is not None:
            scored = scored & where[:, 1:].bool()
        shifted = torch.zeros(scored.shape, dtype=hidden.dtype, device=hidden.device)
        if bool(scored.any()):
            shifted[scored] = self.score(hidden[:, :-1][scored], input_ids[:, 1:][scored])
        else:
            shifted = shifted + 0.0 * hidden.sum()
        return torch.cat([shifted.new_zeros((shifted.shape[0], 1)), shifted], dim=1)

    def packed_logprobs(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        cu_seqlens: torch.Tensor,
        where: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """`logprobs` of the packed layout, (1, T): each sequence scored on its own."""
        index = check_packed(input_ids, position_ids, cu_seqlens)
        ids, valid = (
            _to_grid(input_ids[0], index),
            _to_grid(torch.ones_like(input_ids[0], dtype=torch.bool), index),
        )
        grid_where = None if where is None else _to_grid(where[0].bool(), index)
        return self.logprobs(ids, valid, grid_where)[index.rows, index.cols][None]

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Full logits (B, L, V) of a right-padded batch, exact; costs vocab * dim per position."""
        check_padded(input_ids, attention_mask)
        valid = attention_mask.bool()
        if bool((valid[:, 1:] & ~valid[:, :-1]).any()):
            raise PolicyInputError(
                "TinyPolicy reads left to right and needs right padding: every row's attention_mask must be "
                "True then False; move the padding to the end of each row"
            )
        self._check_ids(input_ids)
        hidden, _ = self.rnn(self.embed(input_ids))
        return self.full_logprobs(hidden)

    def packed_logits(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, cu_seqlens: torch.Tensor
    ) -> torch.Tensor:
        """Full logits (1, T, V) of the packed layout, each sequence on its own."""
        index = check_packed(input_ids, position_ids, cu_seqlens)
        ids, valid = (
            _to_grid(input_ids[0], index),
            _to_grid(torch.ones_like(input_ids[0], dtype=torch.bool), index),
        )
        return self.forward(ids, valid)[index.rows, index.cols][None]

    def full_logprobs(self, states: torch.Tensor) -> torch.Tensor:
        """log p(token | state) for every token, (..., V) from (..., dim) states."""
        flat = states.reshape(-1, states.shape[-1])
        used = math.ceil(self.vocab_size / self.per_class)  # classes holding at least one token
        class_logits = self.class_head(flat).masked_fill(self.empty_classes, float("-inf"))
        class_logp = torch.log_softmax(class_logits, dim=-1)[:, :used]
        word_logits = self.word_head(flat[:, None, :] + self.class_embed.weight[None, :used])
        slots = torch.arange(used * self.per_class, device=flat.device).view(used, self.per_class)
        word_logp = torch.log_softmax(
            word_logits.masked_fill(slots >= self.vocab_size, float("-inf")), dim=-1
        )
        full = (class_logp[:, :, None] + word_logp).reshape(flat.shape[0], -1)[:, : self.vocab_size]
        return full.reshape(*states.shape[:-1], self.vocab_size)

    def score(self, states: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """log p(targets[i] | states[i]) for (N, dim) states and (N,) token ids."""
        cls = torch.div(targets, self.per_class, rounding_mode="floor")
        word = targets - cls * self.per_class
        class_logits = self.class_head(states).masked_fill(self.empty_classes, float("-inf"))
        class_logp = torch.log_softmax(class_logits, dim=-1)
        word_logits = self.word_head(states + self.class_embed(cls))
        slots = cls[:, None] * self.per_class + torch.arange(self.per_class, device=targets.device)
        word_logits = word_logits.masked_fill(slots >= self.vocab_size, float("-inf"))
        word_logp = torch.log_softmax(word_logits, dim=-1)
        return class_logp.gather(1, cls[:, None]).squeeze(1) + word_logp.gather(1, word[:, None]).squeeze(1)

    def _check_ids(self, input_ids: torch.Tensor) -> None:
        if input_ids.numel() == 0:
            return
        low, high = int(input_ids.min()), int(input_ids.max())
        if low < 0 or high >= self.vocab_size:
            raise PolicyInputError(
                f"token ids span [{low}, {high}] but the policy's vocabulary is "
                f"[0, {self.vocab_size}): build TinyPolicy(vocab_size=...) at least {high + 1}"
            )


def _to_grid(values: torch.Tensor, index: PackedIndex) -> torch.Tensor:
    """Packed (T,) values on a right-padded (B, W) grid (zeros / False elsewhere)."""
    grid = values.new_zeros((index.batch, index.width))
    grid[index.rows, index.cols] = values
    return grid
