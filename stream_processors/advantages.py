"""Group-relative advantages of one decided prompt group (GRPO and Dr. GRPO), pure functions.

Only members with a signal take part: "skipped", "error", "timeout" and "output_limit" verdicts (whose reward is
forced to 0 though nothing was judged) get advantage 0.0 and do not count towards the group's
statistics. A group with fewer than two signal members gets 0.0 everywhere.

- grpo:    advantage = (r - mean) / (std + epsilon), population std over the signal members;
- dr_grpo: advantage = r - mean (Dr. GRPO drops the std division, which favours easy and hard
  prompts).
With `per_component`, each named reward component is normalized within the group on its own and
the normalized components are summed (a reward without components counts as one component).
DAPO's overlong soft penalty, when configured, is added to the reward before anything else, and
the row stores the penalized reward with the penalty as the `overlong_penalty` component.
The band-pass filter flags a complete group whose success rate (share of "ok" verdicts among the
signal members) lies outside [lo, hi], or whose rewards have zero variance (a mean-only check
lets constant continuous rewards through, OpenRLHF #1270): its status becomes "filtered" and its
advantages are kept, so a learner can choose.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from schemas.defaults import StreamDefaults

EPSILON = 1e-6
NO_SIGNAL_STATUSES: frozenset[str] = frozenset({"skipped", "error", "timeout", "output_limit"})
ZERO_VARIANCE = 1e-12
OVERLONG_COMPONENT = "overlong_penalty"

AdvantageMode = Literal["grpo", "dr_grpo"]
ADVANTAGE_MODES: tuple[str, ...] = ("grpo", "dr_grpo")


@dataclass(frozen=True, slots=True)
class OverlongPenalty:
    """DAPO's soft overlong punishment on the response length L (tokens).

    0 for L <= max_tokens - cache_tokens; falls linearly to -1 at L = max_tokens; -1 beyond.
    """

    max_tokens: int
    cache_tokens: int

    def __post_init__(self) -> None:
        if not 0 < self.cache_tokens <= self.max_tokens:
            raise ValueError(
                f"overlong penalty needs 0 < cache_tokens <= max_tokens, got "
                f"cache_tokens={self.cache_tokens}, max_tokens={self.max_tokens}"
            )

    def __call__(self, response_tokens: int) -> float:
        start = self.max_tokens - self.cache_tokens
        if response_tokens <= start:
            return 0.0
        if response_tokens <= self.max_tokens:
            return (start - response_tokens) / self.cache_tokens
        return -1.0


@dataclass(frozen=True, slots=True)
class GroupNormalization:
    """How a decided group's advantages are computed (see the module docstring).

    Attributes:
        mode: "grpo" or "dr_grpo".
        epsilon: added to the std in grpo mode.
        per_component: normalize each reward component within the group, then sum.
        band_pass: (lo, hi) success-rate band of complete groups kept unflagged; None disables
            the filter (zero-variance groups are flagged only when it is enabled).
        overlong: DAPO's overlong soft penalty, or None.
    """

    mode: AdvantageMode = StreamDefaults.advantage
    epsilon: float = EPSILON
    per_component: bool = StreamDefaults.per_component
    band_pass: tuple[float, float] | None = None
    overlong: OverlongPenalty | None = None

    def __post_init__(self) -> None:
        if self.mode not in ADVANTAGE_MODES:
            raise ValueError(f"mode must be one of {ADVANTAGE_MODES}, got mode={self.mode!r}")
        if self.band_pass is not None:
            lo, hi = self.band_pass
            if not 0.0 <= lo <= hi <= 1.0:
                raise ValueError(f"band_pass must be 0 <= lo <= hi <= 1, got band_pass={self.band_pass}")


@dataclass(slots=True)
class Member:
    """What normalization needs of one sample."""

    reward: float
    status: str
    components: Mapping[str, float]
    response_tokens: int


@dataclass(frozen=True, slots=True)
class GroupOutcome:
    """Per member: the (penalized) reward, its components and the advantage; and the group's status."""

    rewards: list[float]
    components: list[dict[str, float]]
    advantages: list[float]
    status: str


def normalized(values: npt.NDArray[np.float64], mode: str, epsilon: float) -> npt.NDArray[np.float64]:
    """Center (dr_grpo) or standardize (grpo) values within the group.

    The same float64 arithmetic as `values - values.mean()` and `values.std()` (numpy's sum, the
    division by the count, squares summed, square root), without their wrappers, which cost more
    than the sums on a group of 8.
    """
    centered = _centered(values)
    if mode == "dr_grpo":
        return centered
    return centered / (_population_std(centered) + epsilon)


def _centered(values: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """Values minus their mean, as `values - values.mean()`."""
    return values - np.add.reduce(values) / len(values)


def _population_std(centered: npt.NDArray[np.float64]) -> float:
    """The population std of values whose mean was subtracted (`centered`), as numpy's std."""
    return math.sqrt(np.add.reduce(centered * centered) / len(centered))


def decide_group(members: Sequence[Member], config: GroupNormalization, *, status: str) -> GroupOutcome:
    """Rewards, advantages and final status of one decided group (`status` as released)."""
    rewards, components = [], []
    for m in members:
        parts = dict(m.components)
        reward = m.reward
        if config.overlong is not None and m.status not in NO_SIGNAL_STATUSES:
            penalty = config.overlong(m.response_tokens)
            parts[OVERLONG_COMPONENT] = penalty
            reward += penalty
        rewards.append(reward)
        components.append(parts)
    signal = [i for i, m in enumerate(members) if m.status not in NO_SIGNAL_STATUSES]
    advantages = [0.0] * len(members)
    values = np.array([rewards[i] for i in signal], dtype=np.float64)
    if len(signal) >= 2:
        if config.per_component:
            names = sorted({name for i in signal for name in components[i]})
            total = np.zeros(len(signal), dtype=np.float64)
            if not names:
                total = normalized(values, config.mode, config.epsilon)
            for name in names:
                part = np.array([components[i].get(name, 0.0) for i in signal], dtype=np.float64)
                total += normalized(part, config.mode, config.epsilon)
        else:
            total = normalized(values, config.mode, config.epsilon)
        for i, advantage in zip(signal, total.tolist(), strict=True):
            advantages[i] = advantage
    if status == "complete" and config.band_pass is not None:
        lo, hi = config.band_pass
        ok = sum(1 for i in signal if members[i].status == "ok")
        rate = ok / len(signal) if signal else 0.0
        flat = len(signal) < 2 or _population_std(_centered(values)) <= ZERO_VARIANCE
        if flat or not lo <= rate <= hi:
            status = "filtered"
    return GroupOutcome(rewards, components, advantages, status)


def group_advantages(
    group_ids: Sequence[str], rewards: Sequence[float], statuses: Sequence[str], mode: str = "grpo"
) -> npt.NDArray[np.float64]:
    """Advantages of parallel lists as if each group_id's records were its whole group (offline check)."""
    if not len(group_ids) == len(rewards) == len(statuses):
        raise ValueError(
            f"group_ids, rewards and statuses must be parallel, got lengths "
            f"{len(group_ids)}, {len(rewards)}, {len(statuses)}"
        )
    values = np.asarray(rewards, dtype=np.float64)
    out = np.zeros(len(values), dtype=np.float64)
    members: defaultdict[str, list[int]] = defaultdict(list)
    for i, (group, status) in enumerate(zip(group_ids, statuses, strict=True)):
        if status not in NO_SIGNAL_STATUSES:
            members[group].append(i)
    for index in members.values():
        if len(index) >= 2:
            out[index] = normalized(values[index], mode, EPSILON)
    return out
