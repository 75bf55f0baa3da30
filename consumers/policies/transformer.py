"""`TransformerPolicy`: a small pre-norm causal transformer from torch's own layers.

Token embedding, rotary positions taken from position ids, `layers` blocks of RMSNorm, causal
multi-head self-attention (`scaled_dot_product_attention`) and a GELU MLP, a final norm and a head
tied to the embedding. Both layouts run the same attention on a (sequences, width) grid: the
padded layout as given, the packed layout scattered onto a right-padded grid inside each
attention call and gathered back, so a token attends only to earlier tokens of its own sequence
and the cost is sum-over-grid, never (T x T).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from consumers.exceptions import PolicyInputError
from consumers.policies.base import PackedIndex, check_packed, check_padded


class _Grid:
    """How a layer's tokens map onto a (B, W) attention grid, with each grid slot's validity."""

    def __init__(self, valid: torch.Tensor, index: PackedIndex | None) -> None:
        self.valid = valid
        self.index = index
        width = valid.shape[1]
        causal = torch.ones(width, width, dtype=torch.bool, device=valid.device).tril()
        eye = torch.eye(width, dtype=torch.bool, device=valid.device)
        # a query sees earlier valid keys; every slot sees itself, so padding rows stay finite
        self.mask = ((causal[None] & valid[:, None, :]) | eye[None])[:, None]

    def to_grid(self, x: torch.Tensor) -> torch.Tensor:
        """(B, W, ...) from the layer's token tensor ((B, W, ...) padded, (1, T, ...) packed)."""
        if self.index is None:
            return x
        grid = x.new_zeros((self.index.batch, self.index.width, *x.shape[2:]))
        grid[self.index.rows, self.index.cols] = x[0]
        return grid

    def from_grid(self, grid: torch.Tensor) -> torch.Tensor:
        """The layer's token tensor back from the grid."""
        if self.index is None:
            return grid
        return grid[self.index.rows, self.index.cols][None]


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class _Attention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.out = nn.Linear(dim, dim, bias=False)

    def forward(
        self, x: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor], grid: _Grid
    ) -> torch.Tensor:
        n, t, dim = x.shape
        q, k, v = self.qkv(x).view(n, t, 3, self.heads, dim // self.heads).unbind(dim=2)
        cos, sin = rotary
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        q, k, v = (grid.to_grid(z).transpose(1, 2) for z in (q, k, v))
        attended = F.scaled_dot_product_attention(q, k, v, attn_mask=grid.mask)
        return self.out(grid.from_grid(attended.transpose(1, 2)).reshape(n, t, dim))


class _Block(nn.Module):
    def __init__(self, dim: int, heads: int, mlp_ratio: int) -> None:
        super().__init__()
        self.attn_norm = nn.RMSNorm(dim)
        self.attn = _Attention(dim, heads)
        self.mlp_norm = nn.RMSNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp_ratio * dim), nn.GELU(), nn.Linear(mlp_ratio * dim, dim))

    def forward(
        self, x: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor], grid: _Grid
    ) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), rotary, grid)
        return x + self.mlp(self.mlp_norm(x))


class TransformerPolicy(nn.Module):
    """A causal transformer policy with full logits in both layouts.

    Args:
        vocab_size: token ids must lie in [0, vocab_size).
        dim: model width; a multiple of `heads` with an even head width (rotary).
        layers: number of blocks.
        heads: attention heads.
        mlp_ratio: MLP hidden width as a multiple of `dim`.
        rope_base: the rotary frequency base.
    """

    def __init__(
        self,
        *,
        vocab_size: int,
        dim: int = 64,
        layers: int = 2,
        heads: int = 4,
        mlp_ratio: int = 4,
        rope_base: float = 10_000.0,
    ) -> None:
        super().__init__()
        if vocab_size < 2 or layers < 1 or heads < 1 or mlp_ratio < 1:
            raise ValueError(
                f"need vocab_size >= 2, layers >= 1, heads >= 1, mlp_ratio >= 1, got vocab_size={vocab_size}, "
                f"layers={layers}, heads={heads}, mlp_ratio={mlp_ratio}"
            )
        if dim % heads or (dim // heads) % 2:
            raise ValueError(
                f"dim must split into `heads` heads of even width (rotary), got dim={dim}, heads={heads}"
            )
        self.vocab_size = vocab_size
        self.embed = nn.Embedding(vocab_size, dim)
        self.blocks = nn.ModuleList(_Block(dim, heads, mlp_ratio) for _ in range(layers))
        self.norm = nn.RMSNorm(dim)
        self.head = nn.Linear(dim, vocab_size, bias=False)
        self.head.weight = self.embed.weight
        nn.init.normal_(self.embed.weight, std=0.02)
        self.inv_freq: torch.Tensor
        half = dim // heads // 2
        self.register_buffer(
            "inv_freq", rope_base ** (-torch.arange(half, dtype=torch.float32) / half), persistent=False
        )

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Logits (B, L, V) of a padded batch; positions count the valid tokens before each one."""
        check_padded(input_ids, attention_mask)
        valid = attention_mask.bool()
        positions = (valid.long().cumsum(dim=1) - 1).clamp(min=0)
        return self._logits(input_ids, positions, _Grid(valid, None))

    def packed_logits(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, cu_seqlens: torch.Tensor
    ) -> torch.Tensor:
        """Logits (1, T, V) of sequences packed back to back; none attends across a boundary."""
        index = check_packed(input_ids, position_ids, cu_seqlens)
        valid = torch.zeros(index.batch, index.width, dtype=torch.bool, device=input_ids.device)
        valid[index.rows, index.cols] = True
        return self._logits(input_ids, position_ids, _Grid(valid, index))

    def _logits(self, input_ids: torch.Tensor, positions: torch.Tensor, grid: _Grid) -> torch.Tensor:
        if input_ids.numel():
            low, high = int(input_ids.min()), int(input_ids.max())
            if low < 0 or high >= self.vocab_size:
                raise PolicyInputError(
                    f"token ids span [{low}, {high}] but the policy's vocabulary is [0, {self.vocab_size}): "
                    f"build TransformerPolicy(vocab_size=...) at least {high + 1}"
                )
        angles = positions.to(self.inv_freq.dtype)[..., None] * self.inv_freq
        rotary = (angles.cos()[:, :, None, :], angles.sin()[:, :, None, :])
        x = self.embed(input_ids)
        for block in self.blocks:
            x = block(x, rotary, grid)
        return self.head(self.norm(x))
