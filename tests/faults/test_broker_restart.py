"""The broker SIGKILLed and started again in the middle of publishing: none lost, none doubled.

Injected: a private single-node broker (its own state dir and free ports) is SIGKILLed once a
third of PUBLISHED trajectories (12,000; 50,000 with ROLLSTREAM_SOAK=1) were acknowledged, stays
down for a few seconds, and is started again on the same data; the publisher keeps going
(idempotent, acks=all, its retries within message.timeout.ms). Counted, from the topic read back
from the beginning: every trajectory_id exactly once, and the publisher reports every message
acknowledged and none failed.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from stream_support import SOAK
from test_infra_lifecycle import private_settings

from infra import services
from producers.fleet import SyntheticFleet
from producers.publisher import Publisher
from schemas import TrajectoryCodec

pytestmark = pytest.mark.timeout(900)
PUBLISHED = 50_000 if SOAK else 12_000
TOPIC = "rollouts.raw"


def _read_ids(bootstrap: str, partitions: int) -> list[str]:
    codec = TrajectoryCodec()
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "restart-reader", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(TOPIC, p, OFFSET_BEGINNING) for p in range(partitions)])
    ends = {
        p: consumer.get_watermark_offsets(TopicPartition(TOPIC, p), timeout=30)[1] for p in range(partitions)
    }
    done = {p: ends[p] == 0 for p in range(partitions)}
    ids: list[str] = []
    deadline = time.monotonic() + 300
    try:
        while not all(done.values()) and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None or msg.error() is not None:
                continue
            ids.append(codec.decode(msg.value())["trajectory_id"])
            if msg.offset() >= ends[msg.partition()] - 1:
                done[msg.partition()] = True
    finally:
        consumer.close()
    assert all(done.values()), f"topic not read to its end: {ends}"
    return ids


@pytest.mark.slow(58)
def test_a_broker_killed_mid_publish_loses_and_doubles_nothing(tmp_path: Path) -> None:
    settings = private_settings(tmp_path / "state")
    services.up(settings, mlflow_server=False, progress=lambda _: None)
    try:
        bootstrap = f"127.0.0.1:{settings.kafka_port}"
        records = list(SyntheticFleet(seed=21, group_size=8).trajectories(PUBLISHED))
        failures: list[BaseException] = []
        publisher = Publisher(bootstrap_servers=bootstrap, topic=TOPIC, block_timeout_s=300)

        def publish_all() -> None:
            try:
                for record in records:
                    publisher.publish(record)
                publisher.flush()
            except BaseException as exc:  # reported below
                failures.append(exc)

        thread = threading.Thread(target=publish_all)
        thread.start()
        deadline = time.monotonic() + 300
        while publisher.published < PUBLISHED // 3 and time.monotonic() < deadline and thread.is_alive():
            time.sleep(0.05)
        pid = services.status(settings).pid
        assert pid is not None and publisher.published < PUBLISHED, "publishing ended before the kill"
        os.kill(pid, signal.SIGKILL)
        killed_at = publisher.published
        time.sleep(3)
        services.up(settings, mlflow_server=False, progress=lambda _: None)
        thread.join(timeout=600)
        assert not thread.is_alive()
        assert not failures, failures
        print(f"\nbroker SIGKILLed at {killed_at} of {PUBLISHED} acknowledged; restarted")
        publisher.close()
        assert publisher.published == PUBLISHED and publisher.failed == 0
        ids = _read_ids(bootstrap, partitions=4)
        assert len(ids) == PUBLISHED and len(set(ids)) == PUBLISHED
    finally:
        services.down(settings, progress=lambda _: None)
