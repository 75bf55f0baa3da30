"""`TinyPolicy`: a small causal language model that makes the learner step real and CPU-fast.

It stands in for the real policy: an embedding, one GRU layer and a two-level class-factorized
softmax over a 32k vocabulary, p(token) = p(class) * p(token | class) (Goodman, 2001). Both
levels are exact, normalized softmaxes over about sqrt(vocab) entries, so scoring a token costs
about 2 * sqrt(vocab) * dim multiplies instead of vocab * dim: a plain 64 x 32k head spent about
4 s per 10k scored tokens on two cores, which would make the learner's step the demo's
bottleneck.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from consumers.exceptions import PolicyInputError

DEFAULT_VOCAB_SIZE = 32_768


class TinyPolicy(nn.Module):
    """Embedding, GRU and factorized softmax head; `logprobs` scores each token given its prefix.

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
        if input_ids.dim() != 2 or input_ids.shape != attention_mask.shape:
            raise PolicyInputError(
                f"input_ids and attention_mask must both be (B, L), got {tuple(input_ids.shape)} "
                f"and {tuple(attention_mask.shape)}"
            )
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
