"""Per-domain running reward statistics (count, mean, M2), so that no domain dominates by scale.

Welford's update, weighted so that an optional decay forgets old rewards: each new reward first
scales the accumulated weight and M2 by `decay` (1.0 keeps everything). Accumulators of several
partitions merge exactly (Chan et al.), so the state can live per Kafka partition and move with it
while the worker standardizes by the merged view.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from schemas.defaults import StreamDefaults


@dataclass(slots=True)
class RunningStats:
    """Weighted count, mean and sum of squared deviations (M2) of one domain's rewards."""

    count: float = 0.0
    mean: float = 0.0
    m2: float = 0.0

    def add(self, value: float, *, decay: float = 1.0) -> None:
        """Fold one reward in; `decay` < 1 first shrinks the weight of everything seen before."""
        if decay != 1.0:
            self.count *= decay
            self.m2 *= decay
        self.count += 1.0
        delta = value - self.mean
        self.mean += delta / self.count
        self.m2 += delta * (value - self.mean)

    def merged(self, other: RunningStats) -> RunningStats:
        """The statistics of both samples together (Chan's parallel formula)."""
        if other.count == 0:
            return RunningStats(self.count, self.mean, self.m2)
        if self.count == 0:
            return RunningStats(other.count, other.mean, other.m2)
        count = self.count + other.count
        delta = other.mean - self.mean
        mean = self.mean + delta * other.count / count
        m2 = self.m2 + other.m2 + delta * delta * self.count * other.count / count
        return RunningStats(count, mean, m2)

    @property
    def std(self) -> float:
        """Population standard deviation (0 when fewer than two rewards)."""
        return math.sqrt(max(self.m2, 0.0) / self.count) if self.count >= 2 else 0.0

    def as_list(self) -> list[float]:
        """[count, mean, m2], the stored form."""
        return [self.count, self.mean, self.m2]


class DomainStats:
    """Running statistics per domain name.

    Args:
        decay: weight kept by everything seen before each new reward, in (0, 1]; 1.0 = no decay.
        warmup: a domain with fewer than this many rewards (weighted count) standardizes to 0.0.
        epsilon: added to the standard deviation.
    """

    def __init__(
        self,
        *,
        decay: float = StreamDefaults.domain_decay,
        warmup: int = StreamDefaults.domain_warmup,
        epsilon: float = 1e-6,
    ) -> None:
        if not 0.0 < decay <= 1.0:
            raise ValueError(f"decay must lie in (0, 1], got decay={decay}")
        if warmup < 2:
            raise ValueError(f"warmup must be >= 2 (a std needs two rewards), got warmup={warmup}")
        self.decay = decay
        self.warmup = warmup
        self.epsilon = epsilon
        self.domains: dict[str, RunningStats] = {}

    def add(self, domain: str, rewards: Iterable[float]) -> None:
        """Fold rewards of one domain in."""
        stats = self.domains.setdefault(domain, RunningStats())
        for reward in rewards:
            stats.add(reward, decay=self.decay)

    def state_dict(self) -> dict[str, list[float]]:
        """domain -> [count, mean, m2]."""
        return {name: s.as_list() for name, s in sorted(self.domains.items())}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Replace the statistics by a stored `state_dict`."""
        self.domains = {str(k): RunningStats(*(float(x) for x in v)) for k, v in state.items()}


def merge(parts: Iterable[DomainStats]) -> dict[str, RunningStats]:
    """The merged statistics of every domain over several partitions' accumulators."""
    out: dict[str, RunningStats] = {}
    for part in parts:
        for name, stats in part.domains.items():
            out[name] = out.get(name, RunningStats()).merged(stats)
    return out


def standardize(reward: float, stats: RunningStats | None, *, warmup: int, epsilon: float) -> float:
    """(reward - mean) / (std + epsilon) of its domain, or 0.0 while the domain is warming up."""
    if stats is None or stats.count < warmup:
        return 0.0
    return (reward - stats.mean) / (stats.std + epsilon)
