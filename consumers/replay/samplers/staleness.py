"""`StalenessSampler`: a hard limit on lag (learner version - policy_version) and a freshness weight."""

from __future__ import annotations

from typing import Any

import numpy as np

from consumers.replay.samplers.base import Mask, Positions, Sampler, Weights
from consumers.replay.storage import RowIndex


class StalenessSampler(Sampler):
    """Never draws a row whose lag exceeds `max_lag`; weighs fresher rows up.

    The weight halves every `half_life` versions of lag (None: no weighting). A row's lag only
    grows, so a row past the limit is gone for good and its chunk may be evicted.

    Args:
        max_lag: largest allowed learner version - policy_version; None for no limit.
        half_life: lag at which a row's weight is half a fresh row's; None for equal weights.
    """

    def __init__(self, max_lag: int | None = 4, half_life: float | None = None) -> None:
        if max_lag is not None and max_lag < 0:
            raise ValueError(f"max_lag must be >= 0 or None, got max_lag={max_lag}")
        if half_life is not None and half_life <= 0:
            raise ValueError(f"half_life must be > 0 or None, got half_life={half_life}")
        self.max_lag = max_lag
        self.half_life = half_life

    def eligible(self, rows: RowIndex, version: int, at: Positions | None = None) -> Mask | None:
        if self.max_lag is None:
            return None
        return (version - (rows.policy_version if at is None else rows.policy_version[at])) <= self.max_lag

    def weights(self, rows: RowIndex, version: int) -> Weights | None:
        if self.half_life is None:
            return None
        lag = np.maximum(version - rows.policy_version, 0).astype(np.float64)
        return np.exp2(-lag / self.half_life)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "max_lag": self.max_lag, "half_life": self.half_life}
