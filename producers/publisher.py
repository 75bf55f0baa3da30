"""Publishing trajectories to Kafka: Avro-encoded, keyed by group, idempotent, never silently lost.

A thin layer over confluent_kafka.Producer (librdkafka). Delivery is asynchronous: a failed
delivery is collected by the delivery callback and raised as `PublishError` from the next
`publish`, `flush` or `close`, so a caller that ends with `flush()` (or a ``with`` block) learns
about every message that did not reach the broker.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from types import TracebackType
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from producers.exceptions import ProducerError, PublishError, RecordTooLargeError
from schemas import TrajectoryCodec

log = logging.getLogger(__name__)
client_log = logging.getLogger(f"{__name__}.librdkafka")

MIB = 1024 * 1024
ULTRA_TOPIC = "rollouts.ultra"
# Per-message limits of the default topics (infra/topics.toml, schemas/WIRE_FORMAT.md); a topic
# not named here gets the first; pass extra_config={"message.max.bytes": ...} for renamed ones.
DEFAULT_MESSAGE_LIMIT = 4 * MIB
TOPIC_MESSAGE_LIMITS: Mapping[str, int] = {
    "rollouts.raw": 4 * MIB,
    ULTRA_TOPIC: 64 * MIB,
    "rollouts.dlq": 64 * MIB,
}
# Room for the record batch and record framing around key and value.
FRAMING_BYTES = 512
POLL_INTERVAL_S = 0.05


def default_config(bootstrap_servers: str, topic: str) -> dict[str, str | int | bool]:
    """librdkafka settings the publisher starts from, before `extra_config` is applied.

    Batches of up to ~1 MB (below the broker's default per-topic limit, since librdkafka does
    not split a batch the broker refuses) wait up to 20 ms to fill; zstd suits token payloads.
    The murmur2 partitioner matches the Java and aiokafka clients, so a group_id maps to the
    same partition whichever client published it.
    """
    return {
        "bootstrap.servers": bootstrap_servers,
        "client.id": "rollstream-publisher",
        "enable.idempotence": True,
        "acks": "all",
        "compression.type": "zstd",
        "linger.ms": 20,
        "batch.size": 1_000_000,
        "batch.num.messages": 10_000,
        "queue.buffering.max.kbytes": 256 * 1024,
        "message.max.bytes": TOPIC_MESSAGE_LIMITS.get(topic, DEFAULT_MESSAGE_LIMIT),
        "message.timeout.ms": 120_000,
        "partitioner": "murmur2_random",
    }


class Publisher:
    """Publishes trajectories (or raw bytes) to one topic.

    Args:
        bootstrap_servers: the Kafka brokers, ``host:port[,host:port...]``.
        topic: where every message goes.
        codec: encodes records; default the shipped trajectory schema.
        extra_config: librdkafka options applied last, over `default_config` (e.g. a larger
            ``message.max.bytes`` for a bigger topic).

    Counters `published` (acknowledged by the broker) and `failed` grow as delivery reports
    arrive; they are served by `poll`, which `publish` calls for you. Not meant to be shared by
    several threads that publish at once.
    """

    def __init__(
        self,
        *,
        bootstrap_servers: str,
        topic: str,
        codec: TrajectoryCodec | None = None,
        extra_config: Mapping[str, str | int] | None = None,
    ) -> None:
        self.topic = topic
        self.codec = codec or TrajectoryCodec()
        config: dict[str, Any] = default_config(bootstrap_servers, topic)
        config.update(extra_config or {})
        config["error_cb"] = self._on_error
        config["logger"] = client_log
        self.max_message_bytes = int(config["message.max.bytes"])
        self._servers = str(config["bootstrap.servers"])
        self._lock = threading.Lock()
        self._published = 0
        self._failed = 0
        self._unreported = 0
        self._first_reason = ""
        self._last_client_error = ""
        self._warned: set[int] = set()
        self._closed = False
        try:
            self._producer = Producer(config)
        except KafkaException as exc:
            raise ProducerError(
                f"cannot create the Kafka producer for topic {topic!r}: {exc.args[0].str()}; check "
                "extra_config against librdkafka's CONFIGURATION.md"
            ) from exc

    @property
    def published(self) -> int:
        """Messages the broker has acknowledged so far."""
        return self._published

    @property
    def failed(self) -> int:
        """Messages whose delivery failed so far (each was or will be raised as PublishError)."""
        return self._failed

    @property
    def pending(self) -> int:
        """Messages handed to the client but not yet acknowledged or failed."""
        return len(self._producer)

    def publish(self, record: Mapping[str, Any]) -> None:
        """Encode one trajectory and queue it, keyed by its group_id.

        Raises:
            PublishError: earlier messages failed delivery (this record was not queued).
            RecordTooLargeError: the encoded record exceeds the topic's message limit.
            schemas.EncodeError: the record does not fit the schema.
        """
        value = self.codec.encode(record)
        key = str(record["group_id"]).encode()
        self._produce(value, key, what=f"trajectory {record.get('trajectory_id', '?')!r}")

    def publish_raw(self, value: bytes, key: bytes | None = None) -> None:
        """Queue bytes as they are, unencoded (bad input for dead-letter demos and tests)."""
        self._produce(value, key, what="raw message")

    def poll(self, timeout: float = 0.0) -> int:
        """Serve delivery reports for up to `timeout` seconds; returns how many were served."""
        return self._producer.poll(timeout)

    def flush(self, timeout: float = 60.0) -> None:
        """Wait until every queued message is acknowledged or failed.

        Raises:
            PublishError: some messages failed, or some are still undelivered after `timeout`
                seconds (those stay queued; flush again to keep waiting).
        """
        self._check_open()
        remaining = self._producer.flush(timeout)
        if remaining:
            hint = f"; last client error: {self._last_client_error}" if self._last_client_error else ""
            with self._lock:
                failed, reason = self._take_failures()
            reason = reason or f"still undelivered after {timeout:g} s{hint}"
            raise PublishError(
                f"{failed + remaining} message(s) to topic {self.topic!r} not delivered "
                f"({remaining} still queued after waiting {timeout:g} s, {failed} failed); first: "
                f"{reason}. Check that the broker at {self._servers} is up and reachable, then "
                "flush() again to keep waiting or re-send what failed",
                topic=self.topic,
                failed=failed + remaining,
                first_reason=reason,
            )
        self._raise_failures()

    def close(self, timeout: float = 60.0) -> None:
        """Flush, drop what is still undelivered after `timeout`, release the client.

        Raises:
            PublishError: like `flush`; the dropped messages are among those it counts.
        """
        if self._closed:
            return
        try:
            self.flush(timeout)
        finally:
            self._closed = True
            if len(self._producer):
                # Give up on what flush could not deliver (it was reported), or close would wait
                # for message.timeout.ms.
                self._producer.purge()
                self._producer.poll(0)
            self._producer.close()

    def __enter__(self) -> Publisher:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _produce(self, value: bytes, key: bytes | None, *, what: str) -> None:
        self._check_open()
        self._raise_failures()
        size = len(value) + len(key or b"")
        if size > self.max_message_bytes - FRAMING_BYTES:
            raise self._too_large(what, size)
        while True:
            try:
                self._producer.produce(self.topic, value, key, on_delivery=self._on_delivery)
                break
            except BufferError:
                # The local queue is full: wait for acknowledgements (or failures) to make room.
                self._producer.poll(POLL_INTERVAL_S)
                self._raise_failures()
            except KafkaException as exc:
                error: KafkaError = exc.args[0]
                if error.code() == KafkaError.MSG_SIZE_TOO_LARGE:
                    raise self._too_large(what, size) from exc
                raise PublishError(
                    f"cannot queue {what} for topic {self.topic!r}: {error.str()}",
                    topic=self.topic,
                    failed=1,
                    first_reason=error.str(),
                ) from exc
        self._producer.poll(0)

    def _too_large(self, what: str, size: int) -> RecordTooLargeError:
        if self.topic == ULTRA_TOPIC:
            fix = "split the trajectory, or raise the topic's max.message.bytes and message.max.bytes"
        else:
            fix = (
                f"publish ultra-long trajectories to {ULTRA_TOPIC!r} (limit "
                f"{TOPIC_MESSAGE_LIMITS[ULTRA_TOPIC] // MIB} MiB) with Publisher(topic={ULTRA_TOPIC!r})"
            )
        reason = (
            f"{what} is {size} bytes (key and value), over the {self.max_message_bytes}-byte message "
            f"limit of topic {self.topic!r} less {FRAMING_BYTES} bytes of framing"
        )
        return RecordTooLargeError(
            f"{reason}; it was not sent: {fix}", topic=self.topic, failed=1, first_reason=reason
        )

    def _on_delivery(self, err: KafkaError | None, msg: Message) -> None:
        with self._lock:
            if err is None:
                self._published += 1
                if self._warned:
                    self._warned.clear()
                return
            self._failed += 1
            self._unreported += 1
            if self._unreported == 1:
                self._first_reason = self._describe(err, msg)

    def _describe(self, err: KafkaError, msg: Message) -> str:
        reason = f"{err.name()}: {err.str()}"
        if err.code() == KafkaError.MSG_SIZE_TOO_LARGE:
            size = len(msg.value() or b"") + len(msg.key() or b"")
            reason += (
                f" (the broker refused the batch holding this {size}-byte message as over topic "
                f"{self.topic!r}'s max.message.bytes: every message of that batch failed; keep "
                f"batch.size below the topic's limit and send trajectories this long to {ULTRA_TOPIC!r})"
            )
        return reason

    def _on_error(self, err: KafkaError) -> None:
        self._last_client_error = f"{err.name()}: {err.str()}"
        if err.fatal():
            log.error("fatal Kafka client error, publisher for %r is unusable: %s", self.topic, err.str())
            return
        # Each kind of error is logged once until a delivery succeeds: the client retries forever.
        level = logging.DEBUG if err.code() in self._warned else logging.WARNING
        self._warned.add(err.code())
        log.log(level, "Kafka client error (the client retries) publishing to %r: %s", self.topic, err.str())

    def _take_failures(self) -> tuple[int, str]:
        failed, reason = self._unreported, self._first_reason
        self._unreported, self._first_reason = 0, ""
        return failed, reason

    def _raise_failures(self) -> None:
        if not self._unreported:
            return
        with self._lock:
            failed, reason = self._take_failures()
        if failed:
            raise PublishError(
                f"{failed} message(s) to topic {self.topic!r} failed delivery; first: {reason}. "
                "They are not in Kafka: fix the cause and re-send them",
                topic=self.topic,
                failed=failed,
                first_reason=reason,
            )

    def _check_open(self) -> None:
        if self._closed:
            raise PublishError(
                f"publisher for topic {self.topic!r} is closed: create a new Publisher",
                topic=self.topic,
                failed=0,
                first_reason="closed",
            )
