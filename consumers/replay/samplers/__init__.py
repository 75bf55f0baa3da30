"""Samplers of the replay buffer, one concern per file, composed by `SamplerStack`."""

from consumers.replay.samplers.base import Sampler, weighted_pick
from consumers.replay.samplers.fifo import FifoSampler
from consumers.replay.samplers.prioritized import PrioritizedSampler
from consumers.replay.samplers.profile import ProfileSampler
from consumers.replay.samplers.stack import SamplerStack
from consumers.replay.samplers.staleness import StalenessSampler
from consumers.replay.samplers.uniform import UniformSampler

__all__ = [
    "FifoSampler",
    "PrioritizedSampler",
    "ProfileSampler",
    "Sampler",
    "SamplerStack",
    "StalenessSampler",
    "UniformSampler",
    "weighted_pick",
]
