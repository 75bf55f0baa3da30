"""Dead letters: messages the stage cannot turn into rows, kept with their reason and raw bytes.

Each letter goes to the dead-letter topic (value = the original bytes; headers: reason,
error_type, source_topic, source_partition, source_offset) and then to <lake>/dead_letters, the
table exactly once per source offset (its own txn versions). The topic is at least once: a crash
between the produce and the Delta commit re-sends that batch's letters on replay; their source
headers identify duplicates.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
from confluent_kafka import KafkaError, Message, Producer

from schemas.tables import DEAD_LETTERS_SCHEMA
from stream_processors.exceptions import SinkError
from stream_processors.offsets import Coordinates, TxnTable

log = logging.getLogger(__name__)

MAX_REASON_CHARS = 2000


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One message that could not become a row, and why."""

    reason: str
    error_type: str
    raw: bytes
    key: bytes | None
    coordinates: Coordinates
    failed_at: datetime = field(default_factory=lambda: datetime.now(UTC))

    def headers(self) -> list[tuple[str, str | bytes | None]]:
        """Kafka headers carrying the reason and the source coordinates."""
        c = self.coordinates
        return [
            ("reason", self.reason[:MAX_REASON_CHARS].encode()),
            ("error_type", self.error_type.encode()),
            ("source_topic", c.topic.encode()),
            ("source_partition", str(c.partition).encode()),
            ("source_offset", str(c.offset).encode()),
        ]


def dead_letters_table(letters: Sequence[DeadLetter]) -> pa.Table:
    """Build the Arrow table of `letters`, in DEAD_LETTERS_SCHEMA's column order."""
    return pa.Table.from_pydict(
        {
            "reason": [d.reason[:MAX_REASON_CHARS] for d in letters],
            "error_type": [d.error_type for d in letters],
            "raw": [d.raw for d in letters],
            "key": [d.key for d in letters],
            "topic": [d.coordinates.topic for d in letters],
            "partition": [d.coordinates.partition for d in letters],
            "offset": [d.coordinates.offset for d in letters],
            "failed_at": [d.failed_at for d in letters],
        },
        schema=DEAD_LETTERS_SCHEMA,
    )


class DeadLetters:
    """Writes dead letters to a Kafka topic (when servers are given) and to a Delta table.

    Args:
        table_uri: the dead_letters table (created on the first write).
        bootstrap_servers: the broker for the dead-letter topic; None writes the table only.
        topic: the dead-letter topic.
        app_id: names the txn versions of the table; keep it stable across restarts.
        storage_options: passed through to deltalake.
        producer_config: extra librdkafka settings (e.g. message.max.bytes for big messages).
        flush_timeout_s: how long to wait for the broker to acknowledge a batch of letters.
    """

    def __init__(
        self,
        table_uri: Path | str,
        *,
        bootstrap_servers: str | None = None,
        topic: str = "rollouts.dlq",
        app_id: str = "rollstream-processor",
        storage_options: Mapping[str, str] | None = None,
        producer_config: Mapping[str, Any] | None = None,
        flush_timeout_s: float = 30.0,
    ) -> None:
        self.topic = topic
        self.flush_timeout_s = flush_timeout_s
        self.table = TxnTable(str(table_uri), app_id=app_id, storage_options=storage_options)
        self._producer: Producer | None = None
        if bootstrap_servers is not None:
            config: dict[str, Any] = {
                "bootstrap.servers": bootstrap_servers,
                "enable.idempotence": True,
                "acks": "all",
                "compression.type": "zstd",
                "linger.ms": 5,
            }
            config.update(producer_config or {})
            self._producer = Producer(config)

    def stored_offset(self, topic: str, partition: int) -> int | None:
        """The highest source offset of (topic, partition) already in the table, or None."""
        return self.table.stored_offset(topic, partition)

    def write(self, letters: Sequence[DeadLetter]) -> int:
        """Send the letters not yet stored to the topic, then append them; returns how many."""
        if not letters:
            return 0
        coordinates = [d.coordinates for d in letters]

        def build(keep: list[int]) -> pa.Table:
            fresh = [letters[i] for i in keep]
            self._produce(fresh)
            return dead_letters_table(fresh)

        return self.table.append(coordinates, build)

    def _produce(self, letters: Sequence[DeadLetter]) -> None:
        if self._producer is None:
            return
        failures: list[str] = []

        def on_delivery(err: KafkaError | None, msg: Message) -> None:
            if err is not None:
                failures.append(str(err))

        for letter in letters:
            while True:
                try:
                    self._producer.produce(
                        self.topic,
                        value=letter.raw,
                        key=letter.key,
                        headers=letter.headers(),
                        on_delivery=on_delivery,
                    )
                    break
                except BufferError:
                    self._producer.poll(0.1)
        remaining = self._producer.flush(self.flush_timeout_s)
        if remaining or failures:
            raise SinkError(
                f"dead-letter topic {self.topic!r}: {remaining} letters undelivered after "
                f"{self.flush_timeout_s}s, delivery errors: {failures[:3]}; check the broker and the topic"
            )

    def close(self) -> None:
        """Deliver anything still queued for the topic."""
        if self._producer is not None:
            self._producer.flush(self.flush_timeout_s)
