"""Rate limiters of the replay buffer (Reverb's shape: min size, samples-per-insert bound)."""

from consumers.replay.limiters.base import RateLimiter
from consumers.replay.limiters.sample_to_insert import SampleToInsertRatio

__all__ = ["RateLimiter", "SampleToInsertRatio"]
