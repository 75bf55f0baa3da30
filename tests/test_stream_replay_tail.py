"""A replay under new consumer groups, with the state already in Delta, takes the tail of the topic.

The topic's length is not a multiple of the intake batch (250), and a group is cut by the stop:
its first samples wait pending in the first run and its last ones arrive later. Every message must
end as exactly one row, the cut group complete, and each group's committed offset at the end.
"""

from __future__ import annotations

import uuid
from functools import partial

import polars as pl
import pytest
from stream_support import (
    committed_offsets,
    group_caught_up,
    group_name_fixture,  # noqa: F401 (provides the group_name fixture)
    publish,
    start_worker,
    stop_worker,
    table_rows,
    wait_for,
)

from producers.fleet import SyntheticFleet
from schemas import TrajectoryCodec

pytestmark = pytest.mark.timeout(600)
GROUP_SIZE = 8
FIRST = 563  # 70 whole groups and 3 samples of the 71st; 563 = 2 x 250 + 63
TOTAL = 704  # 88 whole groups; 704 = 2 x 250 + 204


def test_a_replay_takes_the_tail(bootstrap_servers, make_topic, group_name, tmp_path):
    raw = make_topic("stream-raw", partitions=1)
    dlq = make_topic("stream-dlq", partitions=1)
    lake = tmp_path / "lake"
    traj_uri = lake / "trajectories"
    app_id = f"test-tail-{uuid.uuid4().hex[:8]}"
    codec = TrajectoryCodec()
    records = list(SyntheticFleet(seed=23, group_size=GROUP_SIZE).trajectories(TOTAL))
    assert len({r["group_id"] for r in records[FIRST - 3 : FIRST + 5]}) == 1  # the cut group
    messages = [(r["group_id"].encode(), codec.encode(r)) for r in records]
    publish(bootstrap_servers, raw, messages[:FIRST])
    no_wall_timeout = ["--group-wall-timeout", "600"]

    # 1. The first 563: 70 groups written, the 71st pending; Kafka's committed offset stops at its
    #    first sample.
    first_group = group_name("stream-tail-a")
    log1 = tmp_path / "worker1.log"
    proc = start_worker(bootstrap_servers, lake, raw, dlq, app_id, first_group, log1, extra=no_wall_timeout)
    try:
        wait_for(lambda: table_rows(traj_uri) >= FIRST - 3, 300, proc, log1, "the whole groups")
        wait_for(
            lambda: committed_offsets(bootstrap_servers, first_group, raw, 1) == {0: FIRST - 3},
            60,
            proc,
            log1,
            "the commit up to the pending group",
        )
    finally:
        assert stop_worker(proc, log1) == 0, log1.read_text()[-3000:]
    assert table_rows(traj_uri) == FIRST - 3
    assert committed_offsets(bootstrap_servers, first_group, raw, 1) == {0: FIRST - 3}

    # 2. The tail arrives; a worker under a new group (no committed offset) must skip what Delta
    #    holds, re-read the pending group's first samples, and take all of the tail.
    publish(bootstrap_servers, raw, messages[FIRST:])
    second_group = group_name("stream-tail-b")
    log2 = tmp_path / "worker2.log"
    proc = start_worker(bootstrap_servers, lake, raw, dlq, app_id, second_group, log2, extra=no_wall_timeout)
    try:
        wait_for(lambda: table_rows(traj_uri) >= TOTAL, 300, proc, log2, "the tail")
        wait_for(
            partial(group_caught_up, bootstrap_servers, second_group, raw, 1), 60, proc, log2, "the commit"
        )
    finally:
        assert stop_worker(proc, log2) == 0, log2.read_text()[-3000:]
    table = pl.read_delta(str(traj_uri))
    assert table.height == TOTAL
    assert sorted(table["offset"].to_list()) == list(range(TOTAL))
    assert set(table["trajectory_id"]) == {r["trajectory_id"] for r in records}
    assert set(table["group_status"]) == {"complete"}  # the cut group too, across both runs
    assert not (lake / "dead_letters").exists() or table_rows(lake / "dead_letters") == 0

    # 3. A third group with everything in Delta: nothing is written again, and the group's
    #    committed offset still reaches the end of the topic.
    third_group = group_name("stream-tail-c")
    log3 = tmp_path / "worker3.log"
    proc = start_worker(bootstrap_servers, lake, raw, dlq, app_id, third_group, log3)
    try:
        wait_for(
            partial(group_caught_up, bootstrap_servers, third_group, raw, 1), 120, proc, log3, "the commit"
        )
    finally:
        assert stop_worker(proc, log3) == 0, log3.read_text()[-3000:]
    assert table_rows(traj_uri) == TOTAL
