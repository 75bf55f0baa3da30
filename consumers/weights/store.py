"""Where published weights live: the safetensors files and the ``policies`` Delta table, and reading them.

Weights live beside the table (``<lake>/weights/v<number>/<sha256[:16]>.safetensors``), not
inside it, where a vacuum would delete files the log does not reference. Files go through
deltalake's object store with the same ``storage_options`` as the tables, so a lake may be a
local path or an object-store URI (``s3://``, ``gs://``, ``az://``).
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Mapping
from pathlib import Path

import polars as pl
import pyarrow as pa
import torch
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake._internal import DeltaFileSystemHandler
from deltalake.exceptions import CommitFailedError, DeltaError
from safetensors import SafetensorError
from safetensors.torch import load as load_safetensors

from consumers.exceptions import ChecksumError, WeightsError
from consumers.table import TableSnapshot
from schemas.newest_table import NewestTable
from schemas.policy_version import PolicyVersion
from schemas.tables import POLICIES_SCHEMA

log = logging.getLogger(__name__)

POLICIES_TABLE = "policies"
WEIGHTS_DIR = "weights"
TXN_APP_ID = "rollstream-policies"
"""The Delta application transaction whose version is the newest published number."""
POLICY_VERSION_TAG = "rollstream.policy_version"
SHA256_TAG = "rollstream.sha256"
CHUNK_BYTES = 8 << 20


class PoliciesTable:
    """The policies Delta table: created on first use, append-only, read by version number."""

    def __init__(self, lake: str, storage_options: dict[str, str] | None) -> None:
        self.uri = f"{lake}/{POLICIES_TABLE}"
        self.storage_options = storage_options
        self._handle = NewestTable(self.uri, storage_options)

    def refresh(self) -> DeltaTable | None:
        """The table at its newest version (read incrementally), or None before it exists."""
        try:
            return self._handle.newest()
        except (DeltaError, OSError) as exc:
            raise WeightsError(f"reading the newest version of {self.uri} failed: {exc}") from exc

    def open(self) -> DeltaTable:
        """The table at its newest version, created (empty, append-only) when missing."""
        handle = self.refresh()
        if handle is not None:
            return handle
        try:
            DeltaTable.create(
                self.uri,
                schema=POLICIES_SCHEMA,
                mode="ignore",
                name=POLICIES_TABLE,
                configuration={"delta.appendOnly": "true"},
                storage_options=self.storage_options,
            )
        except (CommitFailedError, DeltaError) as exc:
            log.info("%s: created concurrently (%s); opening it", self.uri, exc)
        handle = self.refresh()
        if handle is None:
            raise WeightsError(f"creating the policies table {self.uri} failed: check the lake's permissions")
        return handle

    def read(self, handle: DeltaTable, number: int) -> PolicyVersion | None:
        """The record of `number` at the handle's version, or None."""
        snapshot = TableSnapshot(self.uri, handle.version(), self.storage_options)
        rows = snapshot.scan().filter(pl.col("number") == number).collect().to_dicts()
        if len({row["sha256"] for row in rows}) > 1:
            raise WeightsError(
                f"{self.uri} holds {len(rows)} rows of version {number} with different sha256: it was "
                "written around publish_version; remove the stray rows with a Delta restore"
            )
        return PolicyVersion.from_dict(rows[0]) if rows else None

    def append(self, handle: DeltaTable, record: PolicyVersion) -> bool:
        """Commit the row with its transaction; False when a concurrent commit won (read again)."""
        now_ms = int(time.time() * 1000)
        properties = CommitProperties(
            app_transactions=[Transaction(TXN_APP_ID, record.number, now_ms)],
            custom_metadata={POLICY_VERSION_TAG: str(record.number), SHA256_TAG: record.sha256},
        )
        row = pa.Table.from_pylist([record.as_dict()], schema=POLICIES_SCHEMA)
        try:
            write_deltalake(
                handle,
                row,
                mode="append",
                storage_options=self.storage_options,
                commit_properties=properties,
            )
        except CommitFailedError as exc:
            log.warning("%s: concurrent commit (%s); reading the table again", self.uri, exc)
            return False
        except (DeltaError, OSError) as exc:
            raise WeightsError(
                f"committing policy version {record.number} to {self.uri} failed: {exc}"
            ) from exc
        return True


