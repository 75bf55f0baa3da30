"""Trajectories whose rollout worker already computed the reward."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from stream_processors.exceptions import NonFiniteValueError, VerifierInputError
from stream_processors.verifiers.base import Verdict, Verifier


class PrecomputedVerifier(Verifier):
    """Takes `precomputed_reward` as the reward; it must be present and finite."""

    name = "precomputed"

    def verify(self, record: Mapping[str, Any]) -> Verdict:
        """Return the worker's reward; raises if it is missing or not finite."""
        reward = record.get("precomputed_reward")
        if reward is None:
            raise VerifierInputError(
                f"precomputed trajectory {record.get('trajectory_id')!r} has precomputed_reward=None: "
                "send the reward, or use another task_type"
            )
        if not math.isfinite(reward):
            raise NonFiniteValueError(f"precomputed_reward={reward!r} is not finite: send a real number")
        return Verdict(float(reward), "ok", self.name)
