"""A 3-node KRaft cluster on loopback: replicated topics, and one node SIGKILLed while publishing
and processing.

A `rollstream process` worker consumes while 20,000 trajectories are published; a node is
SIGKILLed a quarter of the way in. Counted by reading the topic back and from Delta: every
trajectory arrives exactly once and becomes exactly one row (idempotent acks=all producer;
replication 3 with min.insync.replicas 2 keeps accepting writes with one node gone; the worker's
fetches and offset commits move to the new leaders and coordinator).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import ConfigResource, ResourceType
from stack_support import free_port_block
from stream_support import start_worker, stop_worker, table_rows, wait_for

from infra import services
from infra.broker import broker_statuses
from infra.processes import is_alive
from infra.settings import Settings
from infra.topics import admin_client
from producers.fleet import SyntheticFleet, without_code
from schemas import TrajectoryCodec

pytestmark = pytest.mark.timeout(600)
TRAJECTORIES = 20_000


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Settings]:
    base = free_port_block(6)
    settings = Settings(
        state_dir=tmp_path / "stack",
        kafka_port=base,
        controller_port=base + 1,
        mlflow_port=base + 10,
        brokers=3,
        kafka_heap="384m",
    )
    try:
        services.up(settings)
        yield settings
    finally:
        services.down(settings)


@pytest.mark.slow(155)
def test_cluster_replicates_and_survives_a_killed_node(cluster: Settings, tmp_path: Path):
    nodes = broker_statuses(cluster)
    assert len(nodes) == 3 and all(n.running for n in nodes)
    admin = admin_client(cluster.bootstrap_servers)
    metadata = admin.list_topics(timeout=30)
    raw = metadata.topics[cluster.raw_topic]
    assert all(len(p.replicas) == 3 for p in raw.partitions.values())
    resource = ConfigResource(ResourceType.TOPIC, cluster.raw_topic)
    configs = admin.describe_configs([resource])[resource].result(timeout=30)
    assert configs["min.insync.replicas"].value == "2"

    codec = TrajectoryCodec()
    producer = Producer(
        {
            "bootstrap.servers": cluster.bootstrap_servers,
            "enable.idempotence": True,
            "acks": "all",
            "compression.type": "zstd",
            "linger.ms": 5,
        }
    )
    failures: list[str] = []
    delivered = 0

    def on_delivery(err, _msg) -> None:
        nonlocal delivered
        if err is not None:
            failures.append(str(err))
        else:
            delivered += 1

    lake, log = tmp_path / "lake", tmp_path / "worker" / "worker.log"
    log.parent.mkdir()
    worker = start_worker(
        cluster.bootstrap_servers, lake, cluster.raw_topic, cluster.dlq_topic, "cluster", "cluster", log
    )
    victim = nodes[1]
    sent_ids = set()
    fleet = SyntheticFleet(seed=11, group_size=8).trajectories(TRAJECTORIES)
    for i, record in enumerate(without_code(fleet)):
        if i == TRAJECTORIES // 4:
            assert victim.pid is not None
            os.kill(victim.pid, signal.SIGKILL)
        while True:
            try:
                producer.produce(
                    cluster.raw_topic,
                    codec.encode(record),
                    key=record["group_id"].encode(),
                    on_delivery=on_delivery,
                )
                break
            except BufferError:
                producer.poll(0.1)
        sent_ids.add(record["trajectory_id"])
        producer.poll(0)
    assert producer.flush(180) == 0
    assert failures == [] and delivered == TRAJECTORIES
    assert not is_alive(victim.pid)  # the node really was gone while most of the run was published

    consumer = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap_servers,
            "group.id": "cluster-count",
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(cluster.raw_topic, p, OFFSET_BEGINNING) for p in raw.partitions])
    seen: list[str] = []
    idle = 0
    while len(seen) < TRAJECTORIES and idle < 30:
        batch = consumer.consume(1000, timeout=1.0)
        idle = 0 if batch else idle + 1
        for message in batch:
            assert message.error() is None, message.error()
            seen.append(codec.decode(message.value())["trajectory_id"])
    consumer.close()
    assert len(seen) == TRAJECTORIES and set(seen) == sent_ids  # none lost, none doubled

    try:
        wait_for(lambda: table_rows(lake / "trajectories") >= TRAJECTORIES, 300, worker, log, "every row")
    finally:
        code = stop_worker(worker, log) if worker.poll() is None else worker.returncode
    assert code == 0, log.read_text()[-3000:]
    ids = pl.read_delta(str(lake / "trajectories"), columns=["trajectory_id"])["trajectory_id"]
    assert ids.len() == TRAJECTORIES and set(ids) == sent_ids  # in Delta too: none lost, none doubled

    services.down(cluster)
    assert not any(is_alive(n.pid) for n in nodes if n.pid is not None)
