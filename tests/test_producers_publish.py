"""The publishers against the real broker: results by id, keys and partitions, compression, failures."""

from __future__ import annotations

import gc
import json
import os
import socket
import threading
import time
import uuid
from collections import defaultdict
from concurrent.futures import FIRST_COMPLETED, Future, InvalidStateError, as_completed, wait

import numpy as np
import pytest
from confluent_kafka import Consumer
from confluent_kafka.admin import NewTopic

from producers import (
    DeliveryError,
    Lane,
    Publisher,
    PublishError,
    RecordTooLargeError,
    SyntheticFleet,
)
from producers.delivery import DeliveryFuture, DeliveryResult
from schemas import TrajectoryCodec, pack_float32, pack_int32

V2_DEFAULTS = {"task_id": None, "attempt": 0, "loss_mask": None, "version_spans": None, "logprob_mode": None}
"""The fields a fleet record leaves out, as a reader of the shipped schema fills them in."""
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
        else:
            end = time.monotonic() + 1.0  # anything beyond `count` would be a duplicate
            while time.monotonic() < end:
                msg = consumer.poll(0.2)
                if msg is not None and msg.error() is None:
                    messages.append(msg)
    finally:
        consumer.close()
    return messages


def test_fleet_records_round_trip_once_each_keyed_grouped_and_reported(bootstrap_servers, make_topic):
    topic = make_topic("producers-roundtrip", partitions=4)
    records = list(SyntheticFleet(11).trajectories(400))
    called: list = []
    with Publisher(bootstrap_servers=bootstrap_servers, topic=topic) as publisher:
        futures = [publisher.publish(r, on_delivery=called.append) for r in records]
    assert (publisher.published, publisher.failed, publisher.pending) == (400, 0, 0)
    results = [f.result(0) for f in futures]
    assert [r.message_id for r in results] == [r["trajectory_id"] for r in records]
    assert sorted(r.message_id for r in called) == sorted(r.message_id for r in results)
    assert all(r.ok and r.topic == topic and r.lane == Lane.THROUGHPUT for r in results)

    messages = consume(bootstrap_servers, topic, 400)
    assert len(messages) == 400
    codec = TrajectoryCodec()
    by_id = {r["trajectory_id"]: r for r in records}
    where = {r.message_id: (r.partition, r.offset) for r in results}
    partitions_of_group: dict[str, set[int]] = defaultdict(set)
    for msg in messages:
        decoded = codec.decode(msg.value())
        assert decoded == {**V2_DEFAULTS, **by_id[decoded["trajectory_id"]]}
        assert where[decoded["trajectory_id"]] == (msg.partition(), msg.offset())
        assert msg.key() == decoded["group_id"].encode("utf-8")
        partitions_of_group[decoded["group_id"]].add(msg.partition())
    assert all(len(parts) == 1 for parts in partitions_of_group.values())
    assert len({p for parts in partitions_of_group.values() for p in parts}) == 4
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


@pytest.mark.parametrize("lane", [Lane.LATENCY, Lane.THROUGHPUT])
def test_every_failed_message_is_reported_by_id(bootstrap_servers, make_topic, lane):
    """Messages over the topic's limit (which the broker, not the publisher, knows) fail by id."""
    topic = make_topic("producers-small", config={"max.message.bytes": "20000"})
    fleet, rng = SyntheticFleet(5), np.random.default_rng(5)
    records = []
    for i, record in enumerate(fleet.trajectories(120)):
        # Every tenth carries ~48 KB of incompressible tokens, over the topic's 20,000 bytes.
        n = 6_000 if i % 10 == 3 else 200
        record["response_tokens"] = pack_int32(rng.integers(0, 2**24, n))
        record["response_logprobs"] = pack_float32(-rng.random(n))
        record["response_text"] = ""
        records.append(record)
    big = {r["trajectory_id"] for r in records if len(r["response_tokens"]) > 20_000}
    reported: dict[str, str] = {}
    publisher = Publisher(bootstrap_servers=bootstrap_servers, topic=topic, lane=lane)
    futures = {}
    for record in records:
        futures[record["trajectory_id"]] = publisher.publish(
            record, on_delivery=lambda r: reported.__setitem__(r.message_id, "ok" if r.ok else r.error.code)
        )
    with pytest.raises(PublishError) as caught:
        publisher.flush(30)
    failed = {tid for tid, f in futures.items() if f.exception(0) is not None}
    delivered = set(futures) - failed
    assert big <= failed, "every over-limit message must fail"
    assert set(caught.value.message_ids) == failed and caught.value.failed == len(failed)
    assert "MSG_SIZE_TOO_LARGE" in caught.value.first_reason and topic in str(caught.value)
    for tid in failed:
        error = futures[tid].exception(0)
        assert isinstance(error, DeliveryError) and error.message_id == tid and tid in str(error)
        assert reported[tid] == "MSG_SIZE_TOO_LARGE"  # librdkafka fails the whole batch: maybe others too
    assert all(reported[tid] == "ok" for tid in delivered)
    assert (publisher.published, publisher.failed) == (len(delivered), len(failed))
    # Reported once: the publisher stays usable, and flush is clean afterwards.
    again = publisher.publish(records[0])
    publisher.close(30)
    assert again.result(0).ok
    codec = TrajectoryCodec()
    landed = [
        codec.decode(m.value())["trajectory_id"]
        for m in consume(bootstrap_servers, topic, len(delivered) + 1)
    ]
    assert sorted(landed) == sorted([*delivered, records[0]["trajectory_id"]])


