"""The Delta log as a feed of data files: which files each new table version added.

A tailing reader needs only what a commit added, never the whole table again. For a local table
the commit file `_delta_log/<version>.json` names its `add` actions directly; elsewhere (object
stores, or a commit file already cleaned up after a checkpoint) the files of version v are
diffed against those of v - 1 through deltalake. Adds with `dataChange: false` (OPTIMIZE
rewrites: `rollstream maintain`, and the stream worker's own compaction) carry rows already read
and are skipped; in a diff, a version whose commit names a REARRANGING operation adds none.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

from deltalake import DeltaTable
from deltalake.exceptions import DeltaError, TableNotFoundError

from consumers.exceptions import MissingTableError
from schemas.local_table import commit_file, local_path

REARRANGING = frozenset({"OPTIMIZE"})
"""Operations that only rewrite files: every file they add holds rows of files they remove."""


@dataclass(frozen=True)
class DataFile:
    """One data file a commit added: its path relative to the table and its partition values."""

    path: str
    version: int
    partition_values: tuple[tuple[str, str | None], ...] = ()
    num_records: int | None = None

    def partition(self, name: str) -> str | None:
        """The file's value of partition column `name` (None when not partitioned by it)."""
        return dict(self.partition_values).get(name)

    def shard(self, count: int) -> int:
        """The shard (of `count`) this file belongs to: a stable hash of its path."""
        return zlib.crc32(self.path.encode()) % count


class TableLog:
    """Follows a Delta table's versions and lists the data files each one added.

    Args:
        uri: the table (a local path or a URL deltalake understands).
        storage_options: passed through to deltalake for object stores.
    """

    def __init__(self, uri: str, *, storage_options: Mapping[str, str] | None = None) -> None:
        self.uri = uri
        self.storage_options = dict(storage_options) if storage_options else None
        self._local = local_path(uri)
        self._table: DeltaTable | None = None
        self._operations: dict[int, str | None] = {}

    def latest_version(self, *, known: int | None = None) -> int | None:
        """The newest committed version, or None when the table does not exist yet.

        With `known` (a version already seen) a local table is probed upward from it, one file
        check per new commit, instead of listing a log directory that grows with the table.
        """
        if self._local is not None:
            if known is None:
                return self._latest_local(self._local / "_delta_log")
            latest = known
            while commit_file(self._local, latest + 1).exists():
                latest += 1
            return latest
        try:
            if self._table is None:
                self._table = DeltaTable(self.uri, storage_options=self.storage_options)
            else:
                self._table.update_incremental()
        except TableNotFoundError:
            return None
        return self._table.version()

    def added_files(self, version: int) -> list[DataFile]:
        """The data files version `version` added (data changes only), in commit order."""
        if self._local is not None:
            commit = commit_file(self._local, version)
            try:
                text = commit.read_text()
            except FileNotFoundError:
                return self._diffed(version)
            return _adds_from_commit(text, version)
        return self._diffed(version)

    def _diffed(self, version: int) -> list[DataFile]:
        if self._operation(version) in REARRANGING:
            return []
        now = _files_of(self._load(version), version)
        before = _files_of(self._load(version - 1), version - 1) if version > 0 else {}
        return [f for path, f in now.items() if path not in before]

    def _operation(self, version: int) -> str | None:
        """The operation of commit `version`, from the newest table's history: the operations of
        every version from `version` on are read at once and kept until asked for. (On a DeltaTable
        loaded at an older version, deltalake 1.6.6's `history()` returns the newest commits,
        labelled with the older versions.)"""
        if version not in self._operations:
            if self._table is None:
                self._table = DeltaTable(self.uri, storage_options=self.storage_options)
            if self._table.version() < version:
                self._table.update_incremental()
            newest = self._table.version()
            self._operations = {
                int(e["version"]): e.get("operation")
                for e in self._table.history(max(1, newest - version + 1))
            }
        return self._operations.pop(version, None)

    def _load(self, version: int) -> DeltaTable:
        try:
            return DeltaTable(self.uri, version=version, storage_options=self.storage_options)
        except (TableNotFoundError, DeltaError) as exc:
            raise MissingTableError(
                f"cannot load version {version} of {self.uri!r} ({exc}): its log entry is gone "
                "(log retention) or the table is missing; start from a version still in the log"
            ) from exc

    @staticmethod
    def _latest_local(log_dir: Path) -> int | None:
        if not log_dir.is_dir():
            return None
        versions = [
            int(p.name[:20]) for p in log_dir.iterdir() if len(p.name) == 25 and p.name.endswith(".json")
        ]
        if not versions:
            last = log_dir / "_last_checkpoint"
            if last.is_file():
                return int(json.loads(last.read_text())["version"])
            return None
        return max(versions)


def _files_of(table: DeltaTable, version: int) -> dict[str, DataFile]:
    """The data files of `table` (loaded at `version`), by path."""
    actions = table.get_add_actions(flatten=False)
    paths = [str(p) for p in actions.column("path").to_pylist()]
    names = actions.column_names
    parts = actions.column("partition").to_pylist() if "partition" in names else [None] * len(paths)
    records = actions.column("num_records").to_pylist() if "num_records" in names else [None] * len(paths)
    files = {}
    for path, values, count in zip(paths, parts, records, strict=True):
        pairs = tuple(sorted((k, None if v is None else str(v)) for k, v in (values or {}).items()))
        files[path] = DataFile(
            path=path,
            version=version,
            partition_values=pairs,
            num_records=None if count is None else int(count),
        )
    return files


def _adds_from_commit(text: str, version: int) -> list[DataFile]:
    files = []
    for line in text.splitlines():
        if not line.strip():
            continue
        action = json.loads(line)
        add = action.get("add")
        if add is None or not add.get("dataChange", True):
            continue
        stats = add.get("stats")
        records = json.loads(stats).get("numRecords") if stats else None
        files.append(
            DataFile(
                path=unquote(add["path"]),
                version=version,
                partition_values=tuple(sorted((add.get("partitionValues") or {}).items())),
                num_records=records,
            )
        )
    return files


def check_table(log: TableLog) -> int:
    """The table's latest version; a clear error when there is no table."""
    latest = log.latest_version()
    if latest is None:
        raise MissingTableError(
            f"no Delta table at {log.uri!r}: `rollstream process` writes the trajectories table "
            "there; run it first or pass the right table URI (e.g. <lake>/trajectories)"
        )
    return latest
