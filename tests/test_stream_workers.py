"""Two `rollstream process` workers in one consumer group, one SIGKILLed mid-run.

They share the partitions of a 4-partition topic (and of a 4-partition ultra topic, partition i of
both to one worker) and commit side by side to one trajectories
table (each commit fenced by its own partitions' txn versions). One is SIGKILLed with rows of the
second half still unpublished; the survivor gets its partitions once the short session timeout
(10 s by default) evicts the dead member. Counted from Delta: every trajectory exactly once,
every group whole.
"""

from __future__ import annotations

import signal
import time
import uuid
from pathlib import Path

import polars as pl
import pyarrow as pa
import pytest
from confluent_kafka import ConsumerGroupState, KafkaException
from confluent_kafka.admin import AdminClient
from stream_support import (
    group_name_fixture,  # noqa: F401 (provides the group_name fixture)
    publish,
    start_worker,
    stop_worker,
    table_rows,
    wait_for,
)

from infra.workers import worker_argv
from producers.fleet import SyntheticFleet, without_code
from schemas import TrajectoryCodec
from stream_processors.offsets import ConcurrentWriterError, TxnTable

TRAJECTORIES = 4_000
GROUP_SIZE = 4
PARTITIONS = 4
pytestmark = pytest.mark.timeout(420)


def assignment(admin: AdminClient, group: str) -> dict[str, set[tuple[str, int]]]:
    """{worker instance id: assigned (topic, partition)s} of a stable group; empty while it rebalances.

    Each worker is two members, one per lane (``<instance id>-raw``, ``<instance id>-ultra``).
    """
    try:
        described = admin.describe_consumer_groups([group])[group].result(timeout=30)
    except KafkaException:  # the group's coordinator is not known yet
        return {}
    if described.state != ConsumerGroupState.STABLE:
        return {}
    workers: dict[str, set[tuple[str, int]]] = {}
    for m in described.members:
        worker = str(m.group_instance_id).rsplit("-", 1)[0]
        workers.setdefault(worker, set()).update(
            (tp.topic, tp.partition) for tp in m.assignment.topic_partitions
        )
    return workers


def rows_of(uri: Path, partitions: set[int]) -> int:
    """Rows of `uri` from the given source partitions (0 before the table exists)."""
    if table_rows(uri) == 0:
        return 0
    return (
        pl.scan_delta(str(uri))
        .filter(pl.col("partition").is_in(list(partitions)))
        .select(pl.len())
        .collect()
        .item()
    )


def test_two_workers_share_partitions_and_one_is_killed(
    bootstrap_servers, admin, make_topic, group_name, tmp_path
):
    raw = make_topic("workers-raw", partitions=PARTITIONS)
    ultra = make_topic("workers-ultra", partitions=PARTITIONS, config={"max.message.bytes": "67108864"})
    dlq = make_topic("workers-dlq", partitions=1)
    lake = tmp_path / "lake"
    traj = lake / "trajectories"
    app_id = f"workers-{uuid.uuid4().hex[:8]}"
    group = group_name("workers")
    codec = TrajectoryCodec()
    records = list(without_code(SyntheticFleet(seed=23, group_size=GROUP_SIZE).trajectories(TRAJECTORIES)))
    messages = [(r["group_id"].encode(), codec.encode(r)) for r in records]
    half = TRAJECTORIES // 2  # a multiple of GROUP_SIZE: no group straddles the halves
    publish(bootstrap_servers, raw, messages[:half])

    logs = {name: tmp_path / name / "worker.log" for name in ("a", "b")}
    procs = {}
    for name, log in logs.items():
        log.parent.mkdir()
        procs[name] = start_worker(
            bootstrap_servers, lake, raw, dlq, app_id, group, log, ultra=ultra, extra=["--instance-id", name]
        )
    try:
        split: dict[str, set[tuple[str, int]]] = {}

        def both_hold() -> bool:
            split.clear()
            split.update(assignment(admin, group))
            return len(split) == 2 and all(split.values())

        wait_for(both_hold, 120, procs["a"], logs["a"], "both workers holding partitions")
        before = {name[0]: {p for t, p in held if t == raw} for name, held in split.items()}
        assert before["a"] | before["b"] == set(range(PARTITIONS)) and not before["a"] & before["b"]
        # Co-partitioned: the worker of raw partition i also reads ultra partition i (same key, same
        # partition number), so a group's raw and ultra samples meet in one worker.
        assert {name[0]: {p for t, p in held if t == ultra} for name, held in split.items()} == before
        wait_for(lambda: rows_of(traj, before["b"]) > 0, 120, procs["b"], logs["b"], "rows from worker b")

        procs["b"].send_signal(signal.SIGKILL)
        procs["b"].wait(timeout=30)
        killed_at = time.monotonic()
        publish(bootstrap_servers, raw, messages[half:])
        took_over = wait_for(
            lambda: (
                assignment(admin, group) == {"a-0": {(t, p) for t in (raw, ultra) for p in range(PARTITIONS)}}
            ),
            120,
            procs["a"],
            logs["a"],
            "the survivor holding every partition",
        )
        takeover_s = took_over - killed_at
        wait_for(lambda: table_rows(traj) >= TRAJECTORIES, 240, procs["a"], logs["a"], "every row")
        code = stop_worker(procs["a"], logs["a"])
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
    assert code == 0, logs["a"].read_text()[-3000:]
    print(f"\nbefore the kill: {before}; survivor took every partition {takeover_s:.1f} s after the SIGKILL")

    rows = pl.read_delta(str(traj)).select("trajectory_id", "group_id", "partition", "offset")
    assert rows.height == TRAJECTORIES  # nothing doubled
    assert set(rows["trajectory_id"]) == {r["trajectory_id"] for r in records}  # nothing lost
    assert rows.select("partition", "offset").n_unique() == TRAJECTORIES
    assert rows.group_by("group_id").len()["len"].unique().to_list() == [GROUP_SIZE]  # every group whole
    assert set(rows["partition"].unique()) == set(range(PARTITIONS))
    # A takeover takes about 15 s (session timeout 10 s, then one rebalance); the bound here is
    # loose so that a loaded machine does not fail it, and still catches a 60 s hold.
    assert takeover_s < 45, f"the survivor took {takeover_s:.1f} s to get the dead worker's partitions"


def test_commits_are_fenced_by_their_own_partitions(tmp_path):
    """Another worker's commit of other partitions passes; one of ours refuses the stale writer."""
    table = TxnTable(str(tmp_path / "t"), app_id="fenced")
    rows = pa.table({"x": pa.array([1], pa.int64())})
    table.commit(rows, {("t", 0): 9}, {}, expected={("t", 0): -1})
    table.commit(rows, {("t", 1): 4}, {}, expected={("t", 1): -1})  # another worker, partition 1
    table.commit(rows, {("t", 0): 19}, {}, expected={("t", 0): 9})
    with pytest.raises(ConcurrentWriterError, match=r"t\[0\] has stored offset 19"):
        table.commit(rows, {("t", 0): 29}, {}, expected={("t", 0): 9})  # a zombie's stale view
    assert table.stored_offset("t", 0) == 19 and table.stored_offset("t", 1) == 4
    assert pl.read_delta(str(tmp_path / "t")).height == 3


def test_workers_option_is_dropped_from_the_children_command_line():
    argv = ["process", "--app-id", "a", "--workers", "3", "--batch-size", "9", "--workers=2"]
    assert worker_argv(argv) == ["process", "--app-id", "a", "--batch-size", "9"]
