"""`RateLimiter`: when the learner may sample and when the buffer may take in more rows.

In Reverb's manner, a limiter counts inserted and sampled rows and answers two questions.
The fleet cannot be paused from here, so "may not insert" means the buffer leaves new table
versions in Delta until the learner catches up, and reports that the fleet is ahead.
"""

from __future__ import annotations

from typing import Any

from consumers.exceptions import CheckpointError


class RateLimiter:
    """Counts inserts and samples; this base allows everything once `min_size` rows went in.

    Args:
        min_size: rows inserted before the first sample.
    """

    state_version = 1

    def __init__(self, min_size: int = 1) -> None:
        if min_size < 1:
            raise ValueError(f"min_size must be at least 1, got min_size={min_size}")
        self.min_size = min_size
        self.inserts = 0
        self.samples = 0

    def can_insert(self, count: int) -> bool:
        """Whether `count` more rows may go in now."""
        return True

    def can_sample(self, count: int) -> bool:
        """Whether `count` more rows may be sampled now."""
        return self.inserts >= self.min_size

    def inserted(self, count: int) -> None:
        self.inserts += count

    def sampled(self, count: int) -> None:
        self.samples += count

    def describe(self) -> str:
        """The counters, for errors and logs."""
        return f"inserts={self.inserts} samples={self.samples} min_size={self.min_size}"

    def state_dict(self) -> dict[str, Any]:
        return {"version": self.state_version, "inserts": self.inserts, "samples": self.samples}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("version") != self.state_version:
            raise CheckpointError(
                f"rate limiter state has schema version {state.get('version')!r}, expected "
                f"{self.state_version}: resume with the rollstream that wrote the checkpoint"
            )
        self.inserts = int(state["inserts"])
        self.samples = int(state["samples"])
