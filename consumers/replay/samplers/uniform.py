"""`UniformSampler`: every stored row equally likely (the default draw)."""

from __future__ import annotations

from consumers.replay.samplers.base import Sampler


class UniformSampler(Sampler):
    """Draws uniformly among eligible rows; the stack draws this way unless another sampler orders."""
