"""On the real broker: groups split across batches and lanes, SIGKILL thrice, same numbers.

20,000 trajectories in groups of 8, keyed by group_id; the longest samples go to the ultra topic, so
a group's samples arrive in batches of both lanes. One worker runs clean; another, on a fresh lake,
is SIGKILLed at three random moments and restarted each time. Both must give every trajectory one
row, the same advantages, group statuses and domain statistics, and advantages that match the ones
computed offline from the table's rewards. Then: a recreated topic is refused with the command that
resets it, and that command lets the worker start afresh.
"""

from __future__ import annotations

import random
import signal
import time
import uuid

import numpy as np
import polars as pl
import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from stream_support import (
    BIG,
    committed_offsets,
    group_name_fixture,  # noqa: F401 (provides the group_name fixture)
    publish,
    start_worker,
    stop_worker,
    table_rows,
    wait_for,
)

from infra.cli import main as cli_main
from producers.fleet import SyntheticFleet, without_code
from schemas import TrajectoryCodec
from stream_processors import BatchProcessor, DeadLetters, DeltaSink, Stage
from stream_processors.domain_stats import merge
from stream_processors.offsets import TxnTable
from stream_processors.preflight import topic_ids
from stream_processors.stage import TopicIdMismatchError
from stream_processors.state import stored_partitions

APP_ID = "groups-e2e"
TRAJECTORIES = 20_000
GROUP_SIZE = 8
ULTRA_FROM_TOKENS = 1_500
pytestmark = pytest.mark.timeout(900)
WORKER_FLAGS = [
    "--instance-id",
    "e2e",
    "--session-timeout",
    "8",
    "--group-wall-timeout",
    "600",
    "--commit-interval",
    "0.5",
]


