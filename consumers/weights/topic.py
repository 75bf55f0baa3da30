"""Announcements on the compacted policy-versions topic, for readers that listen instead of polling.

An announcement follows the Delta commit that published the version; no write spans both
systems, so a reader checks the sha256 of what it loads (`load_weights` does).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Producer, TopicPartition

from consumers.exceptions import AnnounceError
from consumers.weights.store import latest_version
from schemas.exceptions import DecodeError
from schemas.policy_version import POLICY_VERSIONS_TOPIC, PolicyVersion, PolicyVersionCodec

log = logging.getLogger(__name__)

DEFAULT_KEY = "policy"
"""The Kafka key of announcements: compaction keeps the newest record per key."""
_CODEC = PolicyVersionCodec()


def announce(
    record: PolicyVersion,
    kafka_config: Mapping[str, Any],
    *,
    topic: str = POLICY_VERSIONS_TOPIC,
    key: str = DEFAULT_KEY,
    timeout_s: float = 30.0,
) -> None:
    """Put `record` on the compacted topic and wait for the broker's acknowledgement.

    `kafka_config` is a librdkafka config with ``bootstrap.servers`` (e.g. `Settings.kafka_config()`).

    Raises:
        AnnounceError: the record was not acknowledged within `timeout_s`, or delivery failed.
    """
    producer = Producer(
        {
            "message.timeout.ms": int(timeout_s * 1000),
            **kafka_config,
            "enable.idempotence": True,
            "acks": "all",
        }
    )
    failures: list[str] = []

    def delivered(error: Any, _message: Any) -> None:
        if error is not None:
            failures.append(str(error))

    try:
        producer.produce(topic, key=key.encode(), value=_CODEC.encode(record), on_delivery=delivered)
    except (KafkaException, BufferError) as exc:
        raise AnnounceError(f"announcing policy version {record.number} on {topic!r} failed: {exc}") from exc
    if producer.flush(timeout_s):
        producer.purge()
        producer.flush(0)
        failures.append(f"no acknowledgement within {timeout_s:g} s")
    if failures:
        raise AnnounceError(
            f"announcing policy version {record.number} on {topic!r} failed: {'; '.join(failures)}; "
            "check the broker and that `rollstream up` provisioned the topic. The version is published "
            "all the same: readers of the policies table see it"
        )


def reannounce_latest(
    lake_uri: str,
    kafka_config: Mapping[str, Any],
    *,
    storage_options: Mapping[str, str] | None = None,
    topic: str = POLICY_VERSIONS_TOPIC,
    key: str = DEFAULT_KEY,
    timeout_s: float = 30.0,
) -> PolicyVersion | None:
    """Announce the newest published version again (a learner that starts); None when there is none."""
    record = latest_version(lake_uri, storage_options=storage_options)
    if record is not None:
        announce(record, kafka_config, topic=topic, key=key, timeout_s=timeout_s)
    return record


class PolicyListener:
    """Reads announcements from the compacted topic, from its beginning, without a consumer group.

    The topic may repeat a version or carry an older one after a newer (a re-announcement):
    a reader keeps the highest number it saw. Records with another key, or that do not decode,
    are skipped with a warning: the policies table, not the topic, is the publication.

    Raises:
        AnnounceError: the topic does not exist (``rollstream up`` provisions it).
    """

    def __init__(
        self,
        kafka_config: Mapping[str, Any],
        *,
        topic: str = POLICY_VERSIONS_TOPIC,
        key: str | None = DEFAULT_KEY,
        timeout_s: float = 30.0,
    ) -> None:
        self.topic = topic
        self._key = key.encode() if key is not None else None
        self._consumer = Consumer(
            {
                "group.id": "rollstream.policy-listener",
                **kafka_config,
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
            }
        )
        found = self._consumer.list_topics(topic, timeout=timeout_s).topics.get(topic)
        if found is None or found.error is not None:
            self._consumer.close()
            raise AnnounceError(
                f"topic {topic!r} cannot be read: {found.error if found is not None else 'missing'}; "
                "`rollstream up` provisions it from infra/topics.toml"
            )
        self._consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in sorted(found.partitions)])

    def poll(self, timeout_s: float = 1.0) -> PolicyVersion | None:
        """The next announced record, or None when none arrived within `timeout_s` (or it was skipped)."""
        message = self._consumer.poll(timeout_s)
        if message is None:
            return None
        where = f"{message.topic()}[{message.partition()}]@{message.offset()}"
        if message.error() is not None:
            log.warning("policy versions topic: %s at %s", message.error(), where)
            return None
        if self._key is not None and message.key() != self._key:
            return None
        try:
            return _CODEC.decode(message.value() or b"")
        except DecodeError as exc:
            log.warning("policy versions topic: skipping %s: %s", where, exc)
            return None

    def close(self) -> None:
        """Leave the topic; the listener is unusable afterwards."""
        self._consumer.close()

    def __enter__(self) -> PolicyListener:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def listen(
    kafka_config: Mapping[str, Any],
    *,
    topic: str = POLICY_VERSIONS_TOPIC,
    key: str | None = DEFAULT_KEY,
    idle_s: float | None = None,
) -> Iterator[PolicyVersion]:
    """Yield announced records in topic order, from the beginning; stop after `idle_s` without one.

    With `idle_s` None it runs until the caller stops iterating.
    """
    with PolicyListener(kafka_config, topic=topic, key=key) as listener:
        quiet_since = time.monotonic()
        while idle_s is None or time.monotonic() - quiet_since < idle_s:
            record = listener.poll(0.5)
            if record is not None:
                quiet_since = time.monotonic()
                yield record
