"""What the stream benchmarks (process.py, scale.py) share: fleet messages, publishing, held-back
messages (a Kafka transaction released when the side is ready), counting rows.

Imported by the scripts beside it (`python bench/NAME.py` puts this folder first on `sys.path`).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable

import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Producer
from deltalake import DeltaTable

from producers import SyntheticFleet
from producers.fleet import without_code
from schemas import TrajectoryCodec

Messages = list[tuple[bytes, bytes]]


def fleet_messages(n: int, seed: int) -> list[tuple[bytes, bytes]]:
    """`n` encoded fleet trajectories keyed by group id, code tasks precomputed (the sandbox has its own bench)."""
    codec = TrajectoryCodec()
    records = without_code(SyntheticFleet(seed=seed).trajectories(n))
    return [(r["group_id"].encode(), codec.encode(r)) for r in records]


def bench_producer(servers: str) -> Producer:
    """An idempotent zstd producer sized for rollouts.raw's 4 MiB messages."""
    return Producer(
        {
            "bootstrap.servers": servers,
            "enable.idempotence": True,
            "acks": "all",
            "compression.type": "zstd",
            "linger.ms": 5,
            "message.max.bytes": 4 * 2**20,
        }
    )


def publish(servers: str, topic: str, messages: Iterable[tuple[bytes, bytes]]) -> None:
    """Publish every (key, value), waiting out a full queue; exits if any is left undelivered."""
    producer = bench_producer(servers)
    for key, value in messages:
        while True:
            try:
                producer.produce(topic, value=value, key=key)
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
    if producer.flush(120):
        raise SystemExit(f"could not publish to {topic}")


class Staged:
    """Messages held back on `topics[0]`: `warm` published and visible, `measured` in an open Kafka
    transaction, invisible to read_committed consumers (librdkafka's default) until `release`."""

    def __init__(self, servers: str, topics: tuple[str, ...], warm: Messages, measured: Messages) -> None:
        self.topics = topics
        publish(servers, self.topics[0], warm)
        self.producer = Producer(
            {
                "bootstrap.servers": servers,
                "transactional.id": f"bench-process-{uuid.uuid4().hex[:8]}",
                "transaction.timeout.ms": 600_000,
                "compression.type": "zstd",
                "linger.ms": 5,
                "message.max.bytes": 4 * 2**20,
            }
        )
        self.producer.init_transactions(60)
        self.producer.begin_transaction()
        for key, value in measured:
            while True:
                try:
                    self.producer.produce(self.topics[0], value=value, key=key)
                    break
                except BufferError:
                    self.producer.poll(0.1)
            self.producer.poll(0)
        if self.producer.flush(300):
            raise SystemExit("could not stage the measured messages")

    def release(self) -> float:
        """Commit the transaction: the measured messages become available; returns that moment."""
        self.producer.commit_transaction(120)
        return time.monotonic()


def delta_rows(uri: str) -> int:
    """Rows in the Delta table at `uri` from its add actions (0 before it exists)."""
    if not DeltaTable.is_deltatable(uri):
        return 0
    actions = pa.table(DeltaTable(uri).get_add_actions(flatten=True))
    return int(pc.sum(actions.column("num_records")).as_py() or 0) if actions.num_rows else 0
