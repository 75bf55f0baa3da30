"""The Publisher against the real broker: round trip, keys and partitions, compression, failures."""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from collections import defaultdict

import pytest
from confluent_kafka import Consumer

from producers import Publisher, PublishError, RecordTooLargeError, SyntheticFleet
from schemas import TrajectoryCodec, pack_float32, pack_int32

pytestmark = pytest.mark.timeout(120)


def consume(
    bootstrap_servers: str, topic: str, count: int, *, stats: list | None = None, deadline_s: float = 60
):
    """Read `count` messages from the start of `topic` (fails after `deadline_s` seconds)."""
    config = {
        "bootstrap.servers": bootstrap_servers,
        "group.id": f"test-{uuid.uuid4().hex}",
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
    }
    if stats is not None:
        config |= {"statistics.interval.ms": 200, "stats_cb": lambda s: stats.append(json.loads(s))}
    consumer = Consumer(config)
    consumer.subscribe([topic])
    messages = []
    deadline = time.monotonic() + deadline_s
    try:
        while len(messages) < count:
            assert time.monotonic() < deadline, f"only {len(messages)} of {count} messages arrived"
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            messages.append(msg)
        if stats is not None:
            seen = len(stats)
            while len(stats) < seen + 2 and time.monotonic() < deadline:
                consumer.poll(0.2)
    finally:
        consumer.close()
    return messages


def test_fleet_records_round_trip_once_each_keyed_and_grouped(bootstrap_servers, make_topic):
    topic = make_topic("producers-roundtrip", partitions=4)
    records = list(SyntheticFleet(11).trajectories(400))
    with Publisher(bootstrap_servers=bootstrap_servers, topic=topic) as publisher:
        for record in records:
            publisher.publish(record)
    assert (publisher.published, publisher.failed, publisher.pending) == (400, 0, 0)

    messages = consume(bootstrap_servers, topic, 400)
    codec = TrajectoryCodec()
    by_id = {r["trajectory_id"]: r for r in records}
    partitions_of_group: dict[str, set[int]] = defaultdict(set)
    seen = []
    for msg in messages:
        decoded = codec.decode(msg.value())
        assert decoded == by_id[decoded["trajectory_id"]]
        assert msg.key() == decoded["group_id"].encode("utf-8")
        assert msg.headers() is None
        partitions_of_group[decoded["group_id"]].add(msg.partition())
        seen.append(decoded["trajectory_id"])
    assert sorted(seen) == sorted(by_id)
    assert all(len(parts) == 1 for parts in partitions_of_group.values())
    assert len({p for parts in partitions_of_group.values() for p in parts}) == 4
    # Within a partition, a group's samples keep their order (idempotent, ordered delivery).
    order = [(m.partition(), codec.decode(m.value())) for m in messages]
    for group_id in partitions_of_group:
        assert [r["sample_index"] for _, r in order if r["group_id"] == group_id] == list(range(8))


def test_batches_travel_zstd_compressed(bootstrap_servers, make_topic):
    topic = make_topic("producers-zstd")
    record = next(SyntheticFleet(1).trajectories(1))
    record["response_tokens"] = pack_int32([7] * 20_000)
    record["response_logprobs"] = pack_float32([-0.5] * 20_000)
    payload = 0
    with Publisher(bootstrap_servers=bootstrap_servers, topic=topic) as publisher:
        for i in range(100):
            record["trajectory_id"] = str(uuid.UUID(int=i, version=4))
            publisher.publish(record)
            payload += len(publisher.codec.encode(record))
    stats: list[dict] = []
    messages = consume(bootstrap_servers, topic, 100, stats=stats)
    assert sum(len(m.value()) for m in messages) == payload
    received = max(s["rx_bytes"] for s in stats)
    assert 0 < received < payload / 20, f"{received} bytes on the wire for {payload} bytes of messages"


def test_broker_rejection_surfaces_as_publish_error(bootstrap_servers, make_topic):
    topic = make_topic("producers-small", config={"max.message.bytes": "10000"})
    publisher = Publisher(bootstrap_servers=bootstrap_servers, topic=topic)
    publisher.publish_raw(os.urandom(50_000), b"big")
    with pytest.raises(PublishError) as caught:
        publisher.flush(30)
    error = caught.value
    assert not isinstance(error, RecordTooLargeError)
    assert (error.topic, error.failed) == (topic, 1)
    assert "MSG_SIZE_TOO_LARGE" in error.first_reason and topic in str(error)
    assert (publisher.published, publisher.failed) == (0, 1)

    # Reported once; the publisher stays usable afterwards.
    publisher.publish_raw(b"small", b"k")
    publisher.flush(30)
    assert (publisher.published, publisher.failed) == (1, 1)

    # A failure noticed while polling is raised by the next publish, which then queues nothing.
    publisher.publish_raw(os.urandom(50_000), b"big")
    deadline = time.monotonic() + 30
    while publisher.failed < 2:
        assert time.monotonic() < deadline, "the broker's rejection never arrived"
        publisher.poll(0.1)
    with pytest.raises(PublishError, match="1 message"):
        publisher.publish_raw(b"after", b"k")
    assert publisher.pending == 0
    publisher.close()
    assert publisher.published == 1
    assert len(consume(bootstrap_servers, topic, 1)) == 1


def test_context_manager_raises_what_failed(bootstrap_servers, make_topic):
    topic = make_topic("producers-ctx", config={"max.message.bytes": "10000"})
    with (
        pytest.raises(PublishError, match=topic),
        Publisher(bootstrap_servers=bootstrap_servers, topic=topic) as p,
    ):
        p.publish_raw(os.urandom(50_000), None)
    with pytest.raises(PublishError, match="closed"):
        p.publish_raw(b"late", None)


def test_record_too_large_for_the_topic_is_refused_before_sending(bootstrap_servers, make_topic):
    topic = make_topic("producers-large")
    record = next(SyntheticFleet(2).trajectories(1))
    record["response_tokens"] = pack_int32(range(600_000))
    record["response_logprobs"] = pack_float32([-1.0] * 600_000)
    with Publisher(bootstrap_servers=bootstrap_servers, topic=topic) as publisher:
        with pytest.raises(RecordTooLargeError) as caught:
            publisher.publish(record)
        assert publisher.pending == 0
    message = str(caught.value)
    size = len(publisher.codec.encode(record)) + len(record["group_id"])
    assert str(size) in message and str(4 * 1024 * 1024) in message and "rollouts.ultra" in message
    assert publisher.published == 0


def test_unreachable_broker_is_reported_not_waited_on_forever():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    publisher = Publisher(bootstrap_servers=f"127.0.0.1:{port}", topic="nowhere")
    publisher.publish(next(SyntheticFleet(3).trajectories(1)))
    with pytest.raises(PublishError, match="still queued") as caught:
        publisher.flush(1.0)
    assert caught.value.failed == 1 and "127.0.0.1" in str(caught.value)
    start = time.monotonic()
    with pytest.raises(PublishError):
        publisher.close(0.5)
    assert time.monotonic() - start < 10
    assert (publisher.published, publisher.failed, publisher.pending) == (0, 1, 0)