class WeightsStore:
    """Files under one root URI, through deltalake's object store (local paths too).

    deltalake's public `DeltaStorageHandler` cannot write in 1.6.6 (its pyarrow wrapper passes
    `pyarrow.Buffer`s the Rust stream refuses), so this uses the handler it wraps.
    """

    def __init__(self, root: str, storage_options: dict[str, str] | None) -> None:
        if "://" not in root:
            Path(root).mkdir(parents=True, exist_ok=True)
        self.root = root
        try:
            self._handler = DeltaFileSystemHandler(root, storage_options, None)
        except (DeltaError, OSError) as exc:
            raise WeightsError(f"cannot reach {root}: {exc}; check the URI and storage_options") from exc

    def put(self, local: Path, relative: str) -> None:
        """Copy `local` to `relative` whole: written under a temporary name, then moved."""
        directory, _, name = relative.rpartition("/")
        temporary = f"{directory}/.{name}.{time.time_ns()}.tmp"
        try:
            stream = self._handler.open_output_stream(temporary, None)
            with local.open("rb") as file:
                while chunk := file.read(CHUNK_BYTES):
                    stream.write(chunk)
            stream.close()  # type: ignore[attr-defined]  # the stub omits it; closing completes the upload
            self._handler.move_file(temporary, relative)
        except (DeltaError, OSError) as exc:
            raise WeightsError(f"writing {self.root}/{relative} failed: {exc}") from exc

    def delete(self, relative: str) -> None:
        """Remove a file no record names; a failure is only logged (an orphan file is harmless)."""
        try:
            self._handler.delete_file(relative)
        except (DeltaError, OSError) as exc:
            log.warning("could not remove the unpublished file %s/%s: %s", self.root, relative, exc)

    def read(self, relative: str) -> bytes:
        """The whole file; FileNotFoundError when it is missing."""
        file = self._handler.open_input_file(relative)
        try:
            return bytes(file.read(file.size()))
        finally:
            file.close()  # type: ignore[attr-defined]  # the stub omits it


class PolicyWatcher:
    """Polls the policies table for the newest version, cheaply.

    Keeps one table handle and reads only the log entries added since the last call; the row
    is read only when the newest number changed.

    Args:
        lake_uri: The lake whose ``policies`` table to read (local path or object-store URI).
        storage_options: Passed through to deltalake and polars for object stores.
    """

    def __init__(self, lake_uri: str, *, storage_options: Mapping[str, str] | None = None) -> None:
        self._table = PoliciesTable(
            normalize_lake(lake_uri), dict(storage_options) if storage_options else None
        )
        self._latest: PolicyVersion | None = None

    def latest(self) -> PolicyVersion | None:
        """The newest published version, or None before the first."""
        handle = self._table.refresh()
        number = handle.transaction_version(TXN_APP_ID) if handle is not None else None
        if handle is None or number is None:
            return None
        if self._latest is None or self._latest.number != number:
            self._latest = self._table.read(handle, number)
        return self._latest

    def get(self, number: int) -> PolicyVersion | None:
        """The record of version `number`, or None when it is not published."""
        handle = self._table.refresh()
        return self._table.read(handle, number) if handle is not None else None


def latest_version(
    lake_uri: str, *, storage_options: Mapping[str, str] | None = None
) -> PolicyVersion | None:
    """The newest published version in the lake, or None; poll with a `PolicyWatcher` instead."""
    return PolicyWatcher(lake_uri, storage_options=storage_options).latest()


def load_weights(
    record: PolicyVersion, *, storage_options: Mapping[str, str] | None = None
) -> dict[str, torch.Tensor]:
    """The tensors of a published version (on the CPU), after checking the file's size and sha256.

    Raises:
        ChecksumError: the file's size or sha256 differs from the record; nothing is loaded.
        WeightsError: the file is missing or unreadable.
    """
    directory, _, name = record.path.rpartition("/")
    try:
        data = WeightsStore(directory, dict(storage_options) if storage_options else None).read(name)
    except (DeltaError, OSError) as exc:
        raise WeightsError(
            f"policy version {record.number}: cannot read its weights {record.path}: {exc}"
        ) from exc
    sha256 = hashlib.sha256(data).hexdigest()
    if len(data) != record.size_bytes or sha256 != record.sha256:
        raise ChecksumError(
            f"policy version {record.number}: {record.path} has {len(data)} bytes with sha256 {sha256}, "
            f"its record says {record.size_bytes} bytes with sha256 {record.sha256}; the file is "
            "corrupt or was replaced: do not serve it, republish the version or take an older one"
        )
    try:
        return load_safetensors(data)
    except SafetensorError as exc:
        raise WeightsError(
            f"policy version {record.number}: {record.path} matches its sha256 but is no safetensors "
            f"file ({exc}); it was published by something other than publish_version"
        ) from exc


def normalize_lake(uri: str) -> str:
    """A local lake as an absolute path (records name their files absolutely); URIs unchanged."""
    if uri.startswith("file://"):
        uri = uri.removeprefix("file://")
    if "://" in uri:
        return uri.rstrip("/")
    return str(Path(uri).expanduser().resolve())
