"""The defaults a stage's library options share with its settings section, each declared once.

The stages' options (`stream_processors.WorkerOptions` and the parts it configures,
`consumers.ReplayConfig`, `consumers.LearnerOptions`, `producers.RolloutOptions` and `TaskQueue`) and the sections of `infra/settings_sections.py`
both read them here (and `TopicDefaults` the topic names every room uses), where every room may import them: a library call without settings and a
command with default settings do the same thing. A default of None (off, or derived from another
option) belongs to the option's type and is not repeated here.
"""

from __future__ import annotations

from typing import Final

DEFAULT_VOCAB_SIZE: Final = 32_768
"""The tokenizer's vocabulary: token ids lie in [0, vocab_size)."""
DEFAULT_SEED: Final = 0
"""Seeds the learner's initial weights and the replay buffer's draws (one setting feeds both)."""


class TopicDefaults:
    """The rollout topics: `[kafka]` settings, `WorkerOptions`, the publisher's lanes and limits,
    the fleet generator and the dead letters (infra/topics.toml declares them)."""

    raw: Final = "rollouts.raw"
    """Ordinary trajectories, keyed by group_id."""
    ultra: Final = "rollouts.ultra"
    """Ultra-long trajectories."""
    dlq: Final = "rollouts.dlq"
    """Dead letters."""


class StreamDefaults:
    """The stream stage: `WorkerOptions` and the `[stream]` and `[sandbox]` settings."""

    app_id: Final = "rollstream-processor"
    batch_size: Final = 500
    batch_within_s: Final = 0.25
    write_retries: Final = 5
    advantage: Final = "grpo"
    per_component: Final = False
    group_event_timeout_s: Final = 300.0
    group_wall_timeout_s: Final = 30.0
    domain_decay: Final = 1.0
    domain_warmup: Final = 32
    commit_mib: Final = 32
    """Commit once the decided rows hold this many MiB of messages; while a commit is under way a
    full outbox waits for it, so a commit holds about this much. delta-rs holds about five times a
    commit's Arrow table while it writes it, so this sets the worker's peak memory: over a backlog
    of 20,000 fleet messages a worker peaked at 760 to 780 MB with 32 (3 runs; 910 to 1,072 in 6
    runs before a full outbox waited, when a commit behind a slow one grew to 10,000 rows; 616 and
    644 with 16 then). It drained 30,000 fleet messages as fast with 32 as with 64 (7,089 and
    5,911/s against 7,097 and 7,017/s) and about a tenth slower with 16 (medians 7,342 against
    8,212/s, 4 runs); all runs alternated, load average 0.6 to 1.6."""
    commit_interval_s: Final = 1.0
    idle_commit_s: Final = 0.1
    """The commit wait when the lanes are caught up (`Stage.idle_commit_s`)."""
    compact_files: Final = 100
    """Small files in one partition of a worker's table that start its compaction (0: never)."""
    compact_target_mib: Final = 4
    """Files below this many MiB are small; compaction writes files of about this size. A
    compacted file stays small until it reaches the target, so each compaction rewrites it again:
    compacting a partition after every 100 commits of 8 rows took 0.36 to 0.77 s of CPU over 12
    runs with 4, and grew from 0.45 to 1.13 s with 16 (scratch script, 1,200 commits)."""
    compact_every_s: Final = 30.0
    """How often a worker looks for partitions to compact."""
    session_timeout_s: Final = 10.0
    task_window: Final = 100_000
    """Completed task ids remembered per partition (about 8 MB each when full, 1.1 MB as a snapshot)."""
    verifier_processes: Final = 1
    unknown_domains: Final = "dead-letter"
    sandbox_pool_size: Final = 2
    metrics_host: Final = "127.0.0.1"


class ReplayDefaults:
    """The replay buffer: `ReplayConfig` and the `[replay]` settings."""

    start_version: Final = 0
    follow: Final = False
    token_budget: Final = 16_384
    max_length: Final = 2048
    layout: Final = "padded"
    profile_matched: Final = True
    min_size: Final = 1
    capacity_tokens: Final = 8_000_000
    eviction: Final = "oldest"


class RolloutDefaults:
    """Rollout workers: `RolloutOptions`, the `TaskQueue` and the `[rollout]` settings."""

    concurrency: Final = 4
    on_weight_change: Final = "finish"
    task_max_attempts: Final = 3
    task_low_every: Final = 4


class LearnerDefaults:
    """The learner: `LearnerOptions` (and the `LossOptions` it builds) and the `[learner]` settings."""

    experiment: Final = "rollstream"
    steps: Final = 20
    policy: Final = "tiny"
    dim: Final = 64
    objective: Final = "decoupled_ppo"
    aggregation: Final = "grpo"
    lr: Final = 1e-3
    clip_epsilon: Final = 0.2
    kl_coef: Final = 0.0
    device: Final = "cpu"
    checkpoint_every: Final = 10
