"""The executions Delta table: one audit row per sandbox execution, exactly once per Kafka offset.

Written by the stage after the trajectories commit, with the same txn-offset mechanism
(offsets.TxnTable), so a replayed batch neither loses nor doubles an execution record.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa

from schemas.tables import EXECUTIONS_SCHEMA
from stream_processors.offsets import Coordinates, TxnTable
from stream_processors.sandbox import Execution


@dataclass(frozen=True, slots=True)
class ExecutionRecord:
    """One sandbox execution of one trajectory, with what it was for."""

    trajectory_id: str
    index: int
    domain: str
    verifier: str
    verifier_version: str
    verdict: str
    execution: Execution


def executions_table(
    records: Sequence[ExecutionRecord], coordinates: Sequence[Coordinates], executed_at: datetime
) -> pa.Table:
    """The Arrow table of `records`, in EXECUTIONS_SCHEMA's column order."""
    ex = [r.execution for r in records]
    columns = {
        "trajectory_id": [r.trajectory_id for r in records],
        "execution_index": [r.index for r in records],
        "domain": [r.domain for r in records],
        "verifier": [r.verifier for r in records],
        "verifier_version": [r.verifier_version for r in records],
        "environment_id": [e.environment_id for e in ex],
        "limits": [list(e.limits.as_dict().items()) for e in ex],
        "verdict": [r.verdict for r in records],
        "outcome": [e.outcome for e in ex],
        "exit_code": [e.exit_code for e in ex],
        "signal": [e.signal for e in ex],
        "cpu_s": [e.cpu_s for e in ex],
        "wall_s": [e.wall_s for e in ex],
        "peak_memory_bytes": [e.peak_memory_bytes for e in ex],
        "stdout": [e.stdout for e in ex],
        "stderr": [e.stderr for e in ex],
        "stdout_bytes": [e.stdout_bytes for e in ex],
        "stderr_bytes": [e.stderr_bytes for e in ex],
        "executed_at": [executed_at] * len(ex),
        "topic": [c.topic for c in coordinates],
        "partition": [c.partition for c in coordinates],
        "offset": [c.offset for c in coordinates],
        "start_s": [e.start_s for e in ex],
    }
    return pa.Table.from_pydict(columns, schema=EXECUTIONS_SCHEMA)


class ExecutionLog:
    """Appends execution records to <lake>/executions, once per source offset.

    Args:
        table_uri: where the table lives (created on the first write).
        app_id: names the txn versions holding the written offsets; the stage's app id.
        storage_options: passed through to deltalake for object stores.
    """

    def __init__(
        self, table_uri: Path | str, *, app_id: str, storage_options: Mapping[str, str] | None = None
    ) -> None:
        self.table = TxnTable(str(table_uri), app_id=app_id, storage_options=storage_options)

    @property
    def uri(self) -> str:
        """The table's location."""
        return self.table.uri

    def stored_offset(self, topic: str, partition: int) -> int | None:
        """The highest offset of (topic, partition) already written, or None."""
        return self.table.stored_offset(topic, partition)

    def write(self, records: Sequence[ExecutionRecord], coordinates: Sequence[Coordinates]) -> int:
        """Append the records whose offsets are not yet stored; returns how many were written."""
        if len(records) != len(coordinates):
            raise ValueError(
                f"records and coordinates must be parallel, got {len(records)} and {len(coordinates)}"
            )
        if not records:
            return 0
        now = datetime.now(UTC)
        return self.table.append(
            coordinates,
            lambda keep: executions_table([records[i] for i in keep], [coordinates[i] for i in keep], now),
        )
