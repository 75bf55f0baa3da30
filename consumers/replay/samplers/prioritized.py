"""`PrioritizedSampler`: draws in proportion to priority ** alpha; priorities start at |advantage|."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from consumers.replay.samplers.base import Mask, Sampler, Weights
from consumers.replay.storage import RowIndex


class PrioritizedSampler(Sampler):
    """Prioritized replay over stored rows, with priorities the learner may update.

    A new row's priority is |advantage| + `epsilon` (rows the group normalization found
    uninformative, advantage near 0, are drawn rarely). `update(keys, priorities)` sets new
    priorities for rows named by their batch keys (e.g. the per-row loss magnitude).

    Args:
        alpha: 0 draws uniformly, 1 in proportion to priority.
        epsilon: floor added to every priority so that no row is never drawn.
    """

    def __init__(self, alpha: float = 0.6, epsilon: float = 1e-3) -> None:
        if alpha < 0:
            raise ValueError(f"alpha must be >= 0, got alpha={alpha}")
        if epsilon <= 0:
            raise ValueError(f"epsilon must be > 0, got epsilon={epsilon}")
        self.alpha = alpha
        self.epsilon = epsilon
        self.priority = np.zeros(0, dtype=np.float64)
        self._seq = np.zeros(0, dtype=np.int64)

    def extend(self, count: int, rows: RowIndex) -> None:
        fresh = np.abs(rows.advantage[-count:].astype(np.float64)) + self.epsilon
        self.priority = np.concatenate([self.priority, fresh])
        self._seq = rows.seq.copy()

    def keep(self, keep: Mask) -> None:
        self.priority = self.priority[keep]
        self._seq = self._seq[keep]

    def weights(self, rows: RowIndex, version: int) -> Weights:
        return self.priority**self.alpha

    def update(self, keys: npt.ArrayLike, priorities: npt.ArrayLike) -> int:
        """Set the priority of the rows with these keys (`batch['keys']`); returns how many are still stored."""
        keys_array = np.asarray(keys, dtype=np.int64)
        values = np.abs(np.asarray(priorities, dtype=np.float64)) + self.epsilon
        where = np.searchsorted(self._seq, keys_array)
        found = (where < len(self._seq)) & (self._seq[np.minimum(where, len(self._seq) - 1)] == keys_array)
        self.priority[where[found]] = values[found]
        return int(found.sum())

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "alpha": self.alpha,
            "priority": self.priority.copy(),
            "seq": self._seq.copy(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.priority = np.asarray(state["priority"], dtype=np.float64).copy()
        self._seq = np.asarray(state["seq"], dtype=np.int64).copy()
