"""The load generator on the real broker: 100,000 trajectories from 4 processes, each arrives once."""

from __future__ import annotations

import time
from collections import Counter

import numpy as np
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from stream_support import SOAK

from producers import SyntheticFleet
from producers.fleet import ULTRA_TOKENS
from producers.loadgen import LoadSpec, id_digest, run_load
from schemas.profile import Bucket, WorkloadProfile, load_profile

pytestmark = pytest.mark.timeout(400)
MESSAGES = 100_000 if SOAK else 40_000
"""Trajectories published by 4 processes: 100,000 with ROLLSTREAM_SOAK=1; at that size on
2 cores the broker's controller can fall seconds behind and fence the broker."""


def tiny_profile(path):
    """Short trajectories (16 to 96 tokens), so 100,000 of them stay a few tens of MB."""
    buckets = (
        Bucket("short", 0, 48, 0.7, (16, 24, 32, 47), 0.5),
        Bucket("long", 48, None, 0.3, (48, 64, 96), 0.5),
    )
    return WorkloadProfile(buckets, source="test", method="by hand").save(path)


def trajectory_id(value: bytes) -> str:
    """The first field of the Avro body (after the 10-byte single-object header): a string."""
    pos, shift, raw = 10, 0, 0
    while True:
        byte = value[pos]
        raw |= (byte & 0x7F) << shift
        pos, shift = pos + 1, shift + 7
        if not byte & 0x80:
            break
    length = (raw >> 1) ^ -(raw & 1)
    return value[pos : pos + length].decode()


def read_all(bootstrap_servers: str, topic: str, partitions: int, expected: int) -> list[bytes]:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap_servers, "group.id": "load-reader", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    values: list[bytes] = []
    deadline = time.monotonic() + 120
    try:
        while len(values) < expected and time.monotonic() < deadline:
            values += [m.value() for m in consumer.consume(5000, 0.5) if m.error() is None]
        end = time.monotonic() + 2.0  # anything past `expected` would be a duplicate
        while time.monotonic() < end:
            values += [m.value() for m in consumer.consume(5000, 0.2) if m.error() is None]
    finally:
        consumer.close()
    return values


def test_trajectories_from_4_processes_arrive_once(bootstrap_servers, make_topic, tmp_path):
    raw = make_topic("load-raw", partitions=4, config={"max.message.bytes": str(4 * 2**20)})
    ultra = make_topic("load-ultra", config={"max.message.bytes": str(64 * 2**20)})
    spec = LoadSpec(
        bootstrap_servers=bootstrap_servers,
        topic=raw,
        ultra_topic=ultra,
        trajectories=MESSAGES,
        workers=4,
        seed=7,
        profile_path=tiny_profile(tmp_path / "tiny.toml"),
    )
    started = time.monotonic()
    report = run_load(spec)
    summary = report.as_dict()
    print(f"published {summary['acked']} in {summary['seconds']} s ({summary['messages_per_s']} msg/s)")
    assert summary["errors"] == [] and (report.acked, report.failed) == (MESSAGES, 0)
    assert [w.acked for w in report.workers] == [MESSAGES // 4] * 4

    values = read_all(bootstrap_servers, raw, 4, MESSAGES)
    ids = [trajectory_id(v) for v in values]
    assert len(values) == MESSAGES, f"{len(values)} messages in the topic for {MESSAGES} published"
    assert len(set(ids)) == MESSAGES, Counter(ids).most_common(3)
    assert id_digest(ids) == summary["trajectory_digest"]
    print(f"whole test {time.monotonic() - started:.1f} s")


def test_fleet_draws_lengths_from_the_profile_with_groups_of_8_to_16():
    profile = load_profile()
    fleet = SyntheticFleet(5, num_domains=300, profile=profile, group_sizes=(8, 16), ultra_share=0.002)
    records = list(fleet.trajectories(6000))
    assert len(fleet.domains) == 300
    starts = [r for r in records if r["sample_index"] == 0]
    assert {r["group_size"] for r in starts} == set(range(8, 17))
    responses = np.array([len(r["response_tokens"]) // 4 for r in records])
    ultra = responses >= ULTRA_TOKENS[0]
    assert 0 < ultra.sum() < 40 and all(
        r["finish_reason"] == "length" for r, u in zip(records, ultra, strict=True) if u
    )
    totals = np.array([(len(r["prompt_tokens"]) + len(r["response_tokens"])) // 4 for r in records])[~ultra]
    mix = profile.mix(totals)
    # Each bucket is drawn (task types lean, domain caps clip, a group shares its prompt).
    assert all(share > 0.05 for share in mix.values()), mix
    assert profile.distance(mix) < 0.25, (mix, profile.targets)
