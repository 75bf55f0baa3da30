"""Groups across batches and lanes, advantages, domain statistics and state in the Delta commit (no broker)."""

from __future__ import annotations

import json
import random
import threading
import zlib

import numpy as np
import polars as pl
import pytest
from deltalake import DeltaTable

from producers.fleet import SyntheticFleet, without_code
from schemas import TrajectoryCodec
from stream_processors import BatchProcessor, Coordinates, DeadLetters, DeltaSink, SourceMessage, Stage
from stream_processors.advantages import GroupNormalization, Member, OverlongPenalty, decide_group
from stream_processors.domain_stats import DomainStats, RunningStats, merge
from stream_processors.exceptions import SinkError
from stream_processors.groups import GroupBuffer
from stream_processors.offsets import TxnTable, legacy_txn_app_id, txn_app_id
from stream_processors.state import STATE_KEY, stored_partitions
from stream_processors.verifiers import PrecomputedVerifier, VerifierRegistry

pytestmark = pytest.mark.timeout(300)
APP = "groups-test"


def members(rewards, statuses=None, components=None, lengths=None):
    n = len(rewards)
    return [
        Member(r, (statuses or ["ok"] * n)[i], (components or [{}] * n)[i], (lengths or [10] * n)[i])
        for i, r in enumerate(rewards)
    ]


def _reference_advantages(values, mode, epsilon=1e-6):
    """Advantages the way numpy's mean and std compute them."""
    array = np.asarray(values, dtype=np.float64)
    centered = array - array.mean()
    return centered if mode == "dr_grpo" else centered / (array.std() + epsilon)


@pytest.mark.parametrize("mode", ["grpo", "dr_grpo"])
def test_advantages_are_bit_identical_to_numpy_mean_and_std(mode):
    rng = random.Random(5)
    for _ in range(2000):
        n = rng.randint(2, 40)
        draw = rng.choice(
            [lambda: rng.random(), lambda: float(rng.randint(0, 1)), lambda: rng.uniform(-1e6, 1e6)]
        )
        rewards = [draw() for _ in range(n)]
        got = decide_group(members(rewards), GroupNormalization(mode=mode), status="timed_out").advantages
        assert got == _reference_advantages(rewards, mode).tolist()
        parts = [{"a": r, "b": draw()} for r in rewards]
        per = decide_group(
            members(rewards, components=parts),
            GroupNormalization(mode=mode, per_component=True),
            status="complete",
        ).advantages
        expected = _reference_advantages([p["a"] for p in parts], mode) + _reference_advantages(
            [p["b"] for p in parts], mode
        )
        assert per == expected.tolist()


def test_grpo_and_dr_grpo():
    rewards = [1.0, 0.0, 0.5, 0.0]
    grpo = decide_group(members(rewards), GroupNormalization(), status="complete")
    r = np.asarray(rewards)
    assert np.allclose(grpo.advantages, (r - r.mean()) / (r.std() + 1e-6), atol=1e-12)
    assert abs(sum(grpo.advantages)) < 1e-9 and grpo.status == "complete"
    dr = decide_group(members(rewards), GroupNormalization(mode="dr_grpo"), status="timed_out")
    assert np.allclose(dr.advantages, r - r.mean()) and dr.status == "timed_out"
    no_signal = decide_group(
        members([1.0, 0.0, 0.0], ["ok", "fail", "error"]), GroupNormalization(), status="complete"
    )
    assert no_signal.advantages[2] == 0.0 and no_signal.advantages[0] == pytest.approx(1.0, abs=1e-5)
    assert decide_group(members([1.0]), GroupNormalization(), status="complete").advantages == [0.0]
    with pytest.raises(ValueError, match="mode"):
        GroupNormalization(mode="ppo")  # type: ignore[arg-type]


