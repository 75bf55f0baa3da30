"""`SamplerStack`: samplers composed: eligibility ANDed, weights multiplied, one draw.

The draw is stratified by bucket when a `ProfileSampler` is in the stack, oldest-first when a
sampler orders so (`FifoSampler`), and weighted-random otherwise (uniform when no sampler weighs).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from consumers.exceptions import CheckpointError
from consumers.replay.samplers.base import Mask, Positions, Sampler, Weights, weighted_pick
from consumers.replay.samplers.profile import ProfileSampler
from consumers.replay.storage import RowIndex


class SamplerStack(Sampler):
    """Several samplers acting as one.

    Args:
        samplers: the parts; an empty stack samples uniformly.
        seed: seeds the draws (the generator's state is checkpointed).
    """

    def __init__(self, samplers: Sequence[Sampler] = (), *, seed: int = 0) -> None:
        self.samplers = list(samplers)
        self.rng = np.random.default_rng(seed)
        profiles = [s for s in self.samplers if isinstance(s, ProfileSampler)]
        if len(profiles) > 1:
            raise ValueError("a SamplerStack takes at most one ProfileSampler")
        self.profile = profiles[0] if profiles else None
        self.oldest_first = any(getattr(s, "orders_oldest_first", False) for s in self.samplers)

    def extend(self, count: int, rows: RowIndex) -> None:
        for s in self.samplers:
            s.extend(count, rows)

    def keep(self, keep: Mask) -> None:
        for s in self.samplers:
            s.keep(keep)

    def eligible(self, rows: RowIndex, version: int, at: Positions | None = None) -> Mask:
        mask = np.ones(len(rows) if at is None else len(at), dtype=bool)
        for s in self.samplers:
            part = s.eligible(rows, version, at)
            if part is not None:
                mask &= part
        return mask

    def weights(self, rows: RowIndex, version: int) -> Weights | None:
        combined: Weights | None = None
        for s in self.samplers:
            part = s.weights(rows, version)
            if part is not None:
                combined = part if combined is None else combined * part
        return combined

    def draw(
        self, rows: RowIndex, version: int, count: int, *, exclude: Mask | None = None, drain: bool = False
    ) -> Positions:
        """Up to `count` distinct positions among eligible rows (minus `exclude`), in position order.

        `drain` (the read is finished) lets a stratified draw fill dry buckets from the others.
        """
        mask = self.eligible(rows, version)
        if exclude is not None:
            mask &= ~exclude
        candidates = np.flatnonzero(mask).astype(np.int64)
        weights = self.weights(rows, version)
        w = None if weights is None else weights[candidates]

        def pick(among: Positions, among_weights: Weights | None, n: int) -> Positions:
            if self.oldest_first:
                return among[:n]  # positions ascend with arrival order
            return weighted_pick(among, among_weights, n, self.rng)

        if self.profile is not None:
            return self.profile.draw(rows, candidates, w, count, pick, fill=drain)
        return pick(candidates, w, count)

    def delivered(self, positions: Positions, rows: RowIndex, version: int) -> None:
        for s in self.samplers:
            s.delivered(positions, rows, version)

    def report(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for s in self.samplers:
            out.update(s.report())
        return out

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "rng": self.rng.bit_generator.state,
            "parts": [(type(s).__name__, s.state_dict()) for s in self.samplers],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        names = [name for name, _ in state["parts"]]
        if names != [type(s).__name__ for s in self.samplers]:
            raise CheckpointError(
                f"the checkpoint's samplers are {names}, this run's are "
                f"{[type(s).__name__ for s in self.samplers]}: resume with the same sampler settings"
            )
        self.rng.bit_generator.state = state["rng"]
        for s, (_, part) in zip(self.samplers, state["parts"], strict=True):
            s.load_state_dict(part)
