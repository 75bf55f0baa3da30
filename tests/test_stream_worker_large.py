"""The worker with messages over 1 MB, and its refusal to start on a lake ahead of its topic.

Topics are declared as infra/topics.toml declares rollouts.raw (4 MiB), rollouts.ultra and
rollouts.dlq (64 MiB); librdkafka's and Kafka's defaults stop near 1 MB.
"""

from __future__ import annotations

import uuid

import numpy as np
import polars as pl
import pytest
from deltalake import DeltaTable
from stream_support import (
    BIG,
    group_name_fixture,  # noqa: F401 (provides the group_name fixture)
    publish,
    read_topic,
    start_worker,
    stop_worker,
    table_rows,
    wait_for,
    wait_for_exit,
)

from producers.fleet import SyntheticFleet
from schemas import TrajectoryCodec, pack_float32, pack_int32
from stream_processors import BatchProcessor, Coordinates, DeltaSink, SourceMessage

pytestmark = pytest.mark.timeout(180)
RAW_CONFIG = {"max.message.bytes": str(4 * 2**20)}
BIG_CONFIG = {"max.message.bytes": str(64 * 2**20)}


def long_record(template: dict, tokens: int, logprobs: int) -> dict:
    rng = np.random.default_rng(tokens)
    return {
        **template,
        "trajectory_id": str(uuid.uuid4()),
        "response_tokens": pack_int32(rng.integers(0, 50_000, tokens, dtype=np.int32)),
        "response_logprobs": pack_float32(-rng.random(logprobs, dtype=np.float32)),
    }


def test_big_dead_letters_and_ultra_trajectories_land(bootstrap_servers, make_topic, group_name, tmp_path):
    raw = make_topic("stream-raw", partitions=2, config=RAW_CONFIG)
    ultra = make_topic("stream-ultra", partitions=2, config=BIG_CONFIG)
    dlq = make_topic("stream-dlq", config=BIG_CONFIG)
    codec = TrajectoryCodec()
    records = list(SyntheticFleet(seed=13, group_size=4).trajectories(40))
    bad = codec.encode(long_record(records[0], 300_000, 299_999))  # one logprob missing
    ultra_record = long_record(records[1], 260_000, 260_000)
    good = [(r["group_id"].encode(), codec.encode(r)) for r in records]
    assert len(bad) > 2.3e6 and len(codec.encode(ultra_record)) > 2e6
    sent = publish(bootstrap_servers, raw, [*good[:20], (b"big", bad), *good[20:]], BIG)
    publish(bootstrap_servers, ultra, [(None, codec.encode(ultra_record))], BIG)

    lake = tmp_path / "lake"
    log = tmp_path / "worker.log"
    group = group_name("stream-large-g")
    proc = start_worker(bootstrap_servers, lake, raw, dlq, "large", group, log, ultra=ultra)
    try:
        wait_for(
            lambda: table_rows(lake / "trajectories") == len(records) + 1
            and table_rows(lake / "dead_letters") == 1,
            120, proc, log, "every row and the dead letter",
        )  # fmt: skip
    finally:
        code = stop_worker(proc, log) if proc.poll() is None else proc.returncode
    assert code == 0, log.read_text()[-3000:]

    (letter,) = pl.read_delta(str(lake / "dead_letters")).iter_rows(named=True)
    assert letter["error_type"] == "LengthMismatchError" and letter["raw"] == bad
    assert sent[(letter["partition"], letter["offset"])] == bad
    (message,) = read_topic(bootstrap_servers, dlq, 1)
    assert message.value() == bad and "value_truncated" not in dict(message.headers())
    assert dict(message.headers())["error_type"] == b"LengthMismatchError"

    rows = pl.read_delta(str(lake / "trajectories"))
    assert set(rows["trajectory_id"]) == {r["trajectory_id"] for r in [*records, ultra_record]}
    long_row = rows.filter(pl.col("topic") == ultra).row(0, named=True)
    assert long_row["trajectory_id"] == ultra_record["trajectory_id"]
    assert long_row["response_tokens"] == np.frombuffer(ultra_record["response_tokens"], "<i4").tolist()
    assert set(rows.filter(pl.col("topic") == raw)["trajectory_id"]) == {r["trajectory_id"] for r in records}


def test_the_worker_refuses_a_lake_ahead_of_its_topic(bootstrap_servers, make_topic, group_name, tmp_path):
    raw = make_topic("stream-raw", partitions=1)
    dlq = make_topic("stream-dlq")
    codec = TrajectoryCodec()
    values = [codec.encode(r) for r in SyntheticFleet(seed=17).trajectories(3)]
    publish(bootstrap_servers, raw, [(None, v) for v in values])
    lake = tmp_path / "lake"
    sink = DeltaSink(lake / "trajectories", app_id="kept")
    batch = BatchProcessor().process([SourceMessage(Coordinates(raw, 0, 50), None, values[0])])
    assert sink.write(batch.rows, batch.coordinates) == 1  # as if the topic had been recreated
    version = DeltaTable(str(lake / "trajectories")).version()

    log = tmp_path / "worker.log"
    proc = start_worker(bootstrap_servers, lake, raw, dlq, "kept", group_name("stream-ahead-g"), log)
    code, text = wait_for_exit(proc, log, timeout=90)
    assert code != 0, text[-3000:]
    assert f"trajectories table stored offset 50 for {raw}[0], but that partition ends at offset 3" in text
    assert DeltaTable(str(lake / "trajectories")).version() == version
    assert table_rows(lake / "dead_letters") == 0