def test_per_component_band_pass_and_overlong():
    comps = [{"a": 1.0, "b": 0.0}, {"a": 0.0, "b": 10.0}, {"a": 1.0, "b": 10.0}]
    out = decide_group(
        members([1.0, 10.0, 11.0], components=comps),
        GroupNormalization(per_component=True),
        status="complete",
    )
    a, b = np.array([1.0, 0.0, 1.0]), np.array([0.0, 10.0, 10.0])
    want = (a - a.mean()) / (a.std() + 1e-6) + (b - b.mean()) / (b.std() + 1e-6)
    assert np.allclose(out.advantages, want)
    band = GroupNormalization(band_pass=(0.1, 0.9))
    assert decide_group(members([1.0, 1.0], ["ok", "ok"]), band, status="complete").status == "filtered"
    assert decide_group(members([0.0, 0.0], ["fail", "fail"]), band, status="complete").status == "filtered"
    assert decide_group(members([1.0, 0.0], ["ok", "fail"]), band, status="complete").status == "complete"
    # constant continuous rewards: inside the band by success rate, but no variance (OpenRLHF #1270)
    flat = decide_group(members([0.7, 0.7], ["ok", "fail"]), band, status="complete")
    assert flat.status == "filtered"
    penalty = OverlongPenalty(max_tokens=100, cache_tokens=20)
    assert (penalty(80), penalty(90), penalty(100), penalty(150)) == (0.0, -0.5, -1.0, -1.0)
    out = decide_group(
        members([1.0, 1.0], lengths=[50, 90]), GroupNormalization(overlong=penalty), status="complete"
    )
    assert out.rewards == [1.0, 0.5] and out.components[1] == {"overlong_penalty": -0.5}


def test_running_stats_merge_and_decay():
    rng = np.random.default_rng(0)
    values = rng.normal(3.0, 2.0, 1000)
    one = RunningStats()
    for v in values:
        one.add(float(v))
    assert one.mean == pytest.approx(values.mean()) and one.std == pytest.approx(values.std())
    parts = [DomainStats(), DomainStats()]
    parts[0].add("d", values[:300].tolist())
    parts[1].add("d", values[300:].tolist())
    merged = merge(parts)["d"]
    assert (
        merged.count == 1000 and merged.mean == pytest.approx(one.mean) and merged.m2 == pytest.approx(one.m2)
    )
    decayed = DomainStats(decay=0.9)
    decayed.add("d", [0.0] * 200 + [10.0] * 200)
    assert decayed.domains["d"].mean == pytest.approx(10.0, abs=1e-6)  # forgot the zeros
    assert decayed.domains["d"].count == pytest.approx(10.0, abs=1e-3)  # 1 / (1 - 0.9)


def test_timeout_rule_and_duplicates():
    fleet = SyntheticFleet(seed=1, group_size=4)
    records = list(fleet.trajectories(8))
    processor = BatchProcessor()
    codec = TrajectoryCodec()
    samples = processor.judge(
        [SourceMessage(Coordinates("raw", 0, i), None, codec.encode(r)) for i, r in enumerate(records)]
    ).samples
    buffer = GroupBuffer(event_timeout_s=3600, wall_timeout_s=10)
    assert buffer.add(samples[0], now=0.0) is None
    dup = buffer.add(
        samples[0].__class__(**{**_fields(samples[0]), "coordinates": Coordinates("raw", 0, 99)}), now=0
    )
    assert dup is not None and dup.status == "duplicate" and len(dup.samples) == 1
    assert buffer.add(samples[1], now=1.0) is None
    assert buffer.expire(now=9.0) == []
    (released,) = buffer.expire(now=10.0)
    assert released.status == "timed_out" and len(released.samples) == 2
    late = buffer.add(samples[2], now=11.0)
    assert late is not None and late.status == "late"
    decided = [buffer.add(s, now=12.0) for s in samples[4:8]]
    assert decided[:3] == [None, None, None] and decided[3] is not None and decided[3].status == "complete"
    assert len(buffer) == 0 and buffer.nbytes == 0


def _fields(sample):
    return {name: getattr(sample, name) for name in sample.__slots__}


