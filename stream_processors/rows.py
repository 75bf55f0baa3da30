"""What the stream stage computes for one trajectory, before it becomes a Delta row."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stream_processors.validation import TokenArrays
from stream_processors.verifiers.base import Verdict


@dataclass(slots=True)
class ScoredTrajectory:
    """A decoded, validated, judged trajectory with its bucket and normalized rewards.

    Attributes:
        record: the decoded Avro record (`schemas.TrajectoryRecord` shape).
        tokens: its packed sequences as numpy views.
        verdict: the verifier's judgement.
        bucket: the name of its length bucket in the active workload profile.
        advantage: reward normalized within its group (see advantages.py).
        domain_reward: reward standardized within its domain (domain_stats.py).
        group_status: how the group was decided: "complete", "filtered", "timed_out", "duplicate",
            "late" (groups.py, advantages.py); "batch" from `BatchProcessor.process` alone.
    """

    record: dict[str, Any]
    tokens: TokenArrays
    verdict: Verdict
    bucket: str
    advantage: float
    domain_reward: float
    group_status: str = "batch"

    @property
    def length(self) -> int:
        """Prompt plus response tokens."""
        return self.tokens.length