def test_context_manager_raises_what_failed(bootstrap_servers, make_topic):
    topic = make_topic("producers-ctx", config={"max.message.bytes": "10000"})
    with (
        pytest.raises(PublishError, match="raw-1") as caught,
        Publisher(bootstrap_servers=bootstrap_servers, topic=topic) as p,
    ):
        p.publish_raw(os.urandom(50_000), None, message_id="raw-1")
    assert caught.value.message_ids == ("raw-1",)
    with pytest.raises(PublishError, match="closed"):
        p.publish_raw(b"late", None)


def test_record_too_large_is_refused_at_the_call_site_or_routed_to_ultra(bootstrap_servers, make_topic):
    topic = make_topic("producers-large", config={"max.message.bytes": str(4 * 2**20)})
    ultra = make_topic("producers-ultra", config={"max.message.bytes": str(64 * 2**20)})
    record = next(SyntheticFleet(2).trajectories(1))
    record["response_tokens"] = pack_int32(range(600_000))
    record["response_logprobs"] = pack_float32([-1.0] * 600_000)
    with Publisher(bootstrap_servers=bootstrap_servers, topic=topic) as publisher:
        with pytest.raises(RecordTooLargeError) as caught:
            publisher.publish(record)
        assert publisher.pending == 0
    message = str(caught.value)
    assert record["trajectory_id"] in message and str(4 * 1024 * 1024) in message and "ultra" in message
    assert caught.value.message_ids == (record["trajectory_id"],) and publisher.published == 0

    limits = {ultra: 64 * 2**20}
    with Publisher(
        bootstrap_servers=bootstrap_servers, topic=topic, ultra_topic=ultra, message_limits=limits
    ) as publisher:
        small = publisher.publish(next(SyntheticFleet(3).trajectories(1)))
        routed = publisher.publish(record).result(30)
    assert routed.topic == ultra and small.result(0).topic == topic
    (msg,) = consume(bootstrap_servers, ultra, 1)
    assert TrajectoryCodec().decode(msg.value()) == {**V2_DEFAULTS, **record}


def test_unreachable_broker_fails_each_message_by_id_on_close():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    publisher = Publisher(bootstrap_servers=f"127.0.0.1:{port}", topic="nowhere")
    records = list(SyntheticFleet(3).trajectories(3))
    futures = [publisher.publish(r) for r in records]
    with pytest.raises(PublishError, match="still in flight") as caught:
        publisher.flush(1.0)
    assert caught.value.failed == 3 and "127.0.0.1" in str(caught.value)
    start = time.monotonic()
    with pytest.raises(PublishError) as closed:
        publisher.close(0.5)
    assert time.monotonic() - start < 10
    ids = [r["trajectory_id"] for r in records]
    assert sorted(closed.value.message_ids) == sorted(ids)
    for future, tid in zip(futures, ids, strict=True):
        error = future.exception(0)
        assert (
            isinstance(error, DeliveryError) and error.message_id == tid and error.code.startswith("_PURGE")
        )
    assert (publisher.published, publisher.failed, publisher.pending) == (0, 3, 0)


def test_a_full_budget_blocks_then_raises_and_nothing_is_dropped(bootstrap_servers, admin):
    """The topic does not exist yet, so nothing is acknowledged and the budget fills."""
    topic = f"producers-later-{uuid.uuid4().hex[:10]}"
    records = list(SyntheticFleet(4).trajectories(6))
    codec = TrajectoryCodec()
    budget = sum(len(codec.encode(r)) + len(r["group_id"]) for r in records[:5])
    publisher = Publisher(
        bootstrap_servers=bootstrap_servers, topic=topic, max_in_flight_bytes=budget, block_timeout_s=1.5
    )
    futures: list[Future] = [publisher.publish(r, timeout=5) for r in records[:5]]
    start = time.monotonic()
    with pytest.raises(PublishError) as caught:
        publisher.publish(records[5])
    blocked = time.monotonic() - start
    assert 1.4 < blocked < 5, blocked
    error = caught.value
    assert type(error).__name__ == "BackpressureError" and error.message_ids == (records[5]["trajectory_id"],)
    assert records[5]["trajectory_id"] in str(error) and "5 messages" in str(error)
    assert publisher.pending == 5 and not any(f.done() for f in futures)

    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(timeout=30)
    try:
        publisher.flush(60)
        futures.append(publisher.publish(records[5]))  # re-sent after the error, as it says
        publisher.close(30)
        assert all(f.result(0).ok for f in futures)
        landed = consume(bootstrap_servers, topic, 6)
        assert sorted(codec.decode(m.value())["trajectory_id"] for m in landed) == sorted(
            r["trajectory_id"] for r in records
        )
    finally:
        admin.delete_topics([topic])[topic].result(timeout=30)


