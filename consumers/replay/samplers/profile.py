"""`ProfileSampler`: draws buckets in the inference workload profile's target shares.

Quotas follow the running deficit (what the mix delivered so far lacks against the targets),
so the delivered mix converges to the targets even when one draw falls short in a bucket.
`report()` gives the total-variation distance between the delivered mix and the targets.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from consumers.replay.samplers.base import Positions, Sampler, Weights
from consumers.replay.storage import RowIndex
from schemas.profile import WorkloadProfile

Pick = Callable[[Positions, Weights | None, int], Positions]


class ProfileSampler(Sampler):
    """Stratifies draws by the profile's buckets (rows outside every bucket are never drawn).

    Args:
        profile: the workload profile (schemas.profile.load_profile).
    """

    def __init__(self, profile: WorkloadProfile) -> None:
        self.profile = profile
        self.names = profile.names
        self.targets = np.asarray([profile.targets[n] for n in self.names], dtype=np.float64)
        self.counts = np.zeros(len(self.names), dtype=np.int64)

    def eligible(self, rows: RowIndex, version: int, at: Positions | None = None) -> np.ndarray:
        return (rows.bucket if at is None else rows.bucket[at]) < len(self.names)

    def allocate(self, available: np.ndarray, count: int) -> np.ndarray:
        """Rows per bucket for a draw of `count`: the running deficit, capped by what is available."""
        want = np.maximum((self.counts.sum() + count) * self.targets - self.counts, 0.0)
        want = want / want.sum() * count if want.sum() > 0 else self.targets * count
        quota = np.floor(want).astype(np.int64)
        for i in np.argsort(-(want - quota))[: count - int(quota.sum())]:
            quota[i] += 1
        return np.minimum(quota, available)

    def draw(
        self,
        rows: RowIndex,
        candidates: Positions,
        weights: Weights | None,
        count: int,
        pick: Pick,
        *,
        fill: bool = False,
    ) -> Positions:
        """Pick up to `count` candidates bucket by bucket, with `pick` inside each bucket.

        A bucket with too few rows gets fewer (the deficit carries over to later draws); with
        `fill` its share goes to the other buckets instead (for draining a finished read).
        """
        buckets = rows.bucket[candidates]
        available = np.bincount(buckets, minlength=len(self.names))[: len(self.names)]
        quota = self.allocate(available, count)
        short = min(count, int(available.sum())) - int(quota.sum()) if fill else 0
        for b in np.argsort(-(self.targets - self.mix_array())):  # a dry bucket's share goes to the others
            if short <= 0:
                break
            extra = min(short, int(available[b] - quota[b]))
            quota[b] += extra
            short -= extra
        chosen = []
        for b, q in enumerate(quota):
            if q <= 0:
                continue
            inside = buckets == b
            chosen.append(pick(candidates[inside], None if weights is None else weights[inside], int(q)))
        return np.sort(np.concatenate(chosen)) if chosen else candidates[:0]

    def delivered(self, positions: Positions, rows: RowIndex, version: int) -> None:
        codes = rows.bucket[positions]
        self.counts += np.bincount(codes[codes < len(self.names)], minlength=len(self.names))

    def distance(self) -> float:
        """Total-variation distance between the delivered bucket mix and the targets."""
        return self.profile.distance(dict(zip(self.names, self.counts.tolist(), strict=True)))

    def mix_array(self) -> np.ndarray:
        """Delivered share of each bucket, in bucket order."""
        return self.counts / max(int(self.counts.sum()), 1)

    def mix(self) -> dict[str, float]:
        """Delivered share of each bucket."""
        total = max(int(self.counts.sum()), 1)
        return {n: float(c) / total for n, c in zip(self.names, self.counts, strict=True)}

    def report(self) -> dict[str, float]:
        out = {"bucket_distance": self.distance()}
        for name, share in self.mix().items():
            out[f"bucket_share/{name}"] = share
            out[f"bucket_target/{name}"] = float(self.profile.targets[name])
        return out

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "profile_id": self.profile.id, "counts": self.counts.tolist()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.counts = np.asarray(state["counts"], dtype=np.int64)
