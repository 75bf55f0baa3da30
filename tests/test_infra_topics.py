"""Provisioning brings existing topics in line with their declaration; undeclared ones never appear."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping

import pytest
from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import AdminClient

from infra.exceptions import TopicProvisionError
from infra.topics import TopicSpec, describe_topic_configs, provision_topics

DECLARED = {"retention.ms": "3600000", "max.message.bytes": "2097152", "compression.type": "producer"}


def configs_reach(admin: AdminClient, topic: str, expected: Mapping[str, str], timeout_s: float = 30) -> None:
    """Wait until the broker describes `topic` with `expected`: the controller has accepted an alter
    once provision_topics returns, and the broker applies it from the metadata log a moment later."""
    deadline = time.monotonic() + timeout_s
    while True:
        configs = describe_topic_configs(admin, topic)
        seen = {key: configs.get(key) for key in expected}
        if seen == dict(expected) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert seen == dict(expected)


@pytest.mark.timeout(120)
def test_existing_topic_is_altered_and_grown_then_left_alone(
    admin: AdminClient, make_topic: Callable[..., str]
) -> None:
    topic = make_topic("infra-provision", partitions=1, config={"retention.ms": "60000"})
    spec = TopicSpec("raw", topic, partitions=3, replication=1, config=DECLARED)

    changes = provision_topics(admin, [spec])

    assert [change.action for change in changes] == ["altered", "partitions_increased"]
    assert "retention.ms=3600000" in changes[0].detail
    assert changes[1].detail == "1 -> 3"
    configs_reach(admin, topic, DECLARED)
    assert len(admin.list_topics(topic, timeout=10).topics[topic].partitions) == 3
    again = provision_topics(admin, [spec])
    assert [(change.topic, change.action) for change in again] == [(topic, "unchanged")]


@pytest.mark.timeout(120)
def test_fewer_declared_partitions_is_an_error_but_configs_still_apply(
    admin: AdminClient, make_topic: Callable[..., str]
) -> None:
    topic = make_topic("infra-shrink", partitions=2)
    spec = TopicSpec("raw", topic, partitions=1, replication=1, config={"retention.ms": "7200000"})

    with pytest.raises(TopicProvisionError, match=rf"{topic}: has 2 partitions, declared 1; Kafka cannot"):
        provision_topics(admin, [spec])

    configs_reach(admin, topic, {"retention.ms": "7200000"})
    assert len(admin.list_topics(topic, timeout=10).topics[topic].partitions) == 2


@pytest.mark.timeout(60)
def test_an_undeclared_topic_is_never_created_by_use(bootstrap_servers: str, admin: AdminClient) -> None:
    name = f"undeclared-{uuid.uuid4().hex[:8]}"
    admin.list_topics(name, timeout=10)  # a metadata request naming it would auto-create it
    producer = Producer({"bootstrap.servers": bootstrap_servers, "message.timeout.ms": 5000})
    errors: list[KafkaError] = []
    producer.produce(name, b"x", on_delivery=lambda err, _msg: errors.append(err))
    producer.flush(15)
    assert errors and errors[0] is not None  # the broker refused: topics come from infra/topics.toml
    assert name not in admin.list_topics(timeout=10).topics
