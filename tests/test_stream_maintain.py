"""Table upkeep against the real processor: compaction, checkpoint and vacuum while it writes."""

from __future__ import annotations

import re
from pathlib import Path

import polars as pl
import pytest
from deltalake import DeltaTable
from stream_support import (
    group_name_fixture,  # noqa: F401 (provides the group_name fixture)
    non_code_records,
    publish,
    start_worker,
    stop_worker,
    table_rows,
    wait_for,
)

from infra.maintenance import maintain_table
from schemas import TrajectoryCodec

pytestmark = pytest.mark.timeout(600)
APP_ID = "maintain-e2e"


@pytest.mark.slow(39)
def test_maintain_while_the_processor_writes_loses_and_doubles_nothing(
    bootstrap_servers, make_topic, group_name, tmp_path
):
    raw = make_topic("maintain-raw", partitions=4)
    dlq = make_topic("maintain-dlq", partitions=1, config={"max.message.bytes": "67108864"})
    codec = TrajectoryCodec()
    records = non_code_records(5, 3_000)  # no sandbox runs: upkeep is what this test is about
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


def _last_assignment(log: Path) -> list[str]:
    """The partitions of the worker's newest assignment of its raw topic, as logged."""
    found = re.findall(r"assigned partitions \[([\d, ]*)\]", log.read_text())
    return found[-1].split(", ") if found else []


def _compactions(text: str) -> tuple[int, int]:
    """(compactions logged while the worker held partition 0, compactions logged without it)."""
    held: set[str] = set()
    counts = [0, 0]
    for line in text.splitlines():
        if change := re.search(r"(assigned|revoked) partitions \[([\d, ]*)\]", line):
            partitions = set(change.group(2).split(", ")) - {""}
            held = held | partitions if change.group(1) == "assigned" else held - partitions
        elif "compacted bucket=" in line:
            counts["0" not in held] += 1
    return counts[0], counts[1]


@pytest.mark.slow(35)
def test_one_worker_of_a_group_compacts_the_small_files_while_they_write(
    bootstrap_servers, make_topic, group_name, tmp_path
):
    raw = make_topic("compact-raw", partitions=2)
    dlq = make_topic("compact-dlq", partitions=1, config={"max.message.bytes": "67108864"})
    codec = TrajectoryCodec()
    records = non_code_records(6, 1_200)
    lake, logs = tmp_path / "lake", tmp_path / "logs"
    logs.mkdir()
    traj = lake / "trajectories"
    extra = ["--compact-files", "4", "--compact-every", "0.5", "--idle-commit", "0.05"]
    group = group_name("compact")
    workers = []
    for i in range(2):
        log = logs / f"worker-{i}.log"
        workers.append(
            (start_worker(bootstrap_servers, lake, raw, dlq, "compact-e2e", group, log, extra=extra), log)
        )
    chunks = [records[i : i + 40] for i in range(0, len(records), 40)]
    (proc, log), (_, other_log) = workers
    try:
        wait_for(
            lambda: sorted(_last_assignment(log) + _last_assignment(other_log)) == ["0", "1"],
            120, proc, log, "a partition for each worker",
        )  # fmt: skip
        published = 0
        for n, chunk in enumerate(chunks):  # one small commit per chunk: files pile up in every bucket
            publish(bootstrap_servers, raw, [(r["group_id"].encode(), codec.encode(r)) for r in chunk])
            published += len(chunk)
            wait_for(lambda want=published: table_rows(traj) >= want, 120, proc, log, f"chunk {n}")
        operations = lambda: [c.get("operation") for c in DeltaTable(str(traj)).history()]  # noqa: E731
        wait_for(lambda: "OPTIMIZE" in operations(), 60, proc, log, "a compaction")
        # before the shutdown, whose rebalance hands partition 0 to the worker stopped last
        logged = [w.read_text() for w in (log, other_log)]
    finally:
        for worker, worker_log in workers:
            assert stop_worker(worker, worker_log) == 0, worker_log.read_text()[-3000:]
    history = operations()
    writes = history.count("WRITE")
    assert writes >= len(chunks), history  # at least a commit per chunk
    files = len(DeltaTable(str(traj)).file_uris())
    counts = [_compactions(text) for text in logged]
    assert sum(held for held, _ in counts) >= 1 and [without for _, without in counts] == [0, 0], counts
    frame = pl.read_delta(str(traj))
    assert frame.height == len(records) and frame["trajectory_id"].n_unique() == len(records)
    assert files < writes, (files, writes)  # without compaction: a file per bucket per commit
