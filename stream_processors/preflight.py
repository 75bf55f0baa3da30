"""Checks against the broker before the worker consumes: topics exist, and Delta is not ahead.

Metadata requests list every topic instead of naming ours, since naming a topic makes a broker
with auto.create.topics.enable create it with default settings.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from confluent_kafka import KafkaError, KafkaException, TopicCollection, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from stream_processors.exceptions import BrokerUnavailableError, StreamProcessorError


class OffsetStore(Protocol):
    """A table that records the highest source offset it holds per (topic, partition)."""

    def stored_offset(self, topic: str, partition: int) -> int | None:
        """The highest offset of (topic, partition) in the table, or None."""
        ...


KafkaClient = Mapping[str, Any] | None
"""librdkafka settings added to every client (``settings.kafka_client``: security, SASL, TLS)."""


RETRY_S = 0.2
"""The wait before asking again after a retriable broker error."""


LEADER_ERRORS = frozenset({KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE})
"""Errors of a partition whose leader the broker does not know yet (a topic created a moment ago)."""


def _retriable(exc: Exception) -> bool:
    """Whether a failed broker request may succeed when asked again: librdkafka flags it
    retriable, or it is one of LEADER_ERRORS (whatever the flag says)."""
    error = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
    return isinstance(error, KafkaError) and (error.retriable() or error.code() in LEADER_ERRORS)


def _reason(exc: Exception) -> str:
    """What a failed broker request said (a future's bare TimeoutError says nothing)."""
    return str(exc.args[0]) if exc.args else "timed out"


def admin(bootstrap_servers: str, kafka_client: KafkaClient = None) -> AdminClient:
    """An AdminClient for `bootstrap_servers` with the `kafka_client` passthrough."""
    return AdminClient({**(kafka_client or {}), "bootstrap.servers": bootstrap_servers})


def topic_partitions(
    bootstrap_servers: str,
    topics: Iterable[str],
    *,
    timeout_s: float = 15.0,
    kafka_client: KafkaClient = None,
) -> dict[str, int]:
    """How many partitions each topic has; raises StreamProcessorError naming any that is missing."""
    client = admin(bootstrap_servers, kafka_client)  # a bad setting raises here, not as unavailable
    try:
        metadata = client.list_topics(timeout=timeout_s)
    except KafkaException as exc:
        raise BrokerUnavailableError(
            f"no metadata from {bootstrap_servers} within {timeout_s:g} s: {_reason(exc)}; check the brokers"
        ) from exc
    out: dict[str, int] = {}
    for topic in topics:
        found = metadata.topics.get(topic)
        if found is None or found.error is not None or not found.partitions:
            reason = found.error if found is not None else "not in metadata"
            raise StreamProcessorError(
                f"topic {topic!r} is not available on {bootstrap_servers} ({reason}): provision the "
                "topics first (`rollstream up`), or pass raw_partitions to skip this lookup "
                "(and ultra_topic=None if there is no ultra topic)"
            )
        out[topic] = len(found.partitions)
    return out


def topic_partition_count(
    bootstrap_servers: str, topic: str, *, timeout_s: float = 15.0, kafka_client: KafkaClient = None
) -> int:
    """How many partitions `topic` has, from broker metadata; raises if the topic does not exist."""
    return topic_partitions(bootstrap_servers, [topic], timeout_s=timeout_s, kafka_client=kafka_client)[topic]


def high_watermarks(
    bootstrap_servers: str,
    topics: Iterable[str],
    *,
    timeout_s: float = 15.0,
    kafka_client: KafkaClient = None,
) -> dict[tuple[str, int], int]:
    """The offset the next message of each partition of `topics` will get.

    A retriable error (a topic created a moment ago whose leader the broker does not know yet:
    NOT_LEADER_FOR_PARTITION, LEADER_NOT_AVAILABLE) is asked again every RETRY_S within `timeout_s`.
    """
    counts = topic_partitions(bootstrap_servers, topics, timeout_s=timeout_s, kafka_client=kafka_client)
    request = {TopicPartition(t, p): OffsetSpec.latest() for t, n in counts.items() for p in range(n)}
    client = admin(bootstrap_servers, kafka_client)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            futures = client.list_offsets(request, request_timeout=timeout_s)
            return {(tp.topic, tp.partition): f.result(timeout=timeout_s).offset for tp, f in futures.items()}
        except (KafkaException, TimeoutError) as exc:
            if _retriable(exc) and time.monotonic() + RETRY_S < deadline:
                time.sleep(RETRY_S)
                continue
            raise BrokerUnavailableError(
                f"could not read the end offsets of {sorted(counts)} from {bootstrap_servers}: "
                f"{_reason(exc)}; check the broker"
            ) from exc


def topic_ids(
    bootstrap_servers: str,
    topics: Iterable[str],
    *,
    timeout_s: float = 15.0,
    kafka_client: KafkaClient = None,
) -> dict[str, str]:
    """Kafka's id (a UUID, new with every creation) of each topic."""
    names = list(topics)
    client = admin(bootstrap_servers, kafka_client)
    try:
        futures = client.describe_topics(TopicCollection(names), request_timeout=timeout_s)
        return {name: str(f.result(timeout=timeout_s).topic_id) for name, f in futures.items()}
    except (KafkaException, TimeoutError) as exc:
        raise BrokerUnavailableError(
            f"could not describe the topics {names} on {bootstrap_servers}: {_reason(exc)}; check the broker"
        ) from exc


def check_stored_offsets(
    bootstrap_servers: str,
    topics: Sequence[str],
    stores: Iterable[tuple[str, OffsetStore]],
    *,
    kafka_client: KafkaClient = None,
) -> None:
    """Refuse to start when a table holds an offset the topic has not reached.

    That happens when a topic was deleted and created again while the lake was kept: every new
    message would have an offset at or below the stored one and be dropped as a replay.

    Args:
        bootstrap_servers: Kafka "host:port[,host:port]".
        topics: the topics the worker consumes.
        stores: (table name, table) pairs whose stored offsets are compared.
        kafka_client: librdkafka settings added to the admin client (security).
    """
    ends = high_watermarks(bootstrap_servers, topics, kafka_client=kafka_client)
    for name, store in stores:
        for (topic, partition), end in sorted(ends.items()):
            stored = store.stored_offset(topic, partition)
            if stored is not None and stored >= end:
                raise StreamProcessorError(
                    f"the {name} table stored offset {stored} for {topic}[{partition}], but that "
                    f"partition ends at offset {end} (next offset to be written): the topic was "
                    "recreated or truncated since this lake was written, and every new message "
                    "would be dropped as already written. Point the worker at a new lake "
                    "directory; or, to append to these tables, use a new app_id (its offsets start "
                    "afresh; the old rows keep coordinates that new messages will repeat)"
                )