def test_lanes_per_publisher_and_per_message(bootstrap_servers, make_topic):
    topic = make_topic("producers-lanes", partitions=2)
    records = list(SyntheticFleet(6).trajectories(40))
    with Publisher(bootstrap_servers=bootstrap_servers, topic=topic, lane="latency") as publisher:
        futures = [
            publisher.publish(r, lane=Lane.THROUGHPUT if i % 2 else None) for i, r in enumerate(records)
        ]
    lanes = [f.result(0).lane for f in futures]
    assert lanes == [Lane.THROUGHPUT if i % 2 else Lane.LATENCY for i in range(40)]
    assert len(consume(bootstrap_servers, topic, 40)) == 40


def test_a_raising_client_callback_kills_neither_publishing_nor_results(bootstrap_servers, make_topic):
    topic = make_topic("producers-stats")

    def broken_stats(_text: str) -> None:
        raise KeyError("txbytes")

    extra = {"statistics.interval.ms": 10, "stats_cb": broken_stats}
    records = list(SyntheticFleet(8).trajectories(300))
    with Publisher(bootstrap_servers=bootstrap_servers, topic=topic, extra_config=extra) as publisher:
        futures = []
        for record in records:
            futures.append(publisher.publish(record))
            time.sleep(0.001)
    assert all(f.result(0).ok for f in futures) and publisher.published == 300


def test_a_delivery_future_behaves_as_a_future():
    """DeliveryFuture makes its condition only when something waits: every way of waiting still works."""
    made_on_use = {"_condition", "_waiters", "_done_callbacks"}
    new = DeliveryFuture()
    assert all(hasattr(new, name) for name in set(vars(Future())) - made_on_use), "Future.__init__ changed"
    assert vars(new) == {}, "a new DeliveryFuture holds its pending state in class defaults"
    assert made_on_use <= set(vars(Future())), "Future.__init__ changed"
    result = DeliveryResult("m", "t", 0, 1, Lane.THROUGHPUT, 0.0)
    assert result.ok and result.error is None and result.offset == 1
    with pytest.raises(AttributeError):
        result.offset = 2  # type: ignore[misc]  # results are immutable

    settled = DeliveryFuture()
    settled.set_result(result)
    assert (settled._made, settled._waiting, settled._callbacks) == (None, None, None)  # nobody waited
    assert settled.done() and settled.result(0) is result and settled.exception(0) is None
    with pytest.raises(InvalidStateError):
        settled.set_result(result)
    called: list = []
    settled.add_done_callback(called.append)
    assert called == [settled]

    failed = DeliveryFuture()
    failed.add_done_callback(called.append)
    failed.set_exception(DeliveryError("x", topic="t", message_id="m", code="_MSG_TIMED_OUT", reason="r"))
    assert called[-1] is failed and isinstance(failed.exception(0), DeliveryError)

    cancelled = DeliveryFuture()
    assert cancelled.cancel() and cancelled.cancelled()
    with pytest.raises(InvalidStateError):
        cancelled.set_result(result)

    pending = [DeliveryFuture() for _ in range(3)]
    with pytest.raises(TimeoutError):
        pending[0].result(0.01)
    threading.Timer(0.05, pending[1].set_result, (result,)).start()
    done, not_done = wait(pending, timeout=5, return_when=FIRST_COMPLETED)
    assert done == {pending[1]} and len(not_done) == 2
    threading.Timer(0.05, pending[2].set_result, (result,)).start()
    assert next(as_completed(pending[2:], timeout=5)) is pending[2]


def test_a_waiter_and_a_delivery_racing_on_a_new_future_never_miss_each_other():
    result = DeliveryResult("m", "t", 0, 1, Lane.THROUGHPUT, 0.0)
    for _ in range(2000):
        future = DeliveryFuture()
        start = threading.Barrier(2)

        def settle(f=future, go=start):
            go.wait()
            f.set_result(result)

        settler = threading.Thread(target=settle)
        settler.start()
        start.wait()
        assert future.result(5) is result
        settler.join()


def test_a_message_in_flight_keeps_few_objects_for_the_garbage_collector():
    """Each tracked object alive per in-flight message costs the caller's full collections CPU."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    records = list(SyntheticFleet(2).trajectories(2000))
    publisher = Publisher(bootstrap_servers=f"127.0.0.1:{port}", topic="nowhere")  # nothing is delivered
    try:
        gc.collect()
        before = len(gc.get_objects())
        futures = [publisher.publish(r) for r in records]
        per_message = (len(gc.get_objects()) - before - 1) / len(records)
        assert publisher.pending == len(records)
        # Per message in flight: one object, its future, which is also the report that settles it
        # and holds no copy of the outgoing message.
        assert per_message <= 1.5, per_message
    finally:
        with pytest.raises(PublishError):
            publisher.close(0.5)
    assert all(isinstance(f.exception(0), DeliveryError) for f in futures)
