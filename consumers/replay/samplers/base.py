"""`Sampler`: one concern of choosing rows, composable with others in a `SamplerStack`.

A sampler may restrict which rows are eligible (`eligible`), weigh them (`weights`), keep
per-row state aligned with the storage (`extend` / `keep`), and learn what was delivered
(`delivered`). Ineligibility must be permanent (a row used up, or too stale, never comes back),
since the storage evicts chunks in which no row is eligible. Every sampler's state carries a
schema version so older checkpoints still load.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from consumers.exceptions import CheckpointError
from consumers.replay.storage import RowIndex

Mask = npt.NDArray[np.bool_]
Weights = npt.NDArray[np.float64]
Positions = npt.NDArray[np.int64]


class Sampler:
    """The neutral sampler: every row eligible, equal weights, no state."""

    state_version = 1

    def extend(self, count: int, rows: RowIndex) -> None:
        """`count` rows were appended at the end of `rows` (already updated)."""

    def keep(self, keep: Mask) -> None:
        """Rows were evicted: keep the per-row state where `keep` is True."""

    def eligible(self, rows: RowIndex, version: int, at: Positions | None = None) -> Mask | None:
        """Which rows may be drawn at learner version `version`; None for all.

        With `at`, only the rows at those positions are judged (the mask is aligned with `at`),
        so checking a batch costs its size, not the buffer's.
        """
        return None

    def weights(self, rows: RowIndex, version: int) -> Weights | None:
        """Relative draw weight of each row; None for equal weights."""
        return None

    def delivered(self, positions: Positions, rows: RowIndex, version: int) -> None:
        """The rows at `positions` went out in a batch at learner version `version`."""

    def report(self) -> dict[str, float]:
        """Figures worth logging (e.g. a distance to a target mix)."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """This sampler's state, with its schema version."""
        return {"version": self.state_version}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict()` output (of this or an older schema version)."""
        found = state.get("version")
        if not isinstance(found, int) or found > self.state_version:
            raise CheckpointError(
                f"{type(self).__name__} state has schema version {found!r}; this rollstream reads "
                f"up to {self.state_version}: resume with the rollstream that wrote the checkpoint"
            )


def weighted_pick(
    candidates: Positions, weights: Weights | None, count: int, rng: np.random.Generator
) -> Positions:
    """Up to `count` distinct candidates, drawn with probability proportional to `weights`.

    Efraimidis-Spirakis keys (u ** (1 / w), largest first): exact weighted sampling without
    replacement in one vectorized pass; zero-weight candidates come last.
    """
    if count >= len(candidates):
        return candidates
    if weights is None:
        return np.sort(rng.choice(candidates, size=count, replace=False))
    u = rng.random(len(candidates))
    with np.errstate(divide="ignore"):
        keys = np.where(weights > 0, np.log(u) / np.where(weights > 0, weights, 1.0), -np.inf)
    chosen = np.argpartition(-keys, count - 1)[:count]
    return np.sort(candidates[chosen])
