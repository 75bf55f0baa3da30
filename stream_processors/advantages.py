"""A thin stand-in for GRPO normalization, computed within one batch.

advantage = (reward - group mean) / (group std + 1e-6) over the judged records of the group seen
in this batch; a group with one judged record gets 0.0. Records without a signal
(NO_SIGNAL_STATUSES: "skipped", and "error" and "timeout", whose reward is forced to 0 though
nothing was judged) get 0.0 and do not count towards their group's statistics. domain_reward is
the raw reward for now: per-domain running statistics and groups spanning batches arrive with the
stateful normalizer.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

EPSILON = 1e-6
NO_SIGNAL_STATUSES: frozenset[str] = frozenset({"skipped", "error", "timeout"})


def group_advantages(
    group_ids: Sequence[str], rewards: Sequence[float], statuses: Sequence[str]
) -> npt.NDArray[np.float64]:
    """Per-record advantages, normalized within each group_id's judged records in the batch."""
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
        if len(index) < 2:
            continue
        group_rewards = values[index]
        out[index] = (group_rewards - group_rewards.mean()) / (group_rewards.std() + EPSILON)
    return out


def domain_rewards(rewards: Sequence[float]) -> npt.NDArray[np.float64]:
    """The reward itself: a placeholder until per-domain running statistics exist."""
    return np.asarray(rewards, dtype=np.float64).copy()
