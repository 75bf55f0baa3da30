"""Delta on a real S3-compatible store: MinIO started the way `rollstream up --object-store` does.

8 writer processes append to one table at once through TxnTable (their own partitions' txn ids),
with aws_conditional_put=etag: every row is there and every commit got its own version (HAZARDS.md:
s3proxy lost 2 to 6 of 8 such commits without an error). Then `down` stops the store.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pyarrow as pa
import pytest
from deltalake import DeltaTable

from infra import services
from infra.object_store import ObjectStore, object_store_status, start_object_store, stop_object_store
from infra.processes import is_alive
from infra.settings import Settings
from stream_processors.offsets import Coordinates, TxnTable

WRITERS = 8
COMMITS = 2
ROWS = 50
pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def store_settings(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Settings, ObjectStore]]:
    settings = Settings(state_dir=tmp_path_factory.mktemp("object-store"))
    try:
        yield settings, start_object_store(settings)
    finally:
        stop_object_store(settings)


def append_batches(uri: str, options: dict[str, str], writer: int) -> int:
    """One writer process: COMMITS appends of ROWS rows of its own partition; returns rows written."""
    table = TxnTable(uri, app_id="concurrent", storage_options=options, commit_retries=20)
    written = 0
    for commit in range(COMMITS):
        offsets = range(commit * ROWS, (commit + 1) * ROWS)
        coords = [Coordinates("t", writer, o) for o in offsets]
        written += table.append(
            coords,
            lambda keep, coords=coords: pa.table(
                {
                    "partition": pa.array([writer] * len(keep), pa.int32()),
                    "offset": pa.array([coords[i].offset for i in keep], pa.int64()),
                }
            ),
        )
    return written


def test_concurrent_writers_keep_every_commit(store_settings):
    _, store = store_settings
    uri = f"{store.lake_uri}/concurrent"
    with multiprocessing.get_context("spawn").Pool(WRITERS) as pool:
        written = pool.starmap(append_batches, [(uri, store.storage_options, w) for w in range(WRITERS)])
    assert written == [COMMITS * ROWS] * WRITERS
    table = DeltaTable(uri, storage_options=store.storage_options)
    assert table.version() == WRITERS * COMMITS - 1  # versions 0..15: one per commit, none overwritten
    assert len(table.history()) == WRITERS * COMMITS
    rows = pl.read_delta(uri, storage_options=store.storage_options)
    assert rows.height == WRITERS * COMMITS * ROWS
    assert rows.select("partition", "offset").n_unique() == rows.height
    for w in range(WRITERS):  # each writer's txn version is its last offset
        assert TxnTable(uri, app_id="concurrent", storage_options=store.storage_options).stored_offset(
            "t", w
        ) == (COMMITS * ROWS - 1)


def test_down_stops_the_object_store(tmp_path: Path):
    settings = Settings(state_dir=tmp_path / "stack")
    start_object_store(settings)
    pid = object_store_status(settings).pid
    assert pid is not None and is_alive(pid)
    stopped = services.down(settings)
    assert any(s.startswith("object store") for s in stopped)
    assert not is_alive(pid) and not object_store_status(settings).running
