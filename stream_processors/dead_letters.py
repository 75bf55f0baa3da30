"""Dead letters: messages the stage cannot turn into rows, kept with their reason and raw bytes.

Each letter goes to the dead-letter topic (value = the original bytes; headers: reason,
error_type, source_topic, source_partition, source_offset, and value_truncated when the value had
to be cut to fit the topic) and then to <lake>/dead_letters, which always holds the full bytes,
exactly once per source offset (its own txn versions).

The topic is at least once. A letter reaches it twice only when
  1. the worker stops without committing the letters to the table after the broker acknowledged
     them (a crash, SIGKILL, a table append that keeps failing): the replay sends them again; or
  2. a flush timed out while letters were in flight: the queue is purged and the retry sends them
     again, and the broker may have written the first copy all the same.
Nothing else duplicates: librdkafka's own retries are deduplicated by the idempotent producer,
letters the broker acknowledged are not sent again by a commit or stage retry in this process, and
a replay whose letters are already in the table sends nothing. Readers of the topic drop
duplicates by their source_* headers.

Letters of decided groups (`write_decided`: another attempt of a task, a sample of another attempt
in a group) are written when their group is decided, which may be after letters at higher offsets
of the partition: the table is asked which of them it already holds.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
from confluent_kafka import KafkaError, KafkaException, Message, Producer
from deltalake import DeltaTable, QueryBuilder
from deltalake.exceptions import DeltaError

from schemas.defaults import StreamDefaults, TopicDefaults
from schemas.tables import DEAD_LETTERS_SCHEMA
from stream_processors.exceptions import SinkError
from stream_processors.offsets import Coordinates, TxnTable

log = logging.getLogger(__name__)

MAX_REASON_CHARS = 2000
DLQ_MAX_MESSAGE_BYTES = 67_108_864
"""64 MiB: the dead-letter topic's max.message.bytes as infra/topics.toml declares it (a letter
carries a whole rollouts.ultra message). The DLQ producer's message.max.bytes is set to it."""
FALLBACK_MESSAGE_BYTES = 1_000_000
"""What a topic with Kafka's default limits accepts: a letter the broker rejects as too large is
sent again cut to this size."""
ENVELOPE_BYTES = 65_536
"""Room kept for the key, headers and record overhead when a value is cut to a size limit."""


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

    def fitted(self, max_message_bytes: int) -> tuple[bytes, list[tuple[str, str | bytes | None]]]:
        """The value and headers to send under a message size limit, cutting the value if needed."""
        headers = self.headers()
        room = max_message_bytes - ENVELOPE_BYTES - len(self.key or b"")
        room -= sum(len(k) + len(v or b"") for k, v in headers)
        if len(self.raw) <= room:
            return self.raw, headers
        kept = max(room, 0)
        note = f"first {kept} of {len(self.raw)} bytes; the full value is in the dead_letters table"
        return self.raw[:kept], [*headers, ("value_truncated", note.encode())]


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


def _quoted(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def letters_query(tp: tuple[str, int], floor: int, error_types: Sequence[str]) -> str:
    """SQL selecting offset and raw bytes of a partition's letters of `error_types` at offsets >= floor."""
    kinds = ", ".join(_quoted(kind) for kind in error_types)
    return (
        f'SELECT "offset", "raw" FROM letters WHERE "topic" = {_quoted(tp[0])} AND '
        f'"partition" = {int(tp[1])} AND "offset" >= {int(floor)} AND "error_type" IN ({kinds})'
    )


def held_query(candidates: Sequence[Coordinates]) -> str:
    """SQL selecting the coordinates of the dead_letters table (registered as `letters`) among `candidates`."""
    by_partition: dict[tuple[str, int], list[int]] = {}
    for c in candidates:
        by_partition.setdefault((c.topic, c.partition), []).append(c.offset)
    clauses = []
    for (topic, partition), offsets in sorted(by_partition.items()):
        listed = ", ".join(str(int(o)) for o in sorted(offsets))
        clauses.append(
            f'("topic" = {_quoted(topic)} AND "partition" = {int(partition)} AND "offset" IN ({listed}))'
        )
    return f'SELECT "topic", "partition", "offset" FROM letters WHERE {" OR ".join(clauses)}'


@dataclass(slots=True)
class _Deliveries:
    """Delivery reports of one send: rejected as too large, or failed otherwise."""

    too_large: list[Coordinates] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)