def _messages(records, codec, raw_partitions=4, ultra_from=None):
    """Groups keyed to raw partitions by group; long samples go to an ultra partition (a separate lane)."""
    offsets: dict[tuple[str, int], int] = {}
    out = []
    for r in records:
        p = zlib.crc32(r["group_id"].encode()) % raw_partitions
        tp = (
            ("ultra", p % 2)
            if ultra_from is not None and len(r["response_tokens"]) // 4 > ultra_from
            else ("raw", p)
        )
        o = offsets.get(tp, 0)
        offsets[tp] = o + 1
        out.append(SourceMessage(Coordinates(tp[0], tp[1], o), r["group_id"].encode(), codec.encode(r)))
    return out


def _stage(tmp_path, **kwargs):
    registry = VerifierRegistry({"precomputed": PrecomputedVerifier()})
    processor = BatchProcessor(verifiers=registry) if kwargs.pop("precomputed", False) else BatchProcessor()
    stage = Stage(
        processor,
        DeltaSink(tmp_path / "trajectories", app_id=APP),
        DeadLetters(tmp_path / "dead_letters", app_id=APP),
        groups=GroupBuffer(event_timeout_s=1e9, wall_timeout_s=1e9),
        **kwargs,
    )
    stage.load([(t, p) for t in ("raw", "ultra") for p in range(4)], {"raw": "id-raw", "ultra": "id-ultra"})
    return stage


def _offline_check(frame: pl.DataFrame) -> None:
    for (group_id,), g in frame.group_by("group_id"):
        assert g["group_status"].unique().to_list() == ["complete"], group_id
        signal = g.filter(~pl.col("verifier_status").is_in(["skipped", "error", "timeout"]))
        if signal.height < 2:
            continue
        r = signal["reward"].to_numpy()
        want = (r - r.mean()) / (r.std() + 1e-6)
        assert np.allclose(
            signal.sort("sample_index")["advantage"].to_numpy(),
            want[np.argsort(signal["sample_index"].to_numpy())],
            atol=1e-9,
        )
        assert abs(signal["advantage"].sum()) < 1e-6


def test_groups_split_across_batches_and_lanes_survive_restarts(tmp_path):
    # Code as precomputed rewards: the groups and their state are tested here, not the sandbox
    # (twice 1,600 judgements with ~500 sandboxed runs each took 170 s of the suite).
    records = list(without_code(SyntheticFleet(seed=7, group_size=8).trajectories(1600)))
    codec = TrajectoryCodec()
    messages = _messages(records, codec, ultra_from=600)
    lanes = {
        "raw": [m for m in messages if m.coordinates.topic == "raw"],
        "ultra": [m for m in messages if m.coordinates.topic == "ultra"],
    }
    assert lanes["ultra"] and lanes["raw"]
    rng = random.Random(3)

    def run(crash_points: set[int]) -> pl.DataFrame:
        lake = tmp_path / f"lake-{len(crash_points)}"
        stage = _stage(lake)
        position = {"raw": 0, "ultra": 0}
        steps = 0
        while position["raw"] < len(lanes["raw"]) or position["ultra"] < len(lanes["ultra"]):
            lane = "raw" if rng.random() < 0.7 else "ultra"
            size = 97 if lane == "raw" else 3
            batch = lanes[lane][position[lane] : position[lane] + size]
            if not batch:
                continue
            stage.accept(stage.judge(batch))
            if steps % 5 == 4:
                stage.flush()
            position[lane] += len(batch)
            steps += 1
            if steps in crash_points:
                # a crash: the process's memory is gone; the consumer restarts at the safe offsets
                safe = stage.safe_offsets()
                stage = _stage(lake)
                for name in position:
                    # replay each lane from its lowest message not yet safe (Kafka's committed offset)
                    unsafe = [
                        i
                        for i, m in enumerate(lanes[name][: position[name]])
                        if m.coordinates.offset >= safe.get((m.coordinates.topic, m.coordinates.partition), 0)
                    ]
                    if unsafe:
                        position[name] = min(unsafe)
        stage.flush()
        return pl.read_delta(str(lake / "trajectories"))

    clean = run(set())
    assert clean.height == len(records) and clean["trajectory_id"].n_unique() == len(records)
    assert set(clean["topic"].unique()) == {"raw", "ultra"}
    _offline_check(clean)
    crashed = run({7, 19, 31})
    assert crashed.height == len(records) and crashed["trajectory_id"].n_unique() == len(records)
    _offline_check(crashed)
    joined = clean.join(crashed, on="trajectory_id", suffix="_2")
    assert np.allclose(joined["advantage"], joined["advantage_2"], atol=1e-9)
    assert (joined["group_status"] == joined["group_status_2"]).all()
    first, second = _merged(tmp_path / "lake-0"), _merged(tmp_path / "lake-3")
    assert first.keys() == second.keys()
    assert all(np.allclose(first[k], second[k], rtol=0, atol=1e-9) for k in first)


