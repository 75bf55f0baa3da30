"""The stream stage: decode, validate, verify, bucket and normalize trajectories into Delta.

Names are imported on first use (PEP 562), so a process that needs one module, such as a
verifier pool's spawned process, does not pay for Faust, the sink and their imports.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from schemas.lazy import lazy_exports

_WHERE = {
    "DEAD_LETTERS_SCHEMA": "schemas.tables",
    "TRAJECTORIES_SCHEMA": "schemas.tables",
    "GroupNormalization": "stream_processors.advantages",
    "OverlongPenalty": "stream_processors.advantages",
    "create_app": "stream_processors.app",
    "DeadLetter": "stream_processors.dead_letters",
    "DeadLetters": "stream_processors.dead_letters",
    "DeltaSink": "stream_processors.delta_sink",
    "DomainStats": "stream_processors.domain_stats",
    "RunningStats": "stream_processors.domain_stats",
    "GroupBuffer": "stream_processors.groups",
    "Coordinates": "stream_processors.offsets",
    "table_uri": "stream_processors.offsets",
    "txn_app_id": "stream_processors.offsets",
    "BatchProcessor": "stream_processors.processing",
    "ProcessedBatch": "stream_processors.processing",
    "SourceMessage": "stream_processors.processing",
    "ScoredTrajectory": "stream_processors.rows",
    "BatchStats": "stream_processors.stage",
    "Stage": "stream_processors.stage",
    "TokenArrays": "stream_processors.validation",
    "validate": "stream_processors.validation",
    "run_worker": "stream_processors.worker",
    "WorkerOptions": "stream_processors.worker_options",
}

__all__ = [
    "DEAD_LETTERS_SCHEMA",
    "TRAJECTORIES_SCHEMA",
    "BatchProcessor",
    "BatchStats",
    "Coordinates",
    "DeadLetter",
    "DeadLetters",
    "DeltaSink",
    "DomainStats",
    "GroupBuffer",
    "GroupNormalization",
    "OverlongPenalty",
    "ProcessedBatch",
    "RunningStats",
    "ScoredTrajectory",
    "SourceMessage",
    "Stage",
    "TokenArrays",
    "WorkerOptions",
    "create_app",
    "run_worker",
    "table_uri",
    "txn_app_id",
    "validate",
]


__getattr__, __dir__ = lazy_exports(__name__, _WHERE)


if TYPE_CHECKING:
    from schemas.tables import DEAD_LETTERS_SCHEMA, TRAJECTORIES_SCHEMA
    from stream_processors.advantages import GroupNormalization, OverlongPenalty
    from stream_processors.app import create_app
    from stream_processors.dead_letters import DeadLetter, DeadLetters
    from stream_processors.delta_sink import DeltaSink
    from stream_processors.domain_stats import DomainStats, RunningStats
    from stream_processors.groups import GroupBuffer
    from stream_processors.offsets import Coordinates, table_uri, txn_app_id
    from stream_processors.processing import BatchProcessor, ProcessedBatch, SourceMessage
    from stream_processors.rows import ScoredTrajectory
    from stream_processors.stage import BatchStats, Stage
    from stream_processors.validation import TokenArrays, validate
    from stream_processors.worker import run_worker
    from stream_processors.worker_options import WorkerOptions