class DeadLetters:
    """Writes dead letters to a Kafka topic (when servers are given) and to a Delta table.

    Args:
        table_uri: the dead_letters table (created on the first write).
        bootstrap_servers: the broker for the dead-letter topic; None writes the table only.
        topic: the dead-letter topic.
        app_id: names the txn versions of the table; keep it stable across restarts.
        storage_options: passed through to deltalake.
        producer_config: extra librdkafka settings; message.max.bytes defaults to
            DLQ_MAX_MESSAGE_BYTES, and letters are cut to whatever it is set to.
        flush_timeout_s: how long to wait for the broker to acknowledge a batch of letters.
    """

    def __init__(
        self,
        table_uri: Path | str,
        *,
        bootstrap_servers: str | None = None,
        topic: str = TopicDefaults.dlq,
        app_id: str = StreamDefaults.app_id,
        storage_options: Mapping[str, str] | None = None,
        producer_config: Mapping[str, Any] | None = None,
        flush_timeout_s: float = 30.0,
    ) -> None:
        self.topic = topic
        self.flush_timeout_s = flush_timeout_s
        self.table = TxnTable(str(table_uri), app_id=app_id, storage_options=storage_options)
        self._producer: Producer | None = None
        self._closed = False
        self._acknowledged: set[Coordinates] = set()
        self.on_stored: Callable[[Sequence[DeadLetter]], None] = lambda _: None
        """Called with the letters each write stored (not those already stored): the worker's metrics."""
        config: dict[str, Any] = {
            "bootstrap.servers": bootstrap_servers,
            "enable.idempotence": True,
            "acks": "all",
            "compression.type": "zstd",
            "linger.ms": 5,
            "message.max.bytes": DLQ_MAX_MESSAGE_BYTES,
        }
        config.update(producer_config or {})
        self.max_message_bytes = int(config["message.max.bytes"])
        if bootstrap_servers is not None:
            self._producer = Producer(config)

    def stored_offset(self, topic: str, partition: int) -> int | None:
        """The highest source offset of (topic, partition) already in the table, or None."""
        return self.table.stored_offset(topic, partition)

    def write(self, letters: Sequence[DeadLetter]) -> int:
        """Send the letters not yet stored to the topic, then append them; returns how many."""
        return self._write(letters, decided=False)

    def write_decided(self, letters: Sequence[DeadLetter]) -> int:
        """Like `write`, for letters of decided groups, whose offsets may lie below letters already
        stored: those the table holds (a replay deciding them again) are skipped by a lookup."""
        return self._write(letters, decided=True)

    def _write(self, letters: Sequence[DeadLetter], *, decided: bool) -> int:
        if not letters:
            return 0
        if self._closed:
            raise SinkError(
                f"{len(letters)} dead letters arrived after DeadLetters.close(): a bug in the caller"
            )
        coordinates = [d.coordinates for d in letters]
        fresh: list[DeadLetter] = []

        def build(keep: list[int]) -> pa.Table:
            fresh[:] = [letters[i] for i in keep]
            self._produce([d for d in fresh if d.coordinates not in self._acknowledged])
            return dead_letters_table(fresh)

        if decided:
            written = self.table.append_missing(coordinates, build, self._held)
        else:
            written = self.table.append(coordinates, build)
        self._acknowledged.difference_update(coordinates)
        if written:
            self.on_stored(fresh)
        return written

    def stored_letters(
        self, tp: tuple[str, int], floor: int, error_types: Sequence[str]
    ) -> list[tuple[int, bytes]]:
        """(offset, raw bytes) of the partition's stored letters of `error_types` at offsets >= floor."""
        table = self.table.refresh()
        if table is None:
            return []
        columns = self._query(table, letters_query(tp, floor, error_types)).to_pydict()
        return [(int(o), bytes(r)) for o, r in zip(columns["offset"], columns["raw"], strict=True)]

    def _held(self, table: DeltaTable, candidates: list[Coordinates]) -> set[Coordinates]:
        """Which of `candidates` the table already holds (one query, through deltalake)."""
        columns = self._query(table, held_query(candidates)).to_pydict()
        return {
            Coordinates(str(t), int(p), int(o))
            for t, p, o in zip(columns["topic"], columns["partition"], columns["offset"], strict=True)
        }

    def _query(self, table: DeltaTable, sql: str) -> pa.Table:
        try:
            return pa.table(QueryBuilder().register("letters", table).execute(sql).read_all())
        except (DeltaError, OSError, ValueError) as exc:
            raise SinkError(
                f"reading stored dead letters in {self.table.uri} failed: {exc}; the table must be "
                "readable to resume and to write the letters of decided groups (check the lake's storage)"
            ) from exc

    def _produce(self, letters: Sequence[DeadLetter]) -> None:
        """Send letters and wait for the broker; a letter rejected as too large goes again, cut."""
        if self._producer is None or not letters:
            return
        limits = [self.max_message_bytes]
        if self.max_message_bytes > FALLBACK_MESSAGE_BYTES:
            limits.append(FALLBACK_MESSAGE_BYTES)
        pending = list(letters)
        for limit in limits:
            too_large = set(self._send(self._producer, pending, limit))
            pending = [d for d in pending if d.coordinates in too_large]
            if not pending:
                return
            log.warning(
                "dead-letter topic %r rejected %d letters as too large at %d bytes; sending them cut",
                self.topic, len(pending), limit,
            )  # fmt: skip
        raise SinkError(
            f"dead-letter topic {self.topic!r} rejected {len(pending)} letters even when cut to "
            f"{limits[-1]} bytes: set its max.message.bytes to {DLQ_MAX_MESSAGE_BYTES} as "
            "infra/topics.toml declares (`rollstream up` provisions it)"
        )

    def _send(self, producer: Producer, letters: Sequence[DeadLetter], limit: int) -> list[Coordinates]:
        """Produce and flush; returns the letters the broker rejected as too large."""
        reports = _Deliveries()
        try:
            for letter in letters:
                value, headers = letter.fitted(limit)
                on_delivery = functools.partial(self._on_delivery, letter.coordinates, reports)
                while True:
                    try:
                        producer.produce(
                            self.topic, value=value, key=letter.key, headers=headers, on_delivery=on_delivery
                        )
                        break
                    except BufferError:
                        producer.poll(0.1)
            remaining = producer.flush(self.flush_timeout_s)
        except KafkaException as exc:
            raise SinkError(
                f"dead-letter topic {self.topic!r}: the producer failed ({exc.args[0]}); check the "
                f"broker, and that the topic's max.message.bytes is {DLQ_MAX_MESSAGE_BYTES}"
            ) from exc
        if remaining:
            producer.purge(in_queue=True, in_flight=True)
            producer.poll(0)
        if remaining or reports.failures:
            raise SinkError(
                f"dead-letter topic {self.topic!r}: {remaining} letters undelivered after "
                f"{self.flush_timeout_s}s (purged; the retry sends them again), delivery errors: "
                f"{reports.failures[:3]}; check the broker and the topic"
            )
        return reports.too_large

    def _on_delivery(
        self, coordinates: Coordinates, reports: _Deliveries, err: KafkaError | None, msg: Message
    ) -> None:
        if err is None:
            self._acknowledged.add(coordinates)
        elif err.code() == KafkaError.MSG_SIZE_TOO_LARGE:
            reports.too_large.append(coordinates)
        elif err.code() not in (KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT):
            reports.failures.append(f"{coordinates}: {err}")

    def close(self) -> None:
        """Deliver anything still queued for the topic, then release the producer; idempotent."""
        self._closed = True
        if self._producer is None:
            return
        producer, self._producer = self._producer, None
        left = producer.flush(self.flush_timeout_s)
        if left:
            log.warning("dead-letter producer closed with %d letters undelivered", left)
        producer.close()
