"""publish_many (Publisher's and AsyncPublisher's) against the real broker: one future per batch,
every message still acknowledged or named when it fails, nothing sent from a batch with an
invalid record."""

from __future__ import annotations

import asyncio
import gc
import socket
import uuid
from collections import defaultdict

import numpy as np
import pytest
from confluent_kafka.admin import NewTopic
from test_producers_publish import consume

from producers import (
    AsyncPublisher,
    BackpressureError,
    InvalidTrajectoryError,
    Lane,
    Publisher,
    PublishError,
    RecordTooLargeError,
    SyntheticFleet,
)
from producers.delivery import BatchResult
from schemas import TrajectoryCodec, pack_float32, pack_int32

pytestmark = pytest.mark.timeout(120)


def groups_of(records: list[dict]) -> list[list[dict]]:
    """The records cut at each change of group_id (a fleet yields a group's samples together)."""
    out: list[list[dict]] = []
    for record in records:
        if out and out[-1][0]["group_id"] == record["group_id"]:
            out[-1].append(record)
        else:
            out.append([record])
    return out


def unused_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_batch_lands_once_each_keyed_and_partitioned_as_single_publishes(bootstrap_servers, make_topic):
    many_topic = make_topic("producers-many", partitions=4)
    single_topic = make_topic("producers-single", partitions=4)
    records = list(SyntheticFleet(12).trajectories(400))
    groups = groups_of(records)
    with Publisher(bootstrap_servers=bootstrap_servers, topic=many_topic) as publisher:
        batches = [publisher.publish_many(group) for group in groups]
    assert (publisher.published, publisher.failed, publisher.pending) == (400, 0, 0)
    for batch, group in zip(batches, groups, strict=True):
        result = batch.result(0)
        assert isinstance(result, BatchResult)
        assert (result.topic, result.lane, result.delivered) == (many_topic, Lane.THROUGHPUT, len(group))
        assert result.latency_s > 0
    with Publisher(bootstrap_servers=bootstrap_servers, topic=single_topic) as single:
        singles = {r["trajectory_id"]: single.publish(r) for r in records}

    codec = TrajectoryCodec()
    by_id = {r["trajectory_id"]: r for r in records}
    messages = consume(bootstrap_servers, many_topic, 400)
    assert len(messages) == 400
    order: dict[str, list[int]] = defaultdict(list)
    for msg in messages:
        decoded = codec.decode(msg.value())
        tid = decoded["trajectory_id"]
        assert {k: decoded[k] for k in by_id[tid]} == by_id[tid]
        assert msg.key() == decoded["group_id"].encode()
        assert msg.partition() == singles[tid].result(0).partition  # the same partitioner, murmur2
        order[decoded["group_id"]].append(decoded["sample_index"])
    assert sorted(order) == sorted({r["group_id"] for r in records})
    assert all(indexes == sorted(indexes) for indexes in order.values())


def test_each_failed_message_of_a_batch_is_named(bootstrap_servers, make_topic):
    """Messages over the topic's limit (the broker's, not the publisher's) fail, named by id in
    their batch's future and in what flush raises; the rest land."""
    topic = make_topic("producers-many-small", config={"max.message.bytes": "20000"})
    rng = np.random.default_rng(6)
    records = []
    for i, record in enumerate(SyntheticFleet(6).trajectories(120)):
        n = 6_000 if i % 10 == 3 else 200  # ~48 KB of incompressible tokens every tenth
        record["response_tokens"] = pack_int32(rng.integers(0, 2**24, n))
        record["response_logprobs"] = pack_float32(-rng.random(n))
        record["response_text"] = ""
        records.append(record)
    big = {r["trajectory_id"] for r in records if len(r["response_tokens"]) > 20_000}
    publisher = Publisher(bootstrap_servers=bootstrap_servers, topic=topic)
    chunks = [records[i : i + 10] for i in range(0, len(records), 10)]
    batches = [publisher.publish_many(chunk) for chunk in chunks]
    with pytest.raises(PublishError) as caught:
        publisher.flush(30)
    failed = set(caught.value.message_ids)
    assert big <= failed and caught.value.failed == len(failed)
    assert "MSG_SIZE_TOO_LARGE" in caught.value.first_reason
    for batch, chunk in zip(batches, chunks, strict=True):
        ids = {r["trajectory_id"] for r in chunk}
        error = batch.exception(0)
        if ids & failed:
            assert isinstance(error, PublishError) and set(error.message_ids) == ids & failed
            assert all(tid in str(error) for tid in error.message_ids[:5])
        else:
            assert error is None and batch.result(0).delivered == len(chunk)
    assert (publisher.published, publisher.failed) == (120 - len(failed), len(failed))
    publisher.close(30)
    codec = TrajectoryCodec()
    landed = [
        codec.decode(m.value())["trajectory_id"] for m in consume(bootstrap_servers, topic, 120 - len(failed))
    ]
    assert sorted(landed) == sorted({r["trajectory_id"] for r in records} - failed)


