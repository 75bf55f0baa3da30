"""Kafka offsets stored as Delta application transactions, in the same commit as the rows.

Each (topic, partition) has a txn app id, the JSON array ``["<app_id>","<topic>",<partition>]``
(unambiguous, unlike the ``"<app_id>-<topic>-<partition>"`` of earlier versions, which is still
read when the new one is absent). `append` keeps the dead_letters semantics: the version is the
highest offset appended, a batch keeps only messages above it, so a replay writes nothing twice; a
concurrent writer that committed the same app id first makes our commit fail (delta-rs checks txn
conflicts) and we reload and filter again. `commit` is the trajectories table's: the caller decides
the rows and the versions from its own state (state.py) and writes that state in the same commit,
fenced by the versions it expects per partition, so several workers of one app id (one consumer
group) append to one table side by side and a zombie that lost its partitions cannot write them.
`append_missing` writes messages decided after later ones were stored (the dead letters of decided
groups), skipping those the table already holds.

A write whose data has columns the table lacks (a table created by an older rollstream) first adds
them by Delta schema evolution, in a commit of their own (ADD COLUMN: nullable, at the end, the
existing order kept, no protocol upgrade); the older rows read them as null.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

import pyarrow as pa
from deltalake import (
    CommitProperties,
    DeltaTable,
    PostCommitHookProperties,
    Schema,
    Transaction,
    WriterProperties,
    write_deltalake,
)
from deltalake.exceptions import CommitFailedError, DeltaError

from schemas.newest_table import NewestTable
from stream_processors.exceptions import SinkError, StreamProcessorError

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]

APPEND_HOOKS = PostCommitHookProperties(create_checkpoint=True, cleanup_expired_logs=False)
"""delta-rs's hooks after each append: its checkpoint every 100 versions, but not its expired-log
cleanup, which lists the whole `_delta_log` after every commit to find logs older than the
table's retention (30 days by default). On a local disk (and on MinIO) a listing costs in
proportion to the log's length: with 2,062 log entries an append took 28 to 44 ms with the
cleanup and 12 ms without (deltalake 1.6.6, here). `TxnTable` runs the cleanup itself once every
CLEANUP_EVERY versions."""
CLEANUP_EVERY = 100
"""Versions between two expired-log cleanups of a TxnTable (delta-rs's checkpoint interval)."""


class Coordinates(NamedTuple):
    """Where a message came from: (topic, partition, offset). A named tuple, cheap to create and
    to hash: the stage does both for every message."""

    topic: str
    partition: int
    offset: int


def txn_app_id(app_id: str, topic: str, partition: int) -> str:
    """The Delta txn app id of one partition: a JSON array, so no two (app, topic, partition) collide."""
    return json.dumps([app_id, topic, partition], separators=(",", ":"))


def legacy_txn_app_id(app_id: str, topic: str, partition: int) -> str:
    """The legacy ambiguous txn app id ("p-x","1" and "p","x-1" collide), still read from older tables; read only."""
    return f"{app_id}-{topic}-{partition}"


class ConcurrentWriterError(StreamProcessorError):
    """Another writer committed offsets of our partitions; retrying could write rows twice."""


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
        writer_properties: Parquet settings of the written files; default ZSTD.
    """

    def __init__(
        self,
        uri: str,
        *,
        app_id: str,
        partition_by: Sequence[str] | None = None,
        storage_options: Mapping[str, str] | None = None,
        commit_retries: int = 5,
        writer_properties: WriterProperties | None = None,
    ) -> None:
        self.uri = uri
        self.app_id = app_id
        self.partition_by = list(partition_by) if partition_by else None
        self.storage_options = dict(storage_options) if storage_options else None
        self.commit_retries = commit_retries
        self._table = NewestTable(uri, storage_options)
        self._cleaned = -CLEANUP_EVERY
        self._txns_lock = threading.Lock()
        self._txns_at: tuple[str, int] | None = None
        self._txns: dict[str, int | None] = {}
        self.writer_properties = writer_properties or WriterProperties(compression="ZSTD")

    def refresh(self) -> DeltaTable | None:
        """The table at its newest version, or None before the first write; raises SinkError."""
        try:
            return self._table.newest()
        except (DeltaError, OSError) as exc:
            raise SinkError(f"reading the newest version of {self.uri} failed: {exc}") from exc

    def version_of(self, table: DeltaTable | None, topic: str, partition: int) -> int | None:
        """The txn version of (topic, partition), the legacy app id's when the new one is absent."""
        if table is None:
            return None
        version = self._txn(table, txn_app_id(self.app_id, topic, partition))
        if version is None:
            version = self._txn(table, legacy_txn_app_id(self.app_id, topic, partition))
        return version

    def _txn(self, table: DeltaTable, app: str) -> int | None:
        """`table`'s txn version of `app`, remembered for the table version it was read at.

        delta-rs answers `transaction_version` by reading the log from the newest checkpoint on,
        each call: about 2 ms here 33 versions past a checkpoint, 6.6 ms for an app id the table
        lacks (deltalake 1.6.6); asked on every commit, a fence over 16 partitions costs about
        25 ms. The txn versions at one version of one table (its metadata id: a table made anew
        at the same location is another) never change, and our own append carries them to the
        version it wrote (`_carry`), so a writer alone on its table reads none of them again."""
        at = (str(table.metadata().id), table.version())
        with self._txns_lock:
            if self._txns_at == at and app in self._txns:
                return self._txns[app]
        found = table.transaction_version(app)
        with self._txns_lock:
            if self._txns_at != at:
                self._txns_at, self._txns = at, {}
            self._txns[app] = found
        return found

    def _carry(self, table: DeltaTable, before: int, txns: Sequence[Transaction]) -> None:
        """Our append took `table` from version `before` to its version now: if nothing else was
        committed in between, the txn versions known at `before` hold now, with those we wrote."""
        key, after = str(table.metadata().id), table.version()
        with self._txns_lock:
            if after == before + 1 and self._txns_at == (key, before):
                self._txns = {**self._txns, **{t.app_id: t.version for t in txns}}
                self._txns_at = (key, after)

    def stored_offset(self, topic: str, partition: int) -> int | None:
        """The txn version of (topic, partition): the highest offset appended (dead letters), or None."""
        return self.version_of(self.refresh(), topic, partition)

    def _stored(self, table: DeltaTable | None, keys: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
        out = {}
        for topic, partition in keys:
            version = self.version_of(table, topic, partition)
            if version is not None:
                out[(topic, partition)] = version
        return out

    def commit(
        self,
        data: pa.Table,
        versions: Mapping[TopicPartition, int],
        metadata: Mapping[str, str],
        *,
        expected: Mapping[TopicPartition, int] | None,
    ) -> int:
        """Append `data` with txn `versions` and custom `metadata` in one commit; returns the table version.

        `expected` fences the commit: per partition, the txn version this writer last read or
        wrote (-1: none). If the table holds another version for one of them, another worker wrote
        our partitions (a zombie after a rebalance) and the commit is refused with
        ConcurrentWriterError. A commit that conflicts with a concurrent writer of other partitions
        (delta-rs raises CommitFailedError) is retried on the newest version, fence checked again.
        None (no fence) is for one-off commits such as `offsets reset`.
        """
        attempt = 0
        while True:
            table = self.refresh()
            if expected:
                self._check_fence(table, expected)
            now_ms = int(time.time() * 1000)
            txns = [
                Transaction(txn_app_id(self.app_id, t, p), v, now_ms)
                for (t, p), v in sorted(versions.items())
            ]
            properties = CommitProperties(app_transactions=txns, custom_metadata=dict(metadata))
            attempt = self._append(table, data, properties, attempt)
            if attempt:
                continue
            if table is not None:  # a DeltaTable written through moves to the version it committed
                return table.version()
            written = self.refresh()
            assert written is not None
            return written.version()

    def _append(
        self, table: DeltaTable | None, data: pa.Table, properties: CommitProperties, attempt: int
    ) -> int:
        """One append commit; 0 when written, else the conflicts so far (retry on a fresh view).

        Raises:
            SinkError: more conflicts than `commit_retries`, or the write failed (disk, permissions).
        """
        if table is not None and _new_columns(table, data.schema):
            self._add_columns(table, data.schema)
        before = table.version() if table is not None else -1
        try:
            write_deltalake(
                table if table is not None else self.uri,
                data,
                mode="append",
                partition_by=self.partition_by,
                storage_options=self.storage_options,
                writer_properties=self.writer_properties,
                commit_properties=properties,
                post_commithook_properties=APPEND_HOOKS,
            )
        except CommitFailedError as exc:
            attempt += 1
            if attempt > self.commit_retries:
                raise SinkError(
                    f"{self.uri}: commit kept conflicting with concurrent writers ({exc}); check that only "
                    "one worker owns each partition, or raise commit_retries"
                ) from exc
            log.warning("%s: concurrent commit (%s); reloading and retrying", self.uri, exc)
            return attempt
        except (DeltaError, OSError) as exc:
            raise SinkError(
                f"appending {data.num_rows} rows to {self.uri} failed: {exc}{_missing_hint(table, data)}"
            ) from exc
        if table is not None:
            self._carry(table, before, properties.app_transactions or [])
            self._remove_expired_logs(table)
        return 0

    def _remove_expired_logs(self, table: DeltaTable) -> None:
        """Every CLEANUP_EVERY versions, delete the log files older than the table's log retention
        that lie before its newest checkpoint (what delta-rs's hook would do after every commit);
        a failure only logs, the next run tries again."""
        if table.version() - self._cleaned < CLEANUP_EVERY:
            return
        self._cleaned = table.version()
        try:
            table.cleanup_metadata()
        except (DeltaError, OSError) as exc:
            log.warning(
                "%s: removing expired log files failed (%s); retrying in %d versions",
                self.uri,
                exc,
                CLEANUP_EVERY,
            )

    def _add_columns(self, table: DeltaTable, schema: pa.Schema) -> None:
        """Add the columns of `schema` the table lacks, at its end, in a commit of their own.

        Raises:
            SinkError: the table refused them (and no concurrent writer added them meanwhile).
        """
        added = _new_columns(table, schema)
        log.info("%s: adding columns %s (Delta schema evolution)", self.uri, added)
        try:
            table.alter.add_columns(
                list(Schema.from_arrow(pa.schema([schema.field(n) for n in added])).fields)
            )
        except (DeltaError, OSError) as exc:
            table.update_incremental()
            if _new_columns(table, schema):  # not a concurrent writer adding them first
                raise SinkError(
                    f"adding columns {added} to {self.uri} failed: {exc}; the table must accept new "
                    "nullable columns (its writer protocol allows it unless a newer rollstream changed it)"
                ) from exc
        table.update_incremental()

    def _check_fence(self, table: DeltaTable | None, expected: Mapping[TopicPartition, int]) -> None:
        for (topic, partition), want in sorted(expected.items()):
            stored = self.version_of(table, topic, partition)
            stored = -1 if stored is None else stored
            if stored != want:
                raise ConcurrentWriterError(
                    f"{self.uri}: {topic}[{partition}] has stored offset {stored}, but this worker last "
                    f"read or wrote {want} (app id {self.app_id!r}): another worker writes this partition. "
                    "Kafka gave it to that worker; this one stops, and a restart resumes from Delta"
                )

    def append_missing(
        self,
        coordinates: Sequence[Coordinates],
        build: Callable[[list[int]], pa.Table],
        held: Callable[[DeltaTable, list[Coordinates]], set[Coordinates]],
    ) -> int:
        """Append the rows the table does not hold yet, even at offsets below its txn versions.

        `held(table, candidates)` names which candidates (offsets at or below their partition's
        txn version) the table already holds; offsets above it are new. The txn versions become
        the highest offsets stored. Returns how many rows were written.
        """
        attempt = 0
        while True:
            table = self.refresh()
            stored = self._stored(table, list(highest_offsets(coordinates)))
            below = [c for c in coordinates if c.offset <= stored.get((c.topic, c.partition), -1)]
            present = held(table, below) if below and table is not None else set()
            keep = [i for i, c in enumerate(coordinates) if c not in present]
            if not keep:
                return 0
            highest = highest_offsets([coordinates[i] for i in keep])
            now_ms = int(time.time() * 1000)
            txns = [
                Transaction(
                    txn_app_id(self.app_id, topic, partition),
                    max(offset, stored.get((topic, partition), -1)),
                    now_ms,
                )
                for (topic, partition), offset in sorted(highest.items())
            ]
            attempt = self._append(table, build(keep), CommitProperties(app_transactions=txns), attempt)
            if not attempt:
                return len(keep)

    def append(self, coordinates: Sequence[Coordinates], build: Callable[[list[int]], pa.Table]) -> int:
        """Append the rows whose offsets are new; returns how many were written.

        Args:
            coordinates: one per candidate row.
            build: called with the indexes of the new rows, returns their ``pyarrow.Table``.
        """
        attempt = 0
        while True:
            table = self.refresh()
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
            attempt = self._append(table, data, CommitProperties(app_transactions=txns), attempt)
            if attempt:
                continue
            return len(keep)


def _new_columns(table: DeltaTable, schema: pa.Schema) -> list[str]:
    """The columns of `schema` that the existing Delta table lacks."""
    names = {f.name for f in table.schema().fields}
    return [name for name in schema.names if name not in names]


def _missing_hint(table: DeltaTable | None, data: pa.Table) -> str:
    """Why a write may have failed: the table has columns the data lacks (a newer writer evolved it)."""
    if table is None:
        return ""
    lacking = [f.name for f in table.schema().fields if f.name not in set(data.column_names)]
    if not lacking:
        return ""
    return (
        f" (the table has columns this rollstream does not write: {lacking}; a newer rollstream "
        "evolved it: upgrade this worker)"
    )
