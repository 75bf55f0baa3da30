"""A 1,000,000-token trajectory with logprobs (~8 MB) from the publisher to a Delta row, intact.

The publisher routes it to the ultra topic by size; the broker-wide message.max.bytes stays
Kafka's default, only the topics' own max.message.bytes admit it; the real processor
(`rollstream process`) writes it to Delta, where its tokens and logprobs hash as they were sent.
"""

from __future__ import annotations

import hashlib

import numpy as np
import polars as pl
import pytest
from confluent_kafka.admin import ConfigResource, ResourceType
from stream_support import (
    group_name_fixture,  # noqa: F401 (provides the group_name fixture)
    start_worker,
    stop_worker,
    table_rows,
    wait_for,
)

from producers import Publisher, SyntheticFleet
from schemas import pack_float32, pack_int32

pytestmark = pytest.mark.timeout(300)
MIB = 2**20
KAFKA_DEFAULT_MESSAGE_MAX_BYTES = "1048588"
TOKENS = 1_000_000


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_a_million_token_trajectory_lands_intact(bootstrap_servers, admin, make_topic, group_name, tmp_path):
    broker = ConfigResource(ResourceType.BROKER, "1")
    configs = admin.describe_configs([broker])[broker].result(timeout=30)
    assert configs["message.max.bytes"].value == KAFKA_DEFAULT_MESSAGE_MAX_BYTES

    raw = make_topic("ultra-raw", partitions=2, config={"max.message.bytes": str(4 * MIB)})
    ultra = make_topic("ultra-ultra", partitions=2, config={"max.message.bytes": str(64 * MIB)})
    dlq = make_topic("ultra-dlq", config={"max.message.bytes": str(64 * MIB)})
    records = list(SyntheticFleet(41, group_size=4).trajectories(8))
    rng = np.random.default_rng(41)
    long = dict(records[5])
    long["response_tokens"] = pack_int32(rng.integers(0, 150_000, TOKENS, dtype=np.int32))
    long["response_logprobs"] = pack_float32(-rng.exponential(0.7, TOKENS).astype(np.float32))
    long["finish_reason"] = "length"
    records[5] = long
    sent = {"tokens": digest(long["response_tokens"]), "logprobs": digest(long["response_logprobs"])}

    limits = {raw: 4 * MIB, ultra: 64 * MIB}
    with Publisher(
        bootstrap_servers=bootstrap_servers, topic=raw, ultra_topic=ultra, message_limits=limits
    ) as publisher:
        futures = [publisher.publish(r) for r in records]
    results = [f.result(0) for f in futures]
    assert [r.topic for r in results] == [raw] * 5 + [ultra] + [raw] * 2
    size = len(publisher.codec.encode(long))
    assert 8_000_000 < size < 4 * MIB * 2.5, size

    lake = tmp_path / "lake"
    log = tmp_path / "worker.log"
    proc = start_worker(bootstrap_servers, lake, raw, dlq, "ultra", group_name("ultra-g"), log, ultra=ultra)
    try:
        wait_for(lambda: table_rows(lake / "trajectories") == len(records), 180, proc, log, "every row")
    finally:
        code = stop_worker(proc, log) if proc.poll() is None else proc.returncode
    assert code == 0, log.read_text()[-3000:]
    assert table_rows(lake / "dead_letters") == 0

    table = pl.read_delta(str(lake / "trajectories"))
    assert sorted(table["trajectory_id"]) == sorted(r["trajectory_id"] for r in records)
    row = table.filter(pl.col("trajectory_id") == long["trajectory_id"])
    assert row["topic"].item() == ultra and row["length"].item() == TOKENS + len(long["prompt_tokens"]) // 4
    tokens = row["response_tokens"][0].to_numpy().astype("<i4")
    logprobs = row["response_logprobs"][0].to_numpy().astype("<f4")
    assert len(tokens) == len(logprobs) == TOKENS
    landed = {"tokens": digest(tokens.tobytes()), "logprobs": digest(logprobs.tobytes())}
    assert landed == sent
