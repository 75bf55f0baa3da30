"""Kafka offsets stored as Delta application transactions, in the same commit as the rows.

Each (topic, partition) has a txn app id ``"<app_id>-<topic>-<partition>"`` whose version is the
highest offset already appended. A batch keeps only messages above that version, and the append
records the new highest offsets in its own commit, so a replay (a crash, a rebalance, a new
consumer group) writes nothing twice. A concurrent writer that committed the same app id first
makes our commit fail (delta-rs checks txn conflicts); we reload and filter again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction, WriterProperties, write_deltalake
from deltalake.exceptions import CommitFailedError, DeltaError

from stream_processors.exceptions import SinkError

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]


@dataclass(frozen=True, slots=True, order=True)
class Coordinates:
    """Where a message came from: (topic, partition, offset)."""

    topic: str
    partition: int
    offset: int


def txn_app_id(app_id: str, topic: str, partition: int) -> str:
    """The Delta txn app id holding one partition's highest written offset."""
    return f"{app_id}-{topic}-{partition}"


def table_uri(lake_dir: Path | str, name: str) -> str:
    """The URI of table `name` under a lake directory or object-store URI."""
    if isinstance(lake_dir, str) and "://" in lake_dir:
        return f"{lake_dir.rstrip('/')}/{name}"
    return str(Path(lake_dir) / name)


def highest_offsets(coordinates: Sequence[Coordinates]) -> dict[TopicPartition, int]:
    """The highest offset per (topic, partition) in a batch."""
    out: dict[TopicPartition, int] = {}
    for c in coordinates:
        key = (c.topic, c.partition)
        if c.offset > out.get(key, -1):
            out[key] = c.offset
    return out


class TxnTable:
    """A Delta table appended to at most once per Kafka offset.

    Args:
        uri: table location (local path or object-store URI).
        app_id: prefix of the txn app ids; one per logical pipeline, stable across restarts.
        partition_by: Delta partition columns.
        storage_options: passed through to deltalake for object stores.
        commit_retries: how often to reload and retry after a concurrent commit.
    """

    def __init__(
        self,
        uri: str,
        *,
        app_id: str,
        partition_by: Sequence[str] | None = None,
        storage_options: Mapping[str, str] | None = None,
        commit_retries: int = 5,
    ) -> None:
        self.uri = uri
        self.app_id = app_id
        self.partition_by = list(partition_by) if partition_by else None
        self.storage_options = dict(storage_options) if storage_options else None
        self.commit_retries = commit_retries
        self._table: DeltaTable | None = None
        self._writer_properties = WriterProperties(compression="ZSTD")

    def _refresh(self) -> DeltaTable | None:
        if self._table is not None:
            self._table.update_incremental()
        elif DeltaTable.is_deltatable(self.uri, storage_options=self.storage_options):
            self._table = DeltaTable(self.uri, storage_options=self.storage_options)
        return self._table

    def stored_offset(self, topic: str, partition: int) -> int | None:
        """The highest offset of (topic, partition) already in the table, or None."""
        table = self._refresh()
        return None if table is None else table.transaction_version(txn_app_id(self.app_id, topic, partition))

    def _stored(self, table: DeltaTable | None, keys: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
        if table is None:
            return {}
        out = {}
        for topic, partition in keys:
            version = table.transaction_version(txn_app_id(self.app_id, topic, partition))
            if version is not None:
                out[(topic, partition)] = version
        return out

    def append(self, coordinates: Sequence[Coordinates], build: Callable[[list[int]], pa.Table]) -> int:
        """Append the rows whose offsets are new; returns how many were written.

        Args:
            coordinates: one per candidate row.
            build: called with the indexes of the new rows, returns their ``pyarrow.Table``.
        """
        attempt = 0
        while True:
            table = self._refresh()
            stored = self._stored(table, list(highest_offsets(coordinates)))
            keep = [i for i, c in enumerate(coordinates) if c.offset > stored.get((c.topic, c.partition), -1)]
            if not keep:
                return 0
            now_ms = int(time.time() * 1000)
            txns = [
                Transaction(txn_app_id(self.app_id, topic, partition), offset, now_ms)
                for (topic, partition), offset in highest_offsets([coordinates[i] for i in keep]).items()
            ]
            data = build(keep)
            try:
                write_deltalake(
                    table if table is not None else self.uri,
                    data,
                    mode="append",
                    partition_by=self.partition_by,
                    storage_options=self.storage_options,
                    writer_properties=self._writer_properties,
                    commit_properties=CommitProperties(app_transactions=txns),
                )
            except CommitFailedError as exc:
                attempt += 1
                if attempt > self.commit_retries:
                    raise SinkError(
                        f"{self.uri}: commit kept conflicting with a concurrent writer ({exc}); "
                        "check that only one worker owns each partition"
                    ) from exc
                log.warning("%s: concurrent commit (%s); reloading and retrying", self.uri, exc)
                continue
            except (DeltaError, OSError) as exc:
                raise SinkError(f"appending {len(keep)} rows to {self.uri} failed: {exc}") from exc
            return len(keep)