def test_an_invalid_or_too_large_record_sends_nothing_of_its_batch(bootstrap_servers, make_topic):
    topic = make_topic("producers-many-invalid")
    records = list(SyntheticFleet(7).trajectories(8))
    broken = dict(records[5], response_tokens=b"", response_logprobs=b"")
    huge = dict(records[6], response_tokens=pack_int32(range(1_200_000)))
    huge["response_logprobs"] = pack_float32([-1.0] * 1_200_000)
    with Publisher(bootstrap_servers=bootstrap_servers, topic=topic) as publisher:
        with pytest.raises(InvalidTrajectoryError) as invalid:
            publisher.publish_many([*records[:5], broken, *records[6:]])
        with pytest.raises(RecordTooLargeError) as large:
            publisher.publish_many([*records[:6], huge, records[7]])
        assert publisher.pending == 0
        assert publisher.publish_many([]).result(0).delivered == 0
        assert publisher.publish_many(records).result(30).delivered == 8
    assert invalid.value.trajectory_id == records[5]["trajectory_id"]
    assert large.value.message_ids == (records[6]["trajectory_id"],)
    assert publisher.published == 8
    assert len(consume(bootstrap_servers, topic, 8)) == 8


def test_a_full_budget_names_the_unsent_rest_of_a_batch(bootstrap_servers, admin):
    """The topic does not exist yet, so nothing is acknowledged and the budget fills mid-batch."""
    topic = f"producers-many-later-{uuid.uuid4().hex[:10]}"
    records = list(SyntheticFleet(8).trajectories(8))
    codec = TrajectoryCodec()
    budget = sum(len(codec.encode(r)) + len(r["group_id"]) for r in records[:5])
    publisher = Publisher(
        bootstrap_servers=bootstrap_servers, topic=topic, max_in_flight_bytes=budget, block_timeout_s=1.0
    )
    with pytest.raises(BackpressureError) as caught:
        publisher.publish_many(records)
    assert caught.value.message_ids == tuple(r["trajectory_id"] for r in records[5:])
    assert "the 5 before it were queued" in str(caught.value)
    assert publisher.pending == 5

    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(timeout=30)
    try:
        publisher.flush(60)
        assert publisher.published == 5
        rest = publisher.publish_many(records[5:])  # re-sent after the error, as it says
        publisher.close(30)
        assert rest.result(0).delivered == 3
        landed = consume(bootstrap_servers, topic, 8)
        assert sorted(codec.decode(m.value())["trajectory_id"] for m in landed) == sorted(
            r["trajectory_id"] for r in records
        )
    finally:
        admin.delete_topics([topic])[topic].result(timeout=30)


def test_an_unreachable_broker_fails_each_message_of_a_batch_by_id_on_close():
    publisher = Publisher(bootstrap_servers=f"127.0.0.1:{unused_port()}", topic="nowhere")
    records = list(SyntheticFleet(9).trajectories(12))
    batches = [publisher.publish_many(records[:7]), publisher.publish_many(records[7:])]
    with pytest.raises(PublishError) as closed:
        publisher.close(0.5)
    ids = [r["trajectory_id"] for r in records]
    assert sorted(closed.value.message_ids) == sorted(ids)
    first, second = (batch.exception(0) for batch in batches)
    assert isinstance(first, PublishError) and sorted(first.message_ids) == sorted(ids[:7])
    assert isinstance(second, PublishError) and sorted(second.message_ids) == sorted(ids[7:])
    assert "_PURGE" in first.first_reason
    assert (publisher.published, publisher.failed, publisher.pending) == (0, 12, 0)


