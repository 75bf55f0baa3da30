"""`ReplayConfig`: every knob of a replay buffer in one frozen, picklable object.

It travels to spawned DataLoader workers and distributed ranks, each of which builds its own
buffer from it (`build_sampler`, `build_limiter` are the factories).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from consumers.replay.collate import Layout
from consumers.replay.limiters import RateLimiter, SampleToInsertRatio
from consumers.replay.samplers import (
    FifoSampler,
    PrioritizedSampler,
    ProfileSampler,
    Sampler,
    SamplerStack,
    StalenessSampler,
)
from consumers.replay.storage import Eviction
from schemas.defaults import DEFAULT_SEED, DEFAULT_VOCAB_SIZE, ReplayDefaults
from schemas.profile import WorkloadProfile, load_profile


@dataclass(frozen=True)
class ReplayConfig:
    """What to read, how much to hold, how to draw and how to batch.

    Attributes:
        table_uri: the trajectories table.
        start_version: first table version whose added files are read (time travel).
        end_version: last version read; None with `follow` tails forever, None without it
            stops at the latest version found at start.
        follow: keep reading new versions as the table grows.
        token_budget: padded slots (rows x longest row) or packed tokens per batch.
        max_length: prompt ++ response tokens are cut to this many (<= token_budget).
        layout: "padded" (attention/loss masks) or "packed" (varlen: position ids, cu_seqlens).
        capacity_rows / capacity_tokens: memory bound (None: no bound of that kind).
        eviction: "oldest" or "stalest" first once over capacity.
        statuses: verifier statuses trained on.
        vocab_size: token ids must lie in [0, vocab_size); others fail at read time.
        max_uses: each row at most this many times, oldest first (FIFO); None for replay.
        max_lag: hard staleness limit (learner version - policy_version); None for none.
        half_life: freshness weight halves every this many versions of lag; None for none.
        priority_alpha: prioritized by |advantage| ** alpha; None for no priorities.
        profile_matched: draw buckets in the profile's target shares.
        profile_path: the workload profile file; None for the shipped default.
        samples_per_insert / error_buffer: the rate limiter's ratio bound; None for no bound.
        min_size: rows inserted before the first sample.
        pool_batches: batches' worth of rows drawn at once (more: fuller low-waste batches,
            coarser freshness weighting; the hard staleness limit is checked at delivery).
        max_waste: a padded batch takes no row shorter than (1 - max_waste) x its longest.
        poll_interval_s: how often the table is checked for new versions.
        sample_timeout_s: how long a sample waits for rows before `RateLimitTimeout`.
        shard / num_shards: this reader's share of the files (set per rank x worker).
        seed: seeds the draws (and, in `learn`, torch: the policy's initial weights).
        storage_options: passed to deltalake and polars for object stores.
    """

    table_uri: str
    start_version: int = ReplayDefaults.start_version
    end_version: int | None = None
    follow: bool = ReplayDefaults.follow
    token_budget: int = ReplayDefaults.token_budget
    max_length: int = ReplayDefaults.max_length
    layout: Layout = ReplayDefaults.layout
    capacity_rows: int | None = None
    capacity_tokens: int | None = ReplayDefaults.capacity_tokens
    eviction: Eviction = ReplayDefaults.eviction
    statuses: tuple[str, ...] = ("ok", "fail")
    vocab_size: int = DEFAULT_VOCAB_SIZE
    max_uses: int | None = None
    max_lag: int | None = None
    half_life: float | None = None
    priority_alpha: float | None = None
    profile_matched: bool = ReplayDefaults.profile_matched
    profile_path: str | None = None
    samples_per_insert: float | None = None
    error_buffer: float = 1024.0
    min_size: int = ReplayDefaults.min_size
    pool_batches: int = 16
    max_waste: float = 0.05
    poll_interval_s: float = 0.5
    sample_timeout_s: float = 120.0
    shard: int = 0
    num_shards: int = 1
    seed: int = DEFAULT_SEED
    storage_options: dict[str, str] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.max_length < 1 or self.token_budget < self.max_length:
            raise ValueError(
                f"need 1 <= max_length <= token_budget so any row fits a batch, got "
                f"max_length={self.max_length}, token_budget={self.token_budget}"
            )
        if self.layout not in ("padded", "packed"):
            raise ValueError(f"layout must be 'padded' or 'packed', got layout={self.layout!r}")
        if self.start_version < 0 or (self.end_version is not None and self.end_version < self.start_version):
            raise ValueError(
                f"need 0 <= start_version <= end_version, got start_version={self.start_version}, "
                f"end_version={self.end_version}"
            )
        if self.follow and self.end_version is not None:
            raise ValueError("follow tails without an end: pass end_version=None with follow=True")
        if not 0 <= self.shard < self.num_shards:
            raise ValueError(
                f"need 0 <= shard < num_shards, got shard={self.shard}, num_shards={self.num_shards}"
            )
        if isinstance(self.statuses, str) or not self.statuses:
            raise ValueError(
                f"statuses must be a non-empty tuple such as ('ok', 'fail'), got {self.statuses!r}"
            )
        if self.vocab_size < 2:
            raise ValueError(f"vocab_size must be at least 2, got vocab_size={self.vocab_size}")
        if not 0 <= self.max_waste < 1:
            raise ValueError(f"max_waste must lie in [0, 1), got max_waste={self.max_waste}")
        if self.pool_batches < 1:
            raise ValueError(f"pool_batches must be at least 1, got pool_batches={self.pool_batches}")

    def profile(self) -> WorkloadProfile:
        """The workload profile buckets are named by."""
        return load_profile(Path(self.profile_path) if self.profile_path else None)


def build_sampler(config: ReplayConfig, profile: WorkloadProfile) -> SamplerStack:
    """The sampler stack the config asks for (uniform when it asks for nothing)."""
    parts: list[Sampler] = []
    if config.max_uses is not None:
        parts.append(FifoSampler(config.max_uses))
    if config.max_lag is not None or config.half_life is not None:
        parts.append(StalenessSampler(config.max_lag, config.half_life))
    if config.priority_alpha is not None:
        parts.append(PrioritizedSampler(alpha=config.priority_alpha))
    if config.profile_matched:
        parts.append(ProfileSampler(profile))
    return SamplerStack(parts, seed=config.seed * 1_000_003 + config.shard)


def build_limiter(config: ReplayConfig) -> RateLimiter:
    """The rate limiter the config asks for (min size only when no ratio is set)."""
    if config.samples_per_insert is None:
        return RateLimiter(config.min_size)
    return SampleToInsertRatio(
        config.samples_per_insert, min_size=config.min_size, error_buffer=config.error_buffer
    )