def _merged(lake) -> dict[str, list[float]]:
    parts = stored_partitions(TxnTable(str(lake / "trajectories"), app_id=APP), APP)
    return {k: v.as_list() for k, v in sorted(merge(p.stats for p in parts.values()).items())}


def test_domains_of_different_scales_standardize(tmp_path):
    fleet = SyntheticFleet(seed=11, group_size=8, num_domains=6)
    codec = TrajectoryCodec()
    rng = np.random.default_rng(5)
    scales = {}
    records = []
    for r in fleet.trajectories(4000):
        scale = scales.setdefault(r["domain"], 100.0 ** (len(scales) % 2))
        records.append(
            {
                **r,
                "task_type": "precomputed",
                "expected_answer": None,
                "gold_fields": None,
                "unit_tests": None,
                "precomputed_reward": float(scale * rng.normal(3.0, 1.0)),
            }
        )
    stage = _stage(tmp_path, precomputed=True, warmup=64)
    messages = _messages(records, codec)
    for i in range(0, len(messages), 250):
        stage.run(messages[i : i + 250])
    frame = pl.read_delta(str(tmp_path / "trajectories")).filter(pl.col("domain_reward") != 0.0)
    assert len(set(scales.values())) == 2
    for (domain,), g in frame.group_by("domain"):
        if g.height < 200:
            continue
        values = g.sort("offset")["domain_reward"].to_numpy()
        assert abs(values.mean()) < 0.1, domain
        assert abs(values.std() - 1.0) < 0.1, domain


@pytest.mark.parametrize("overlong", [None, OverlongPenalty(max_tokens=64, cache_tokens=32)])
def test_rows_carry_the_overlong_penalty_only_when_configured(tmp_path, overlong):
    codec = TrajectoryCodec()
    fleet = SyntheticFleet(seed=3, group_size=4).trajectories(400)
    records = [{**r, "precomputed_reward": 1.0} for r in fleet if r["task_type"] == "precomputed"]
    stage = _stage(tmp_path, normalization=GroupNormalization(overlong=overlong))
    stage.run(_messages(records, codec))
    stage.flush()
    frame = pl.read_delta(str(tmp_path / "trajectories"))
    assert frame.height == len(records) > 0
    penalties = []
    for row in frame.iter_rows(named=True):
        components = dict(row["reward_components"] or [])
        if overlong is None:
            assert row["reward"] == 1.0 and "overlong_penalty" not in components
        else:
            penalties.append(components["overlong_penalty"])
            assert components["overlong_penalty"] == pytest.approx(row["reward"] - 1.0)
    assert overlong is None or min(penalties) < 0.0


def test_txn_app_ids_no_longer_collide_and_old_ones_still_read(tmp_path):
    assert legacy_txn_app_id("p-x", "1", 0) == legacy_txn_app_id("p", "x-1", 0)
    assert txn_app_id("p-x", "1", 0) != txn_app_id("p", "x-1", 0)
    assert json.loads(txn_app_id("p-x", "1", 0)) == ["p-x", "1", 0]


