"""`SampleToInsertRatio`: keeps samples per inserted row near a target, within an error buffer."""

from __future__ import annotations

from consumers.replay.limiters.base import RateLimiter


class SampleToInsertRatio(RateLimiter):
    """Allows sampling while samples <= spi * (inserts - min_size) + error_buffer, and inserting while
    samples >= spi * (inserts - min_size) - error_buffer.

    Sampling beyond the upper bound waits for inserts (the learner is ahead of the fleet);
    inserting beyond the lower bound waits for samples (the fleet is ahead of the learner).

    Args:
        samples_per_insert: target rows sampled per row inserted (e.g. 1.0: each row about once).
        min_size: rows inserted before the first sample.
        error_buffer: rows of slack either side of the target, at least one batch's rows.
    """

    def __init__(self, samples_per_insert: float, *, min_size: int = 1, error_buffer: float = 256.0) -> None:
        super().__init__(min_size)
        if samples_per_insert <= 0:
            raise ValueError(f"samples_per_insert must be > 0, got samples_per_insert={samples_per_insert}")
        if error_buffer < 1:
            raise ValueError(f"error_buffer must be at least 1 row, got error_buffer={error_buffer}")
        self.samples_per_insert = samples_per_insert
        self.error_buffer = error_buffer

    def _target(self) -> float:
        return self.samples_per_insert * max(self.inserts - self.min_size, 0)

    def upper_bound(self) -> float:
        """Most samples allowed at the current insert count."""
        return self._target() + self.error_buffer

    def can_sample(self, count: int) -> bool:
        return self.inserts >= self.min_size and self.samples + count <= self.upper_bound()

    def can_insert(self, count: int) -> bool:
        if self.inserts < self.min_size:
            return True
        return self.samples >= self._target() - self.error_buffer

    def describe(self) -> str:
        return (
            f"{super().describe()} samples_per_insert={self.samples_per_insert} "
            f"error_buffer={self.error_buffer} (samples allowed now: {self.upper_bound():.0f})"
        )
