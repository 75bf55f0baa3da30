"""Table upkeep: compact small files, checkpoint the log, vacuum files no version needs.

Safe while a sink keeps writing: compaction commits only the files it rewrote (a concurrent
append does not conflict with it), and no step touches the txn actions, so the offsets that make
the sink exactly once survive (their latest version per app id is carried into every checkpoint).
Vacuum removes only files that no version inside the retention window references, and by
default only reports them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from deltalake import DeltaTable, WriterProperties
from deltalake.exceptions import DeltaError

from infra.exceptions import InfraError

DEFAULT_RETENTION_HOURS = 168
"""Vacuum keeps files referenced by any version of the last 7 days (Delta's own default)."""


@dataclass
class MaintenanceReport:
    """What one table's upkeep did."""

    table: str
    version_before: int
    version_after: int = -1
    files_before: int = 0
    files_after: int = 0
    compaction: dict[str, Any] = field(default_factory=dict)
    checkpointed: bool = False
    vacuum_candidates: list[str] = field(default_factory=list)
    vacuumed: bool = False

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready summary (vacuum candidates counted, not listed)."""
        return {
            "table": self.table,
            "version_before": self.version_before,
            "version_after": self.version_after,
            "files_before": self.files_before,
            "files_after": self.files_after,
            "files_removed_by_compaction": self.compaction.get("numFilesRemoved", 0),
            "files_added_by_compaction": self.compaction.get("numFilesAdded", 0),
            "checkpointed": self.checkpointed,
            "vacuum_candidates": len(self.vacuum_candidates),
            "vacuumed": self.vacuumed,
        }


def maintain_table(
    uri: str,
    *,
    compact: bool = True,
    checkpoint: bool = True,
    vacuum: bool = True,
    delete: bool = False,
    retention_hours: int = DEFAULT_RETENTION_HOURS,
    target_file_mb: int = 128,
    storage_options: Mapping[str, str] | None = None,
    writer_properties: WriterProperties | None = None,
    progress: Callable[[str], None] = lambda _: None,
) -> MaintenanceReport:
    """Compact, checkpoint and vacuum one Delta table, in that order.

    Args:
        uri: the table's location.
        compact: rewrite small files into files of about `target_file_mb`.
        checkpoint: write a checkpoint of the log (readers then skip replaying every commit).
        vacuum: find files no version within `retention_hours` references.
        delete: actually delete those files (otherwise a dry run that only lists them).
        retention_hours: how far back versions stay readable (time travel) after a vacuum.
        target_file_mb: compaction's target file size.
        storage_options: deltalake options for object stores.
        writer_properties: Parquet settings of the compacted files (the table writer's own, so
            compaction keeps its encodings); default deltalake's.
        progress: receives one line per step.
    """
    options = dict(storage_options) if storage_options else None
    try:
        table = DeltaTable(uri, storage_options=options)
    except DeltaError as exc:
        raise InfraError(f"no Delta table at {uri}: {exc}") from exc
    report = MaintenanceReport(uri, table.version(), files_before=len(table.file_uris()))
    try:
        if compact:
            progress(f"{uri}: compacting {report.files_before} files")
            report.compaction = table.optimize.compact(
                target_size=target_file_mb * 1024 * 1024, writer_properties=writer_properties
            )
            table.update_incremental()
        if checkpoint:
            progress(f"{uri}: checkpointing version {table.version()}")
            table.create_checkpoint()
            report.checkpointed = True
        if vacuum:
            report.vacuum_candidates = table.vacuum(retention_hours=retention_hours, dry_run=True)
            if delete and report.vacuum_candidates:
                progress(f"{uri}: deleting {len(report.vacuum_candidates)} unreferenced files")
                table.vacuum(retention_hours=retention_hours, dry_run=False)
                report.vacuumed = True
            else:
                progress(f"{uri}: {len(report.vacuum_candidates)} files could be vacuumed")
    except DeltaError as exc:
        raise InfraError(
            f"upkeep of {uri} failed: {exc}. A retention shorter than the table's "
            "delta.deletedFileRetentionDuration is refused: keep the default"
        ) from exc
    table.update_incremental()
    report.version_after = table.version()
    report.files_after = len(table.file_uris())
    return report
