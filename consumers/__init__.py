"""The learner side: a tailing replay buffer over the trajectories table, the learner, MLflow tracking."""

from consumers.batching import PAD_ID, RaggedColumn, TrajectoryBatch, TrajectoryColumns
from consumers.exceptions import (
    BufferExhausted,
    CheckpointError,
    ConsumerError,
    EmptySnapshotError,
    ForkedReaderError,
    MissingTableError,
    PolicyInputError,
    RateLimitTimeout,
    TokenRangeError,
    TrackingError,
)
from consumers.learner import LearnerOptions, LearnResult, learn
from consumers.loss import clipped_policy_loss, policy_gradient_loss
from consumers.policy import DEFAULT_VOCAB_SIZE, TinyPolicy
from consumers.replay import (
    PackedBatch,
    ReplayBatch,
    ReplayBuffer,
    ReplayConfig,
    ReplayDataset,
    replay_loader,
)
from consumers.table import TableSnapshot, open_snapshot
from consumers.tracking import (
    TABLE_URI_TAG,
    TABLE_VERSION_TAG,
    TABLE_VERSIONS_TAG,
    TrackedRun,
    table_dataset,
    track_run,
)

__all__ = [
    "DEFAULT_VOCAB_SIZE",
    "PAD_ID",
    "TABLE_URI_TAG",
    "TABLE_VERSIONS_TAG",
    "TABLE_VERSION_TAG",
    "BufferExhausted",
    "CheckpointError",
    "ConsumerError",
    "EmptySnapshotError",
    "ForkedReaderError",
    "LearnResult",
    "LearnerOptions",
    "MissingTableError",
    "PackedBatch",
    "PolicyInputError",
    "RaggedColumn",
    "RateLimitTimeout",
    "ReplayBatch",
    "ReplayBuffer",
    "ReplayConfig",
    "ReplayDataset",
    "TableSnapshot",
    "TinyPolicy",
    "TokenRangeError",
    "TrackedRun",
    "TrackingError",
    "TrajectoryBatch",
    "TrajectoryColumns",
    "clipped_policy_loss",
    "learn",
    "open_snapshot",
    "policy_gradient_loss",
    "replay_loader",
    "table_dataset",
    "track_run",
]
