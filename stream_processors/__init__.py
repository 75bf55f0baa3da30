"""The stream stage: decode, validate, verify, bucket and normalize trajectories into Delta."""

from schemas.tables import DEAD_LETTERS_SCHEMA, TRAJECTORIES_SCHEMA
from stream_processors.app import create_app
from stream_processors.dead_letters import DeadLetter, DeadLetters
from stream_processors.delta_sink import DeltaSink
from stream_processors.offsets import Coordinates, table_uri, txn_app_id
from stream_processors.processing import BatchProcessor, ProcessedBatch, SourceMessage
from stream_processors.rows import ScoredTrajectory
from stream_processors.stage import BatchStats, Stage
from stream_processors.validation import TokenArrays, validate
from stream_processors.worker import run_worker

__all__ = [
    "DEAD_LETTERS_SCHEMA",
    "TRAJECTORIES_SCHEMA",
    "BatchProcessor",
    "BatchStats",
    "Coordinates",
    "DeadLetter",
    "DeadLetters",
    "DeltaSink",
    "ProcessedBatch",
    "ScoredTrajectory",
    "SourceMessage",
    "Stage",
    "TokenArrays",
    "create_app",
    "run_worker",
    "table_uri",
    "txn_app_id",
    "validate",
]