def test_a_pending_group_holds_the_safe_offset_and_leaves_holes(tmp_path):
    codec = TrajectoryCodec()
    records = list(SyntheticFleet(seed=4, group_size=2).trajectories(4))
    first, second = records[:2], records[2:]
    # offset 0: first group's sample 0; offsets 1-2: the second group, complete; offset 3: sample 1 of the first
    order = [first[0], second[0], second[1], first[1]]
    messages = [SourceMessage(Coordinates("raw", 0, i), None, codec.encode(r)) for i, r in enumerate(order)]
    stage = _stage(tmp_path)
    stage.accept(stage.judge(messages[:3]))
    assert stage.safe_offsets()[("raw", 0)] == 0  # the outbox and the pending sample hold it
    assert stage.flush() == 2
    assert stage.safe_offsets()[("raw", 0)] == 0  # the pending sample at offset 0 still does
    stored = json.loads(DeltaTable(str(tmp_path / "trajectories")).history(limit=1)[0][STATE_KEY])
    assert stored["partitions"]['["raw",0]']["next"] == 0
    assert stored["partitions"]['["raw",0]']["holes"] == [1, 2]
    assert DeltaTable(str(tmp_path / "trajectories")).transaction_version(txn_app_id(APP, "raw", 0)) == -1
    restarted = _stage(tmp_path)  # a crash here: the replay from offset 0 skips the holes
    replay = restarted.judge(messages)
    assert replay.skipped == 2 and len(replay.samples) == 2
    restarted.accept(replay)
    assert restarted.flush() == 2
    assert restarted.safe_offsets()[("raw", 0)] == 4
    frame = pl.read_delta(str(tmp_path / "trajectories"))
    assert sorted(frame["offset"].to_list()) == [0, 1, 2, 3]
    assert frame["group_status"].unique().to_list() == ["complete"]


def test_a_partition_assigned_again_reads_its_state_back(tmp_path):
    codec = TrajectoryCodec()
    records = list(SyntheticFleet(seed=8, group_size=2).trajectories(8))
    messages = [SourceMessage(Coordinates("raw", 1, i), None, codec.encode(r)) for i, r in enumerate(records)]
    stage = _stage(tmp_path)
    assert stage.run(messages[:4]).rows_written == 4
    stage.revoke([("raw", 1)])
    assert ("raw", 1) not in stage.state.partitions
    stage.assign([("raw", 1)])
    again = stage.run(messages)  # the new assignment replays from the start
    assert (again.rows_written, again.rows_skipped) == (4, 4)
    assert pl.read_delta(str(tmp_path / "trajectories")).height == 8


def test_a_batch_judged_before_its_partition_was_revoked_is_dropped(tmp_path):
    """Worker A judged a batch, lost the partition to worker B, who wrote it; A writes nothing."""
    codec = TrajectoryCodec()
    records = list(SyntheticFleet(seed=9, group_size=2).trajectories(8))
    messages = [SourceMessage(Coordinates("raw", 2, i), None, codec.encode(r)) for i, r in enumerate(records)]
    a, b = _stage(tmp_path), _stage(tmp_path)
    assert a.run(messages[:2]).rows_written == 2
    judged = a.judge(messages[2:])
    a.revoke([("raw", 2)])
    assert b.run(messages).rows_written == 6  # the new owner resumes after A's commit
    late = a.accept(judged)
    assert (late.records_in, late.rows_written) == (0, 0) and a.flush() == 0
    a.assign([("raw", 2)])  # back to A: it reads B's state first and skips what B wrote
    assert a.run(messages).rows_skipped == 8
    rows = pl.read_delta(str(tmp_path / "trajectories"))
    assert rows.height == 8 and rows["offset"].n_unique() == 8