def test_a_batch_in_flight_keeps_one_object_for_the_garbage_collector():
    records = list(SyntheticFleet(2).trajectories(2000))
    publisher = Publisher(bootstrap_servers=f"127.0.0.1:{unused_port()}", topic="nowhere")
    try:
        gc.collect()
        before = len(gc.get_objects())
        batches = [publisher.publish_many(records[i : i + 8]) for i in range(0, len(records), 8)]
        per_message = (len(gc.get_objects()) - before - 1) / len(records)
        assert publisher.pending == len(records)
        assert per_message <= 0.25, per_message  # one per batch of 8, its future and report
    finally:
        with pytest.raises(PublishError):
            publisher.close(0.5)
    assert all(isinstance(b.exception(0), PublishError) for b in batches)


def test_a_batch_waits_for_room_in_librdkafkas_own_queue(bootstrap_servers, make_topic):
    """librdkafka's queue holds 4 messages here: a batch of 40 queues in turns, none lost."""
    topic = make_topic("producers-many-queue")
    records = list(SyntheticFleet(10).trajectories(40))
    config = {"queue.buffering.max.messages": 4}
    with Publisher(bootstrap_servers=bootstrap_servers, topic=topic, extra_config=config) as publisher:
        batch = publisher.publish_many(records)
    assert batch.result(0).delivered == 40 and publisher.published == 40
    assert len(consume(bootstrap_servers, topic, 40)) == 40


def test_a_batch_travels_in_the_lane_asked_for(bootstrap_servers, make_topic):
    topic = make_topic("producers-many-lane")
    records = list(SyntheticFleet(11).trajectories(16))
    with Publisher(bootstrap_servers=bootstrap_servers, topic=topic) as publisher:
        latency = publisher.publish_many(records[:8], lane=Lane.LATENCY).result(30)
        default = publisher.publish_many(records[8:]).result(30)
    assert (latency.lane, latency.delivered) == (Lane.LATENCY, 8)
    assert (default.lane, default.delivered) == (Lane.THROUGHPUT, 8)
    assert len(consume(bootstrap_servers, topic, 16)) == 16


def test_the_async_publisher_publishes_batches_and_names_the_unsent_rest(
    bootstrap_servers, make_topic, admin
):
    topic = make_topic("producers-many-async", partitions=4)
    records = list(SyntheticFleet(13).trajectories(64))
    broken = dict(records[0], sample_index=99)

    async def publish_all() -> list[BatchResult]:
        async with AsyncPublisher(bootstrap_servers=bootstrap_servers, topic=topic) as publisher:
            with pytest.raises(InvalidTrajectoryError):
                await publisher.publish_many([broken, *records[1:8]])
            assert publisher.pending == 0
            futures = [await publisher.publish_many(group) for group in groups_of(records)]
            return list(await asyncio.gather(*futures))

    results = asyncio.run(publish_all())
    assert sum(r.delivered for r in results) == 64
    codec = TrajectoryCodec()
    landed = [codec.decode(m.value())["trajectory_id"] for m in consume(bootstrap_servers, topic, 64)]
    assert sorted(landed) == sorted(r["trajectory_id"] for r in records)

    later = f"producers-many-async-later-{uuid.uuid4().hex[:10]}"  # does not exist yet: no acks
    budget = sum(len(codec.encode(r)) + len(r["group_id"]) for r in records[:5])

    async def overflow() -> AsyncPublisher:
        publisher = AsyncPublisher(
            bootstrap_servers=bootstrap_servers, topic=later, max_in_flight_bytes=budget, block_timeout_s=1.0
        )
        with pytest.raises(BackpressureError) as caught:
            await publisher.publish_many(records[:8])
        assert caught.value.message_ids == tuple(r["trajectory_id"] for r in records[5:8])
        assert publisher.pending == 5
        return publisher

    publisher = asyncio.run(overflow())
    admin.create_topics([NewTopic(later, 1, 1)])[later].result(timeout=30)
    try:
        publisher.core.close(30)
        assert publisher.published == 5
    finally:
        admin.delete_topics([later])[later].result(timeout=30)
