"""Pinned snapshots of a Delta table, read with polars.

A snapshot resolves "latest" to a concrete version once, so every reader of it (DataLoader
workers, the MLflow lineage record) sees the same rows even while the sink keeps committing.
Reads go through polars, never `DeltaTable.to_pyarrow_dataset()` (HAZARDS.md: it can abort the
interpreter at exit).

Neither engine survives `fork()`: once the parent has used them, a forked child's polars call
hangs (its thread pool is gone) and deltalake panics (its tokio runtime refuses forked
processes). The Linux default for DataLoader workers is fork, so a read in a process forked
after this module opened a table raises `ForkedReaderError` instead of hanging.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError, TableNotFoundError

from consumers.exceptions import ForkedReaderError, MissingTableError

_engines = {"started": False, "inherited": False}


def _after_fork_in_child() -> None:
    _engines["inherited"] = _engines["started"]


os.register_at_fork(after_in_child=_after_fork_in_child)


def _start_engines() -> None:
    """Note that deltalake/polars run in this process; refuse if a forked parent ran them."""
    if _engines["inherited"]:
        raise ForkedReaderError(
            f"process {os.getpid()} was forked after its parent opened a Delta table; deltalake "
            "and polars hang or panic in forked children. For DataLoader workers pass "
            "multiprocessing_context='spawn' (or 'forkserver'), or use consumers.trajectory_loader"
        )
    _engines["started"] = True


@dataclass(frozen=True)
class TableSnapshot:
    """One version of a Delta table: where it lives, which version, how to reach it.

    Plain data, so it pickles into DataLoader workers; each reader opens the table itself.
    """

    uri: str
    version: int
    storage_options: Mapping[str, str] | None = field(default=None, compare=False, repr=False)

    def scan(self) -> pl.LazyFrame:
        """Lazily scan this version of the table."""
        _start_engines()
        return pl.scan_delta(
            self.uri,
            version=self.version,
            storage_options=dict(self.storage_options) if self.storage_options else None,
        )

    def read(self, columns: list[str] | None = None) -> pl.DataFrame:
        """Read this version of the table, optionally only some columns."""
        frame = self.scan()
        if columns is not None:
            frame = frame.select(columns)
        return frame.collect()


def open_snapshot(
    table_uri: str,
    *,
    version: int | None = None,
    storage_options: Mapping[str, str] | None = None,
) -> TableSnapshot:
    """Resolve `version` (default: the latest) of the Delta table at `table_uri`.

    Raises:
        MissingTableError: no Delta table at `table_uri`, or not that version.
    """
    _start_engines()
    uri = _normalize(table_uri)
    options = dict(storage_options) if storage_options else None
    try:
        table = DeltaTable(uri, version=version, storage_options=options)
    except TableNotFoundError as exc:
        raise MissingTableError(
            f"no Delta table at {uri!r} ({exc}): `rollstream process` writes the trajectories "
            "table there; run it first or pass the right table URI (e.g. <lake>/trajectories)"
        ) from exc
    except DeltaError as exc:
        if version is None:
            raise
        latest = _latest_version(uri, options)
        raise MissingTableError(
            f"the Delta table at {uri!r} has no version {version} ({exc}); its latest version is "
            f"{latest}: pass version=None for the latest or a version still in the log"
        ) from exc
    return TableSnapshot(uri=uri, version=table.version(), storage_options=options)


def _latest_version(uri: str, storage_options: dict[str, str] | None) -> int | None:
    try:
        return DeltaTable(uri, storage_options=storage_options).version()
    except DeltaError:
        return None


def _normalize(table_uri: str) -> str:
    """Make a local path absolute (lineage records need it); leave URLs alone."""
    if "://" in table_uri:
        return table_uri
    return str(Path(table_uri).expanduser().resolve())
