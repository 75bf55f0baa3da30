"""A trajectory re-sent (same trajectory_id, the retry-after-timeout case) lands once.

Injected: copies of earlier trajectories in the same partition, some while the first copy's group
is pending, some after it was written, some after a restart (in process: a crash that loses the
stage's memory; on the real broker: the worker stopped and started again). Counted: one row per
trajectory_id, one dead letter `duplicate` per copy at the copy's offset, and the same split of
rows and dead letters whether the stage crashed or not.
"""

from __future__ import annotations

import random
import zlib

import polars as pl
import pytest
from stream_support import (
    group_name_fixture,  # noqa: F401 (provides the group_name fixture)
    publish,
    start_worker,
    stop_worker,
    table_rows,
    wait_for,
)
from test_stream_groups import _stage
from test_stream_groups_e2e import without_code

from producers.fleet import SyntheticFleet
from schemas import TrajectoryCodec
from stream_processors import Coordinates, SourceMessage
from stream_processors.stage import DUPLICATE

pytestmark = pytest.mark.timeout(600)


def _with_copies(
    records: list[dict], rng: random.Random, copies: int, partitions: int = 2
) -> list[SourceMessage]:
    """The records keyed to `partitions` by group_id, with `copies` re-sends of earlier ones inserted
    later in their partition (near: a few messages on; far: hundreds on, after the group was decided)."""
    codec = TrajectoryCodec()
    streams: dict[int, list[dict]] = {p: [] for p in range(partitions)}
    for r in records:
        streams[zlib.crc32(r["group_id"].encode()) % partitions].append(r)
    for i in range(copies):
        p = i % partitions
        stream = streams[p]
        first = rng.randrange(len(stream) // 2)
        gap = rng.randint(1, 5) if i % 2 else rng.randint(200, len(stream) - first)
        stream.insert(min(first + gap, len(stream)), stream[first])
    return [
        SourceMessage(Coordinates("raw", p, o), r["group_id"].encode(), codec.encode(r))
        for p, stream in streams.items()
        for o, r in enumerate(stream)
    ]


def _expected_copies(messages: list[SourceMessage], records: list[dict]) -> set[Coordinates]:
    ids = TrajectoryCodec()
    seen: set[tuple[int, str]] = set()
    copies = set()
    for m in messages:
        key = (m.coordinates.partition, ids.decode(m.value)["trajectory_id"])
        if key in seen:
            copies.add(m.coordinates)
        seen.add(key)
    return copies


def test_copies_become_duplicate_letters_the_same_way_across_crashes(tmp_path):
    records = list(without_code(SyntheticFleet(seed=11, group_size=8).trajectories(1200)))
    messages = _with_copies(records, random.Random(5), copies=60)
    copies = _expected_copies(messages, records)
    assert len(copies) == 60

    crashed: list[int] = []

    def run(name: str, crash_every: int | None) -> tuple[pl.DataFrame, pl.DataFrame, int]:
        lake = tmp_path / name
        stage = _stage(lake, precomputed=True)
        duplicates, position, steps, crashes = 0, 0, 0, 0
        committed: dict[tuple[str, int], int] = {}
        while position < len(messages):
            batch = messages[position : position + 83]
            duplicates += stage.accept(stage.judge(batch)).duplicates
            position += len(batch)
            steps += 1
            assert steps < 300, f"no progress: {position} of {len(messages)} after {steps} batches"
            if steps % 3 == 0:  # some crashes lose an outbox, some pending groups
                stage.flush()
            for tp, offset in stage.safe_offsets().items():  # the acks: Kafka's committed offsets
                committed[tp] = max(committed.get(tp, 0), offset)
            if crash_every and steps % crash_every == 0:
                stage = _stage(lake, precomputed=True)
                unsafe = [
                    i
                    for i, m in enumerate(messages[:position])
                    if m.coordinates.offset >= committed.get(("raw", m.coordinates.partition), 0)
                ]
                crashes += position - min(unsafe, default=position) > 0
                position = min(unsafe, default=position)
        for decided in stage.groups.expire(now=float("inf")):
            stage._decide(decided, 0.0)
        stage.flush()
        rows = pl.read_delta(str(lake / "trajectories"))
        letters = pl.read_delta(str(lake / "dead_letters"))
        crashed.append(crashes)
        print(f"\n{name}: {steps} batches, {crashes} crashes that replayed messages")
        return rows, letters, duplicates

    clean_rows, clean_letters, clean_count = run("clean", None)
    assert clean_count == len(copies)
    crash_rows, crash_letters, _ = run("crashed", 4)
    assert crashed[1] >= 3
    for rows, letters in ((clean_rows, clean_letters), (crash_rows, crash_letters)):
        assert rows.height == len(records) and rows["trajectory_id"].n_unique() == len(records)
        assert set(letters["error_type"]) == {DUPLICATE}
        assert letters.height == len(copies)
        got = {Coordinates(t, p, o) for t, p, o in letters.select("topic", "partition", "offset").iter_rows()}
        assert got == copies
        assert all(reason.startswith("duplicate: ") for reason in letters["reason"])
        assert set(rows["group_status"]) == {"complete"}  # no copy joined a group as a second sample
    key = ["topic", "partition", "offset"]
    assert clean_rows.select(key).sort(key).equals(crash_rows.select(key).sort(key))


def test_a_resent_trajectory_lands_once_on_the_real_broker(
    bootstrap_servers, make_topic, group_name, tmp_path
):
    raw = make_topic("dups-raw", partitions=2)
    dlq = make_topic("dups-dlq", partitions=1)
    group = group_name("dups")
    codec = TrajectoryCodec()
    records = list(without_code(SyntheticFleet(seed=12, group_size=8).trajectories(400)))
    lake, logs = tmp_path / "lake", tmp_path
    traj, dead = lake / "trajectories", lake / "dead_letters"

    def send(batch: list[dict]) -> None:
        publish(bootstrap_servers, raw, [(r["group_id"].encode(), codec.encode(r)) for r in batch])

    # 1. originals, with copies of ten of them right behind (their groups still pending).
    send(records[:200] + records[:10])
    proc = start_worker(bootstrap_servers, lake, raw, dlq, "dups", group, logs / "w1.log")
    try:
        wait_for(
            lambda: table_rows(traj) >= 200 and table_rows(dead) >= 10, 300, proc, logs / "w1.log", "phase 1"
        )
        # 2. copies after the first copies' groups were written.
        send(records[10:20] + records[200:400])
        wait_for(
            lambda: table_rows(traj) >= 400 and table_rows(dead) >= 20, 300, proc, logs / "w1.log", "phase 2"
        )
    finally:
        assert stop_worker(proc, logs / "w1.log") == 0
    assert "(20 duplicates)" in (logs / "w1.log").read_text()  # the worker's metric
    # 3. copies after a restart: the new worker reads the recent ids back from the table.
    send(records[20:30] + records[390:400])
    proc = start_worker(bootstrap_servers, lake, raw, dlq, "dups", group, logs / "w2.log")
    try:
        wait_for(lambda: table_rows(dead) >= 40, 300, proc, logs / "w2.log", "phase 3")
    finally:
        assert stop_worker(proc, logs / "w2.log") == 0
    assert "(20 duplicates)" in (logs / "w2.log").read_text()
    rows = pl.read_delta(str(traj))
    letters = pl.read_delta(str(dead))
    assert rows.height == 400 and rows["trajectory_id"].n_unique() == 400
    assert letters.height == 40 and set(letters["error_type"]) == {DUPLICATE}
    resent = [codec.decode(v)["trajectory_id"] for v in letters["raw"]]
    want = [r["trajectory_id"] for r in records[:30] + records[390:400]]
    assert sorted(resent) == sorted(want)
    # each letter points at a later offset than the row of its trajectory
    firsts = dict(
        zip(rows["trajectory_id"], zip(rows["partition"], rows["offset"], strict=True), strict=True)
    )
    for tid, p, o in zip(resent, letters["partition"], letters["offset"], strict=True):
        assert firsts[tid][0] == p and firsts[tid][1] < o
