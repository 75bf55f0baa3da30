"""Table upkeep against the real processor: compaction, checkpoint and vacuum while it writes."""

from __future__ import annotations

import polars as pl
import pytest
from deltalake import DeltaTable
from stream_support import (
    group_name_fixture,  # noqa: F401 (provides the group_name fixture)
    publish,
    start_worker,
    stop_worker,
    table_rows,
    wait_for,
)

from infra.maintenance import maintain_table
from producers.fleet import SyntheticFleet
from schemas import TrajectoryCodec

pytestmark = pytest.mark.timeout(600)
APP_ID = "maintain-e2e"
NON_CODE = ("math", "extraction", "precomputed")  # no sandbox runs: upkeep is what this test is about


@pytest.mark.slow(39)
def test_maintain_while_the_processor_writes_loses_and_doubles_nothing(
    bootstrap_servers, make_topic, group_name, tmp_path
):
    raw = make_topic("maintain-raw", partitions=4)
    dlq = make_topic("maintain-dlq", partitions=1, config={"max.message.bytes": "67108864"})
    codec = TrajectoryCodec()
    fleet = SyntheticFleet(seed=5, group_size=4)
    records = [r for r in fleet.trajectories(3_000) if r["task_type"] in NON_CODE]
    records = records[: len(records) - len(records) % 4]
    first, second = records[: len(records) // 2], records[len(records) // 2 :]
    lake, logs = tmp_path / "lake", tmp_path / "logs"
    logs.mkdir()
    traj = lake / "trajectories"

    publish(bootstrap_servers, raw, [(r["group_id"].encode(), codec.encode(r)) for r in first])
    log = logs / "worker-0.log"
    proc = start_worker(bootstrap_servers, lake, raw, dlq, APP_ID, group_name("maintain-a"), log)
    try:
        wait_for(lambda: table_rows(traj) >= len(first), 300, proc, log, "the first half")
        publish(bootstrap_servers, raw, [(r["group_id"].encode(), codec.encode(r)) for r in second])
        report = maintain_table(str(traj), delete=True)  # while the second half is being written
        wait_for(lambda: table_rows(traj) >= len(records), 300, proc, log, "every row")
    finally:
        assert stop_worker(proc, log) == 0, log.read_text()[-3000:]
    assert report.compaction["numFilesRemoved"] >= 2 and report.checkpointed

    frame = pl.read_delta(str(traj))
    assert frame.height == len(records)
    assert frame.select("topic", "partition", "offset").n_unique() == len(records)
    assert frame["trajectory_id"].n_unique() == len(records)


@pytest.mark.slow(30)
def test_the_worker_compacts_its_small_files_while_it_writes(
    bootstrap_servers, make_topic, group_name, tmp_path
):
    raw = make_topic("compact-raw", partitions=2)
    dlq = make_topic("compact-dlq", partitions=1, config={"max.message.bytes": "67108864"})
    codec = TrajectoryCodec()
    records = [
        r for r in SyntheticFleet(seed=6, group_size=4).trajectories(1_200) if r["task_type"] in NON_CODE
    ]
    records = records[: len(records) - len(records) % 4]
    lake, logs = tmp_path / "lake", tmp_path / "logs"
    logs.mkdir()
    traj, log = lake / "trajectories", logs / "worker.log"
    extra = ["--compact-files", "4", "--compact-every", "0.5", "--idle-commit", "0.05"]
    proc = start_worker(
        bootstrap_servers, lake, raw, dlq, "compact-e2e", group_name("compact"), log, extra=extra
    )
    chunks = [records[i : i + 40] for i in range(0, len(records), 40)]
    try:
        published = 0
        for n, chunk in enumerate(chunks):  # one small commit per chunk: files pile up in every bucket
            publish(bootstrap_servers, raw, [(r["group_id"].encode(), codec.encode(r)) for r in chunk])
            published += len(chunk)
            wait_for(lambda want=published: table_rows(traj) >= want, 120, proc, log, f"chunk {n}")
        operations = lambda: [c.get("operation") for c in DeltaTable(str(traj)).history()]  # noqa: E731
        wait_for(lambda: "OPTIMIZE" in operations(), 60, proc, log, "a compaction")
    finally:
        assert stop_worker(proc, log) == 0, log.read_text()[-3000:]
    history = operations()
    writes = history.count("WRITE")
    assert writes >= len(chunks), history  # at least a commit per chunk
    files = len(DeltaTable(str(traj)).file_uris())
    assert "compacted bucket=" in log.read_text()
    frame = pl.read_delta(str(traj))
    assert frame.height == len(records) and frame["trajectory_id"].n_unique() == len(records)
    assert files < writes, (files, writes)  # without compaction: a file per bucket per commit
