"""A DeltaTable kept at its table's newest version, for a process that reads or writes it for long."""

from __future__ import annotations

from collections.abc import Mapping

from deltalake import DeltaTable

from schemas.local_table import commit_file, local_path

RELOAD_VERSIONS = 100
"""Versions a DeltaTable follows with `update_incremental` before it is loaded afresh.

delta-rs keeps in memory every commit a DeltaTable read since it was loaded, and a write through
it costs more the more it holds: the stream stage's 8-row commit took 47 ms of CPU in its first
100 versions and 192 ms in its sixth 100 (deltalake 1.6.6, here). A fresh load starts from the
newest checkpoint, which delta-rs writes every 100 versions by default."""


class NewestTable:
    """A Delta table at its newest version: followed incrementally, loaded afresh every
    RELOAD_VERSIONS versions, so the cost of using it stays flat however long it is followed.

    Args:
        uri: the table's location.
        storage_options: deltalake's, for an object store.
    """

    def __init__(self, uri: str, storage_options: Mapping[str, str] | None = None) -> None:
        self.uri = uri
        self.storage_options = dict(storage_options) if storage_options else None
        self._table: DeltaTable | None = None
        self._loaded = 0
        self._local = local_path(uri)

    def newest(self) -> DeltaTable | None:
        """The table at its newest version, or None while it does not exist.

        Raises what deltalake raises (DeltaError, OSError) when the table cannot be read.
        """
        if self._table is not None and self._table.version() - self._loaded < RELOAD_VERSIONS:
            if not self._newest_already(self._table):
                self._table.update_incremental()
        elif self._table is not None or DeltaTable.is_deltatable(
            self.uri, storage_options=self.storage_options
        ):
            self._table = DeltaTable(self.uri, storage_options=self.storage_options)
            self._loaded = self._table.version()
        return self._table

    def _newest_already(self, table: DeltaTable) -> bool:
        """True when `table` is a local table's newest version: the log has no next commit file.

        One `stat` instead of `update_incremental`, which on a local disk lists the whole
        `_delta_log` (6 ms per call with 2,560 log files, deltalake 1.6.6). An object store's
        listing starts after the version held, so there `update_incremental` is asked every time.
        """
        return self._local is not None and not commit_file(self._local, table.version() + 1).exists()
