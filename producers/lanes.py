"""The two publishing lanes: latency-first and throughput-first librdkafka settings.

A lane is a producer configuration, so a publisher keeps one Kafka client per lane it uses.
Latency-first sends as soon as a message is queued (evaluation and interactive traffic);
throughput-first waits to fill large batches (bulk rollouts). docs/producers.md has the
measured trade-off.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

from schemas.defaults import TopicDefaults

MIB = 1024 * 1024
ULTRA_TOPIC = TopicDefaults.ultra
# Per-message limits of the default topics (infra/topics.toml); a topic not named here gets the
# default. Pass `message_limits=` to the publisher for topics declared under other names.
DEFAULT_MESSAGE_LIMIT = 4 * MIB
TOPIC_MESSAGE_LIMITS: Mapping[str, int] = {
    TopicDefaults.raw: 4 * MIB,
    ULTRA_TOPIC: 64 * MIB,
    TopicDefaults.dlq: 64 * MIB,
}
# Room for the record batch and record framing around key and value.
FRAMING_BYTES = 512


class Lane(enum.StrEnum):
    """Which producer settings a message travels with."""

    LATENCY = "latency"
    THROUGHPUT = "throughput"


# What differs between the lanes; everything else is `base_config`.
_LANE_SETTINGS: Mapping[Lane, Mapping[str, int]] = {
    # Send at once; a batch is whatever queued while the previous request was in flight.
    Lane.LATENCY: {"linger.ms": 0, "batch.size": 131_072, "batch.num.messages": 1_000},
    # Wait up to 25 ms to fill batches of ~1 MB (below every topic's limit: librdkafka fails a
    # whole batch the broker refuses, HAZARDS.md).
    Lane.THROUGHPUT: {"linger.ms": 25, "batch.size": 1_000_000, "batch.num.messages": 10_000},
}


def base_config(bootstrap_servers: str, *, message_max_bytes: int, buffer_bytes: int) -> dict[str, object]:
    """librdkafka settings shared by both lanes: idempotent, acks=all, zstd, murmur2 keys.

    The murmur2 partitioner matches the Java and aiokafka clients, so a group_id maps to the same
    partition whichever client published it. The client's own queue holds at least
    `buffer_bytes`, so the publisher's byte budget, not librdkafka's BufferError, applies
    backpressure.
    """
    return {
        "bootstrap.servers": bootstrap_servers,
        "client.id": "rollstream-publisher",
        "enable.idempotence": True,
        "acks": "all",
        "compression.type": "zstd",
        "queue.buffering.max.kbytes": min(2_097_151, max(65_536, 2 * buffer_bytes // 1024)),
        "queue.buffering.max.messages": 2_000_000,
        "message.max.bytes": message_max_bytes,
        "message.timeout.ms": 120_000,
        "partitioner": "murmur2_random",
    }


def lane_config(lane: Lane) -> dict[str, int]:
    """The settings that make `lane` what it is (linger, batch size)."""
    return dict(_LANE_SETTINGS[Lane(lane)])


def default_config(bootstrap_servers: str, topic: str, lane: Lane = Lane.THROUGHPUT) -> dict[str, object]:
    """The full librdkafka configuration of one lane's client for `topic`, before extra_config."""
    limit = TOPIC_MESSAGE_LIMITS.get(topic, DEFAULT_MESSAGE_LIMIT)
    return {
        **base_config(bootstrap_servers, message_max_bytes=limit, buffer_bytes=256 * MIB),
        **lane_config(lane),
    }
