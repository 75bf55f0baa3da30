"""The learner side: read trajectories tables into torch batches, train, track in MLflow."""

from consumers.batching import PAD_ID, RaggedColumn, TrajectoryBatch, TrajectoryColumns
from consumers.dataset import LEARNER_COLUMNS, TrajectoryDataset, trajectory_loader
from consumers.exceptions import (
    ConsumerError,
    EmptySnapshotError,
    ForkedReaderError,
    MissingTableError,
    PolicyInputError,
    TrackingError,
)
from consumers.learner import LearnResult, learn
from consumers.loss import policy_gradient_loss
from consumers.policy import DEFAULT_VOCAB_SIZE, TinyPolicy
from consumers.table import TableSnapshot, open_snapshot
from consumers.tracking import TABLE_URI_TAG, TABLE_VERSION_TAG, TrackedRun, table_dataset, track_run

__all__ = [
    "DEFAULT_VOCAB_SIZE",
    "LEARNER_COLUMNS",
    "PAD_ID",
    "TABLE_URI_TAG",
    "TABLE_VERSION_TAG",
    "ConsumerError",
    "EmptySnapshotError",
    "ForkedReaderError",
    "LearnResult",
    "MissingTableError",
    "PolicyInputError",
    "RaggedColumn",
    "TableSnapshot",
    "TinyPolicy",
    "TrackedRun",
    "TrackingError",
    "TrajectoryBatch",
    "TrajectoryColumns",
    "TrajectoryDataset",
    "learn",
    "open_snapshot",
    "policy_gradient_loss",
    "table_dataset",
    "track_run",
    "trajectory_loader",
]
