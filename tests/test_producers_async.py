"""The asyncio publisher on the real broker: it shares the loop, awaits budget, reports by id."""

from __future__ import annotations

import asyncio
import os
import threading
import time
import uuid

import numpy as np
import pytest
from confluent_kafka.admin import NewTopic
from test_producers_publish import consume

from producers import AsyncPublisher, BackpressureError, DeliveryError, PublishError, SyntheticFleet
from schemas import TrajectoryCodec, pack_float32, pack_int32

pytestmark = pytest.mark.timeout(180)
PROBE_INTERVAL_S = 0.005
# About 3,000 trajectories (25 MB) a second: a busy rollout worker, not the whole machine's
# capacity (a probe in another process saw stalls over 50 ms here while a third process published
# flat out: on 2 shared cores that is the scheduler, not the event loop).
BURST = 32
BURST_INTERVAL_S = 0.01


def runqueue_wait_s() -> float:
    """Seconds this thread has spent runnable but waiting for a CPU (Linux schedstat)."""
    with open(f"/proc/self/task/{threading.get_native_id()}/schedstat") as stat:
        return int(stat.read().split()[1]) / 1e9


async def lag_probe(stop: asyncio.Event, lags: list[float], raw: list[float] | None = None) -> None:
    """How late each short sleep wakes up, less the time the OS kept the loop's thread off a CPU.

    On 2 cores shared with a broker and other test runs, the scheduler alone stalls a thread for
    tens of milliseconds (measured here with the probe in a separate process while another
    published). That runqueue wait is the machine's, not the loop's; blocking calls, lock and
    GIL waits are sleeps, not runqueue time, so they still count.
    """
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        before, waited = loop.time(), runqueue_wait_s()
        await asyncio.sleep(PROBE_INTERVAL_S)
        lag = loop.time() - before - PROBE_INTERVAL_S
        lags.append(lag - (runqueue_wait_s() - waited))
        if raw is not None:
            raw.append(lag)


def test_publishing_leaves_the_event_loop_responsive(bootstrap_servers, make_topic):
    topic = make_topic("producers-async", partitions=4, config={"max.message.bytes": str(4 * 2**20)})
    ultra = make_topic("producers-async-ultra", config={"max.message.bytes": str(64 * 2**20)})
    records = list(SyntheticFleet(21).trajectories(4000))
    rng = np.random.default_rng(21)
    for record in records[1000::1000]:  # three of ~4.8 MB, encoded off the loop and routed to ultra
        record["response_tokens"] = pack_int32(rng.integers(0, 32_000, 600_000))
        record["response_logprobs"] = pack_float32(-rng.random(600_000))

    raw: list[float] = []

    async def main() -> tuple[list[float], list, float]:
        lags: list[float] = []
        stop = asyncio.Event()
        probe = asyncio.create_task(lag_probe(stop, lags, raw))
        start = time.monotonic()
        async with AsyncPublisher(
            bootstrap_servers=bootstrap_servers,
            topic=topic,
            ultra_topic=ultra,
            message_limits={ultra: 64 * 2**20},
            max_in_flight_bytes=16 * 2**20,  # small, so publishing also awaits the budget
        ) as publisher:
            futures = []
            for start_index in range(0, len(records), BURST):
                # A rollout worker's batch of finished samples, then the next batch's generation.
                futures += [await publisher.publish(r) for r in records[start_index : start_index + BURST]]
                await asyncio.sleep(BURST_INTERVAL_S)
            results = [await f for f in futures]  # gather() over 4,000 futures alone takes ~20 ms
        elapsed = time.monotonic() - start
        stop.set()
        await probe
        return lags, results, elapsed

    lags, results, elapsed = asyncio.run(main())
    assert [r.message_id for r in results] == [r["trajectory_id"] for r in records]
    assert sum(r.topic == ultra for r in results) == 3
    worst = max(lags)
    print(
        f"lag probe, {len(lags)} samples over {elapsed:.1f} s: max {worst * 1000:.1f} ms, p99 "
        f"{np.percentile(lags, 99) * 1000:.1f} ms; raw (scheduler included) max {max(raw) * 1000:.1f} ms, "
        f"p99 {np.percentile(raw, 99) * 1000:.1f} ms"
    )
    assert len(lags) > elapsed / (PROBE_INTERVAL_S + 0.05), (
        f"the probe ran only {len(lags)} times in {elapsed:.1f} s"
    )
    # The p99, not the max: on a shared 2-core machine one stall of the whole process (seen: 817 ms
    # once, with p99 9.7 ms, while a demo ran beside the suite) says nothing about the publisher.
    p99 = float(np.percentile(lags, 99))
    assert p99 < 0.050, f"event loop lag p99 {p99 * 1000:.1f} ms (max {worst * 1000:.1f} ms)"
    landed = consume(bootstrap_servers, topic, len(records) - 3)
    assert len(landed) == len(records) - 3


def test_async_budget_awaits_then_raises_and_failures_come_by_id(bootstrap_servers, admin):
    topic = f"producers-async-later-{uuid.uuid4().hex[:10]}"
    records = list(SyntheticFleet(22).trajectories(4))
    codec = TrajectoryCodec()
    budget = sum(len(codec.encode(r)) + len(r["group_id"]) for r in records[:3])

    async def main() -> None:
        lags: list[float] = []
        stop = asyncio.Event()
        probe = asyncio.create_task(lag_probe(stop, lags))
        publisher = AsyncPublisher(
            bootstrap_servers=bootstrap_servers, topic=topic, max_in_flight_bytes=budget, block_timeout_s=1.0
        )
        futures = [await publisher.publish(r) for r in records[:3]]
        start = time.monotonic()
        with pytest.raises(BackpressureError) as caught:
            await publisher.publish(records[3])
        assert 0.9 < time.monotonic() - start < 5
        assert caught.value.message_ids == (records[3]["trajectory_id"],)
        assert len(lags) > 50 and max(lags) < 0.05  # the loop ran while the publish awaited
        admin.create_topics([NewTopic(topic, 1, 1, config={"max.message.bytes": "1000000"})])[topic].result(
            timeout=30
        )
        results = await asyncio.gather(*futures)
        assert [r.message_id for r in results] == [r["trajectory_id"] for r in records[:3]]
        assert (await publisher.send(records[3])).ok  # re-sent; nothing dropped
        # A message the broker refuses fails its own future, by id, and flush names it.
        big = await publisher.publish_raw(os.urandom(2_000_000), b"k", message_id="too-big")
        with pytest.raises(DeliveryError, match="too-big"):
            await big
        with pytest.raises(PublishError) as flushed:
            await publisher.flush(30)
        assert flushed.value.message_ids == ("too-big",)
        await publisher.close()
        stop.set()
        await probe

    try:
        asyncio.run(main())
        landed = consume(bootstrap_servers, topic, 4)
        assert sorted(codec.decode(m.value())["trajectory_id"] for m in landed) == sorted(
            r["trajectory_id"] for r in records
        )
    finally:
        admin.delete_topics([topic])[topic].result(timeout=30)
