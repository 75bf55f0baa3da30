"""`FifoSampler`: oldest rows first, each used at most `max_uses` times (1 = on-policy)."""

from __future__ import annotations

from typing import Any

import numpy as np

from consumers.replay.samplers.base import Mask, Positions, Sampler
from consumers.replay.storage import RowIndex


class FifoSampler(Sampler):
    """Hands out rows in arrival order and retires a row after `max_uses` deliveries.

    Args:
        max_uses: how many batches a row may appear in (1 for strictly on-policy training).
    """

    orders_oldest_first = True

    def __init__(self, max_uses: int = 1) -> None:
        if max_uses < 1:
            raise ValueError(f"max_uses must be at least 1, got max_uses={max_uses}")
        self.max_uses = max_uses
        self.uses = np.zeros(0, dtype=np.int32)

    def extend(self, count: int, rows: RowIndex) -> None:
        self.uses = np.concatenate([self.uses, np.zeros(count, dtype=np.int32)])

    def keep(self, keep: Mask) -> None:
        self.uses = self.uses[keep]

    def eligible(self, rows: RowIndex, version: int, at: Positions | None = None) -> Mask:
        return (self.uses if at is None else self.uses[at]) < self.max_uses

    def delivered(self, positions: Positions, rows: RowIndex, version: int) -> None:
        np.add.at(self.uses, positions, 1)

    def report(self) -> dict[str, float]:
        return {"rows_used_up": float((self.uses >= self.max_uses).sum())}

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "max_uses": self.max_uses, "uses": self.uses.copy()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.uses = np.asarray(state["uses"], dtype=np.int32).copy()