def _run(
    bootstrap_servers,
    raw,
    ultra,
    dlq,
    lake,
    group,
    logs,
    kills: list[float],
    total: int = TRAJECTORIES,
    done=None,
) -> None:
    """Run the worker until every trajectory is a row (and `done()`, when given); SIGKILL it once
    each share more of the `total` rows landed."""
    app_id = APP_ID
    traj = lake / "trajectories"
    finished = done or (lambda: True)
    for i, fraction in enumerate([*kills, None]):
        log = logs / f"worker-{i}.log"
        proc = start_worker(
            bootstrap_servers, lake, raw, dlq, app_id, group, log, ultra=ultra, extra=WORKER_FLAGS
        )
        try:
            if fraction is None:
                wait_for(lambda: table_rows(traj) >= total and finished(), 400, proc, log, "every row")
                break
            target = min(table_rows(traj) + int(total * fraction), total - total // 40)
            wait_for(lambda t=target: table_rows(traj) >= t, 400, proc, log, f"{target} rows")  # type: ignore[misc]
            time.sleep(random.Random(i).uniform(0.0, 0.7))
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
            print(f"\nSIGKILL {i + 1} at {table_rows(traj)} rows in Delta (waited for {target})")
            _committed_offsets_are_stored(bootstrap_servers, group, raw, ultra, traj)
        finally:
            if proc.poll() is None:
                # SIGTERM before the worker took over its signals (while importing) ends it with -15.
                wait_for(
                    lambda w=log: "[^Worker]: Ready" in w.read_text(), 120, proc, log, "the worker ready"
                )
                assert stop_worker(proc, log) == 0, log.read_text()[-3000:]


def _committed_offsets_are_stored(bootstrap_servers, group, raw, ultra, traj) -> None:
    """Kafka's committed offset never passes a message that is not a row or a dead letter yet."""
    columns = ["topic", "partition", "offset"]
    if table_rows(traj):
        stored = pl.read_delta(str(traj), columns=columns)
    else:  # killed before its first commit: nothing may be committed to Kafka either
        stored = pl.DataFrame(schema={"topic": pl.String, "partition": pl.Int32, "offset": pl.Int64})
    letters = traj.parent / "dead_letters"
    if table_rows(letters):
        stored = pl.concat([stored, pl.read_delta(str(letters), columns=columns)])
    for topic, partitions in ((raw, 4), (ultra, 2)):
        for partition, committed in committed_offsets(bootstrap_servers, group, topic, partitions).items():
            if committed <= 0:
                continue
            have = set(
                stored.filter((pl.col("topic") == topic) & (pl.col("partition") == partition))["offset"]
            )
            missing = set(range(committed)) - have
            assert not missing, (
                f"{topic}[{partition}] committed {committed} but {sorted(missing)[:5]} are not rows"
            )


def _merged_stats(lake) -> dict[str, list[float]]:
    """Per-domain statistics merged over the newest stored state of every partition."""
    parts = stored_partitions(TxnTable(str(lake / "trajectories"), app_id=APP_ID), APP_ID)
    return {k: v.as_list() for k, v in sorted(merge(p.stats for p in parts.values()).items())}


@pytest.mark.slow(91)
def test_groups_across_lanes_and_sigkills(bootstrap_servers, make_topic, group_name, tmp_path):
    raw = make_topic("groups-raw", partitions=4)
    ultra = make_topic("groups-ultra", partitions=2, config={"max.message.bytes": "67108864"})
    dlq = make_topic("groups-dlq", partitions=1, config={"max.message.bytes": "67108864"})
    codec = TrajectoryCodec()
    records = list(without_code(SyntheticFleet(seed=61, group_size=GROUP_SIZE).trajectories(TRAJECTORIES)))
    to_raw, to_ultra = [], []
    for r in records:
        long = len(r["response_tokens"]) // 4 > ULTRA_FROM_TOKENS
        (to_ultra if long else to_raw).append((r["group_id"].encode(), codec.encode(r)))
    publish(bootstrap_servers, raw, to_raw)
    publish(bootstrap_servers, ultra, to_ultra, BIG)
    assert len(to_ultra) > 100

    _run(bootstrap_servers, raw, ultra, dlq, tmp_path / "clean", group_name("groups-clean"), tmp_path, [])
    rng = random.Random(6)
    kills = [rng.uniform(0.05, 0.3) for _ in range(3)]
    (tmp_path / "killed").mkdir()
    _run(
        bootstrap_servers, raw, ultra, dlq, tmp_path / "lake-killed", group_name("groups-killed"),
        tmp_path / "killed", kills,
    )  # fmt: skip

    clean = pl.read_delta(str(tmp_path / "clean" / "trajectories"))
    killed = pl.read_delta(str(tmp_path / "lake-killed" / "trajectories"))
    for frame in (clean, killed):
        assert frame.height == TRAJECTORIES and frame["trajectory_id"].n_unique() == TRAJECTORIES
        assert frame.select("topic", "partition", "offset").unique().height == TRAJECTORIES
        assert set(frame["topic"].unique()) == {raw, ultra}
        assert frame["group_status"].unique().to_list() == ["complete"]
    split = clean.group_by("group_id").agg(pl.col("topic").n_unique().alias("lanes"))
    spanning = split.filter(pl.col("lanes") == 2).height
    print(
        f"\n{spanning} of {split.height} groups span both topics; {len(to_ultra)} samples on the ultra topic"
    )
    assert spanning > 50  # groups really span both lanes

    # Advantages of every complete group match the offline computation from the table's rewards.
    signal_rows = clean.filter(~pl.col("verifier_status").is_in(["skipped", "error", "timeout"]))
    offline = signal_rows.with_columns(
        (
            (pl.col("reward") - pl.col("reward").mean().over("group_id"))
            / (pl.col("reward").std(ddof=0).over("group_id") + 1e-6)
        ).alias("offline"),
        pl.len().over("group_id").alias("n"),
    ).with_columns(pl.when(pl.col("n") >= 2).then(pl.col("offline")).otherwise(0.0).alias("offline"))
    assert np.allclose(offline["advantage"].to_numpy(), offline["offline"].to_numpy(), rtol=0, atol=1e-9)
    sums = offline.group_by("group_id").agg(pl.col("advantage").sum())["advantage"].abs()
    assert sums.max() < 1e-6

    joined = clean.join(killed, on="trajectory_id", suffix="_k")
    assert joined.height == TRAJECTORIES
    assert np.allclose(joined["advantage"].to_numpy(), joined["advantage_k"].to_numpy(), rtol=0, atol=1e-9)
    assert (joined["group_status"] == joined["group_status_k"]).all()
    first, second = _merged_stats(tmp_path / "clean"), _merged_stats(tmp_path / "lake-killed")
    assert first.keys() == second.keys()
    for domain in first:
        assert np.allclose(first[domain], second[domain], rtol=0, atol=1e-9), domain


def test_a_recreated_topic_is_refused_until_reset(
    bootstrap_servers, make_topic, admin: AdminClient, tmp_path, monkeypatch
):
    raw = make_topic("groups-recreated", partitions=1)
    app_id = f"reset-{uuid.uuid4().hex[:6]}"
    lake = tmp_path / "lake"

    def stage() -> Stage:
        return Stage(
            BatchProcessor(),
            DeltaSink(lake / "trajectories", app_id=app_id),
            DeadLetters(lake / "dead_letters", app_id=app_id),
        )

    codec = TrajectoryCodec()
    records = list(SyntheticFleet(seed=2, group_size=2).trajectories(4))
    publish(bootstrap_servers, raw, [(r["group_id"].encode(), codec.encode(r)) for r in records])
    first = stage()
    first.load([(raw, 0)], topic_ids(bootstrap_servers, [raw]))
    from stream_processors import Coordinates, SourceMessage

    first.run([SourceMessage(Coordinates(raw, 0, i), None, codec.encode(r)) for i, r in enumerate(records)])

    admin.delete_topics([raw])[raw].result(timeout=30)
    deadline = time.monotonic() + 30
    while True:
        try:
            admin.create_topics([NewTopic(raw, 1, 1)])[raw].result(timeout=30)
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    with pytest.raises(
        TopicIdMismatchError, match=rf"rollstream offsets reset --topic {raw} --app-id {app_id}"
    ):
        stage().load([(raw, 0)], topic_ids(bootstrap_servers, [raw]))

    monkeypatch.setenv("ROLLSTREAM_KAFKA__BOOTSTRAP_SERVERS", bootstrap_servers)
    monkeypatch.setenv("ROLLSTREAM_LAKE_URI", str(lake))
    monkeypatch.setenv("ROLLSTREAM_STATE_DIR", str(tmp_path))
    assert cli_main(["offsets", "reset", "--topic", raw, "--app-id", app_id]) == 0
    again = stage()
    again.load([(raw, 0)], topic_ids(bootstrap_servers, [raw]))
    assert again.state.partitions[(raw, 0)].next == 0
    out = again.run(
        [SourceMessage(Coordinates(raw, 0, i), None, codec.encode(r)) for i, r in enumerate(records)]
    )
    assert out.rows_written == 4  # the new topic's offsets are written again, not skipped
