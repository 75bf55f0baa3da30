"""Delta on a real S3-compatible store: MinIO started the way `rollstream up --object-store` does.

The same topic processed by `rollstream process` into a local lake and into s3://.../lake gives
the same rows and dead letters; `rollstream sql` and the replay buffer read them back from the
store. 8 writer processes append to one table at once through TxnTable (their own partitions' txn
ids), with aws_conditional_put=etag: every row is there and every commit got its own version
(HAZARDS.md: s3proxy lost 2 to 6 of 8 such commits without an error). `down` stops the store.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pyarrow as pa
import pytest
from concurrent_writer import COMMITS, ROWS, append_batches
from deltalake import DeltaTable
from stream_support import (
    REPO,
    group_name_fixture,  # noqa: F401 (provides the group_name fixture)
    publish,
    start_worker,
    stop_worker,
    wait_for,
)

from consumers.replay import ReplayBuffer, ReplayConfig
from consumers.replay.log import TableLog
from infra import services
from infra.exceptions import ObjectStoreError
from infra.object_store import (
    ObjectStore,
    ensure_minio,
    object_store_status,
    start_object_store,
    stop_object_store,
)
from infra.processes import is_alive
from infra.settings import Settings
from producers.fleet import SyntheticFleet, without_code
from schemas import TrajectoryCodec
from stream_processors.compaction import Compactor
from stream_processors.offsets import TxnTable

TRAJECTORIES = 800
COMPARED = ["trajectory_id", "group_id", "reward", "advantage", "group_status", "bucket", "response_tokens"]
WRITERS = 8
pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def store_settings(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Settings, ObjectStore]]:
    settings = Settings(state_dir=tmp_path_factory.mktemp("object-store"))
    try:
        store = start_object_store(settings, build=False)  # the install step builds MinIO, never a test
    except ObjectStoreError as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield settings, store
    finally:
        stop_object_store(settings)


def test_a_missing_minio_fails_at_once_naming_the_install_step(tmp_path):
    settings = Settings(state_dir=tmp_path / "state", cache_dir=tmp_path / "empty-cache")
    with pytest.raises(ObjectStoreError) as raised:
        start_object_store(settings, build=False)
    message = str(raised.value)
    assert (
        "\n" not in message and "install step 'minio'" in message and "bash infra/run.sh install" in message
    )
    assert not (tmp_path / "empty-cache" / "minio").exists()  # nothing was built or fetched


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


def test_a_compaction_adds_no_rows_for_a_follower_of_the_table(store_settings):
    """On an object store the replay log diffs versions; a compaction's rewritten files are no new rows."""
    _, store = store_settings
    uri, options = f"{store.lake_uri}/compacted-{uuid.uuid4().hex[:8]}", store.storage_options
    table = TxnTable(uri, app_id="compacted", partition_by=["bucket"], storage_options=options)
    for commit in range(4):
        rows = pa.table(
            {"offset": pa.array(range(8 * commit, 8 * commit + 8), pa.int64()), "bucket": ["a"] * 8}
        )
        table.commit(rows, {("t", 0): 8 * commit + 7}, {}, expected={("t", 0): 8 * commit - 1})
    log = TableLog(uri, storage_options=options)
    appended = log.latest_version()
    assert appended is not None and [f.num_records for f in log.added_files(appended)] == [8]

    done = Compactor(
        uri, partition_by="bucket", min_files=4, target_bytes=2**20, storage_options=options
    ).run()

    assert [(c.files_removed, c.files_added) for c in done] == [(4, 1)]
    rows = pa.table({"offset": pa.array(range(32, 40), pa.int64()), "bucket": ["a"] * 8})
    table.commit(rows, {("t", 0): 39}, {}, expected={("t", 0): 31})  # an append after the compaction
    assert log.latest_version() == appended + 2
    assert log.added_files(appended + 1) == []
    assert [f.num_records for f in log.added_files(appended + 2)] == [8]
    assert [f.num_records for f in TableLog(uri, storage_options=options).added_files(appended)] == [8]
    assert pl.read_delta(uri, storage_options=options)["offset"].sort().to_list() == list(range(40))


def test_down_stops_the_object_store(tmp_path: Path):
    settings = Settings(state_dir=tmp_path / "stack")
    try:
        start_object_store(settings, build=False)
    except ObjectStoreError as exc:
        pytest.fail(str(exc), pytrace=False)
    pid = object_store_status(settings).pid
    assert pid is not None and is_alive(pid)
    stopped = services.down(settings)
    assert any(s.startswith("object store") for s in stopped)
    assert not is_alive(pid) and not object_store_status(settings).running