def test_the_timer_releases_a_timed_out_group_and_commits_it(tmp_path):
    codec = TrajectoryCodec()
    records = list(SyntheticFleet(seed=1, group_size=8).trajectories(14))  # one group of 8, one of 6
    messages = [SourceMessage(Coordinates("raw", 0, i), None, codec.encode(r)) for i, r in enumerate(records)]
    stage = Stage(
        BatchProcessor(),
        DeltaSink(tmp_path / "t", app_id=APP),
        DeadLetters(tmp_path / "d", app_id=APP),
        groups=GroupBuffer(wall_timeout_s=5),
    )
    stage.load([("raw", 0)], {})
    t = 1000.0
    stage.accept(stage.judge(messages), now=t, caught_up=True)
    assert stage.tick(t + 1, caught_up=True) == 8 and stage.safe_offsets()[("raw", 0)] == 8
    assert stage.tick(t + 4.9, caught_up=True) == 0 and stage.pending_groups == 1
    stage.tick(t + 5.0, caught_up=True)  # released, waits for the idle commit
    assert stage.pending_groups == 0 and stage.tick(t + 5.3, caught_up=True) == 6
    assert stage.safe_offsets()[("raw", 0)] == 14
    frame = pl.read_delta(str(tmp_path / "t"))
    assert frame.filter(pl.col("offset") >= 8)["group_status"].unique().to_list() == ["timed_out"]


def test_a_background_commit_keeps_its_rows_unsafe_until_stored_and_a_failed_one_stops_the_stage(tmp_path):
    codec = TrajectoryCodec()
    records = list(without_code(SyntheticFleet(seed=5, group_size=4).trajectories(16)))
    messages = [SourceMessage(Coordinates("raw", 0, i), None, codec.encode(r)) for i, r in enumerate(records)]
    stage = _stage(tmp_path, background_commits=True, write_retries=0)
    table = stage.sink.table
    real_commit = table.commit
    release, entered = threading.Event(), threading.Event()
    failing = {"now": False}

    def held_commit(*args, **kwargs):
        entered.set()
        assert release.wait(30)
        if failing["now"]:
            raise SinkError("the disk is gone")
        return real_commit(*args, **kwargs)

    table.commit = held_commit  # type: ignore[method-assign]
    written: list[int] = []
    stage.on_written = lambda: written.append(pl.read_delta(str(tmp_path / "trajectories")).height)
    t = 1000.0
    first = stage.accept(stage.judge(messages[:8]), now=t, caught_up=True)
    assert first.rows_written == 0 and stage.tick(t + 1, caught_up=True) == 0
    assert entered.wait(30)  # the committer holds the 8 rows of the first two groups
    assert stage.safe_offsets()[("raw", 0)] == 0, "rows of a commit under way counted as safe"
    second = stage.accept(stage.judge(messages[8:]), now=t + 1.1, caught_up=True)  # accepted meanwhile
    assert second.records_in == 8 and second.rows_written == 0
    assert not DeltaTable.is_deltatable(str(tmp_path / "trajectories"))
    release.set()
    assert stage.flush() == 16  # settles the first commit, then commits the other 8 itself
    assert written == [8], "on_written is called once per background commit, after its rows are stored"
    assert stage.safe_offsets()[("raw", 0)] == 16
    assert pl.read_delta(str(tmp_path / "trajectories")).height == 16

    failing["now"], release = True, threading.Event()
    entered.clear()
    more = list(without_code(SyntheticFleet(seed=6, group_size=4).trajectories(4)))
    extra = [SourceMessage(Coordinates("raw", 0, 16 + i), None, codec.encode(r)) for i, r in enumerate(more)]
    stage.accept(stage.judge(extra), now=t + 10, caught_up=True)
    stage.tick(t + 11, caught_up=True)
    assert entered.wait(30)
    release.set()
    with pytest.raises(SinkError, match="the disk is gone"):
        stage.flush()
    assert stage.safe_offsets()[("raw", 0)] == 16, "a failed commit's rows counted as safe"
    assert written == [8], "on_written called for a failed commit"
    assert pl.read_delta(str(tmp_path / "trajectories")).height == 16
