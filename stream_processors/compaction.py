"""Compaction of the worker's small files while it writes.

Every commit adds a file per partition it touches, and a Delta write costs more the more files the
table holds (about 14 µs of CPU per file per commit here): a worker committing ten small commits a
second would add tens of thousands of files an hour and slow down until it fell behind. The
`Compactor` rewrites a partition's small files into files of about `target_bytes` once the
partition holds `min_files` of them, the way `rollstream maintain` does (infra/maintenance.py): a
compaction commit removes and adds files with ``dataChange: false`` and touches no txn action, so
the offsets stored by the worker's appends are unchanged, concurrent appends do not conflict with
it, and readers that follow the table (the replay buffer) see no new rows. The files it replaced
stay on disk until `rollstream maintain --yes` vacuums them.

Only files smaller than `target_bytes` are read, so a worker that commits big files (a backlog
drained in commits of `commit_bytes`) rewrites little or nothing.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, WriterProperties
from deltalake.exceptions import CommitFailedError, DeltaError

from schemas.newest_table import NewestTable

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Compacted:
    """One partition's compaction: the files it replaced and wrote, and how long it took."""

    table: str
    partition: str | None
    files_removed: int
    files_added: int
    seconds: float


class Compactor:
    """Compacts a table's partitions once one holds `min_files` files smaller than `target_bytes`.

    Args:
        uri: the table's location.
        partition_by: its partition column (one), or None for an unpartitioned table.
        min_files: small files in one partition that start its compaction (at least 2).
        target_bytes: files below this size are small; compaction writes files of about this size.
        writer_properties: the Parquet settings of the table's writer, so rewritten files keep them.
        storage_options: deltalake's, for an object store.
    """

    def __init__(
        self,
        uri: str,
        *,
        partition_by: str | None,
        min_files: int,
        target_bytes: int,
        writer_properties: WriterProperties | None = None,
        storage_options: Mapping[str, str] | None = None,
    ) -> None:
        if min_files < 2 or target_bytes < 1:
            raise ValueError(
                f"min_files must be >= 2 and target_bytes >= 1, got {min_files} and {target_bytes}"
            )
        self.uri = uri
        self.partition_by = partition_by
        self.min_files = min_files
        self.target_bytes = target_bytes
        self.writer_properties = writer_properties
        self._table = NewestTable(uri, storage_options)

    def small_files(self, table: DeltaTable) -> Counter[str | None]:
        """Per partition value (None for an unpartitioned table), the files below `target_bytes`."""
        actions = pa.table(table.get_add_actions(flatten=True))
        small = actions.filter(pc.less(actions.column("size_bytes"), self.target_bytes))
        if self.partition_by is None:
            return Counter({None: small.num_rows})
        return Counter(small.column(f"partition.{self.partition_by}").to_pylist())

    def run(self) -> list[Compacted]:
        """Compact every partition that holds `min_files` small files; returns what was compacted.

        A failure is logged and left for the next run: a conflict means another worker compacted
        the same files first, and any other error costs nothing but the files staying small.
        """
        try:
            table = self._table.newest()
            counts = self.small_files(table) if table is not None else Counter[str | None]()
        except (DeltaError, OSError) as exc:
            log.warning("%s: could not list its files for compaction: %s", self.uri, exc)
            return []
        if table is None:
            return []
        due = sorted((value for value, count in counts.items() if count >= self.min_files), key=str)
        return [c for c in (self._compact(table, value) for value in due) if c is not None]

    def _compact(self, table: DeltaTable, value: str | None) -> Compacted | None:
        """Compact the partition `value` of `table` (all of it for None); None when that failed."""
        where = f"{self.partition_by}={value}" if self.partition_by else "the table"
        filters = None if self.partition_by is None or value is None else [(self.partition_by, "=", value)]
        started = time.perf_counter()
        try:
            metrics = table.optimize.compact(
                partition_filters=filters,
                target_size=self.target_bytes,
                max_concurrent_tasks=1,
                writer_properties=self.writer_properties,
            )
        except CommitFailedError as exc:
            log.info("%s: compaction of %s lost to a concurrent commit (%s)", self.uri, where, exc)
            return None
        except (DeltaError, OSError) as exc:
            log.warning("%s: compaction of %s failed: %s", self.uri, where, exc)
            return None
        done = Compacted(
            self.uri,
            value,
            int(metrics.get("numFilesRemoved", 0)),
            int(metrics.get("numFilesAdded", 0)),
            time.perf_counter() - started,
        )
        log.info(
            "%s: compacted %s: %d files into %d in %.2f s",
            self.uri, where, done.files_removed, done.files_added, done.seconds,
        )  # fmt: skip
        return done
