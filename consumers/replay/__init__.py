"""The replay buffer: tailing storage, samplers, rate limiters, token-budget batches, checkpoints."""

from consumers.replay.buffer import ReplayBuffer
from consumers.replay.checkpoint import load_checkpoint, save_checkpoint
from consumers.replay.chunk import Chunk, read_chunk
from consumers.replay.collate import PackedBatch, ReplayBatch, plan_batches
from consumers.replay.config import ReplayConfig, build_limiter, build_sampler
from consumers.replay.dataset import ReplayDataset, replay_loader
from consumers.replay.limiters import RateLimiter, SampleToInsertRatio
from consumers.replay.log import DataFile, TableLog
from consumers.replay.samplers import (
    FifoSampler,
    PrioritizedSampler,
    ProfileSampler,
    Sampler,
    SamplerStack,
    StalenessSampler,
    UniformSampler,
)
from consumers.replay.storage import ChunkStorage, RowIndex

__all__ = [
    "Chunk",
    "ChunkStorage",
    "DataFile",
    "FifoSampler",
    "PackedBatch",
    "PrioritizedSampler",
    "ProfileSampler",
    "RateLimiter",
    "ReplayBatch",
    "ReplayBuffer",
    "ReplayConfig",
    "ReplayDataset",
    "RowIndex",
    "SampleToInsertRatio",
    "Sampler",
    "SamplerStack",
    "StalenessSampler",
    "TableLog",
    "UniformSampler",
    "build_limiter",
    "build_sampler",
    "load_checkpoint",
    "plan_batches",
    "read_chunk",
    "replay_loader",
    "save_checkpoint",
]