def count_rows(uri: str, options: dict[str, str] | None) -> int:
    if not DeltaTable.is_deltatable(uri, storage_options=options):
        return 0
    return pl.scan_delta(uri, storage_options=options).select(pl.len()).collect().item()


def test_object_store_lake_matches_the_local_lake(
    store_settings, bootstrap_servers, make_topic, group_name, tmp_path
):
    _, store = store_settings
    raw, dlq = make_topic("s3-raw", partitions=2), make_topic("s3-dlq", partitions=1)
    codec = TrajectoryCodec()
    records = list(without_code(SyntheticFleet(seed=5, group_size=4).trajectories(TRAJECTORIES)))
    messages: list[tuple[bytes | None, bytes]] = [(r["group_id"].encode(), codec.encode(r)) for r in records]
    for i in range(3):
        messages.insert(100 * (i + 1), (f"bad-{i}".encode(), b"not avro at all"))
    publish(bootstrap_servers, raw, messages)

    options = store.storage_options
    lakes: dict[str, tuple[str, dict[str, str] | None]] = {
        "local": (str(tmp_path / "lake"), None),
        "s3": (f"{store.lake_uri}-{uuid.uuid4().hex[:8]}", options),
    }
    for name, (lake, opts) in lakes.items():
        log = tmp_path / name / "worker.log"
        log.parent.mkdir()
        env = {"ROLLSTREAM_STORAGE_OPTIONS": json.dumps(opts)} if opts else {}
        proc = start_worker(
            bootstrap_servers, lake, raw, dlq, f"s3-{name}", group_name(f"s3-{name}"), log, env=env
        )
        try:
            wait_for(
                lambda lake=lake, opts=opts: (
                    count_rows(f"{lake}/trajectories", opts) + count_rows(f"{lake}/dead_letters", opts)
                    >= len(messages)
                ),
                180,
                proc,
                log,
                f"every message in the {name} lake",
            )
        finally:
            code = stop_worker(proc, log) if proc.poll() is None else proc.returncode
        assert code == 0, log.read_text()[-3000:]

    def read(name: str, table: str, columns: list[str]) -> pl.DataFrame:
        lake, opts = lakes[name]
        frame = pl.read_delta(f"{lake}/{table}", storage_options=opts)
        return frame.sort("partition", "offset").select("partition", "offset", *columns)

    local, remote = read("local", "trajectories", COMPARED), read("s3", "trajectories", COMPARED)
    assert local.height == TRAJECTORIES
    assert local.equals(remote)
    letters = ["error_type", "raw"]
    assert read("local", "dead_letters", letters).equals(read("s3", "dead_letters", letters))
    assert read("s3", "dead_letters", letters).height == 3

    s3_lake = lakes["s3"][0]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        "ROLLSTREAM_STATE_DIR": str(tmp_path / "sql"),
        "ROLLSTREAM_LAKE_URI": s3_lake,
        "ROLLSTREAM_STORAGE_OPTIONS": json.dumps(options),
    }
    sql = "SELECT count(*) AS n, count(DISTINCT trajectory_id) AS ids FROM trajectories"
    done = subprocess.run(
        [sys.executable, "-m", "infra.cli", "sql", sql, "--format", "json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"n": TRAJECTORIES, "ids": TRAJECTORIES}

    config = ReplayConfig(
        table_uri=f"{s3_lake}/trajectories",
        storage_options=options,
        token_budget=1 << 20,
        max_length=1 << 16,
        max_uses=1,
    )
    with ReplayBuffer(config) as buffer:
        batch = buffer.sample(0, timeout=60)
    assert batch["trajectory_ids"] and set(batch["trajectory_ids"]) <= set(local["trajectory_id"])


def test_a_missing_minio_without_go_says_what_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    settings = Settings(state_dir=tmp_path / "stack", cache_dir=tmp_path / "cache")
    monkeypatch.setenv("PATH", str(tmp_path / "no-go-here"))
    with pytest.raises(ObjectStoreError, match=r"Go is not installed: install Go"):
        ensure_minio(settings)
    assert not (tmp_path / "cache" / "minio" / "bin" / "minio").exists()
