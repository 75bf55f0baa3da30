"""Provisioning brings existing topics in line with their declaration, on the shared dev broker."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from confluent_kafka.admin import AdminClient

from infra.exceptions import TopicProvisionError
from infra.topics import TopicSpec, describe_topic_configs, provision_topics

DECLARED = {"retention.ms": "3600000", "max.message.bytes": "2097152", "compression.type": "producer"}


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
    configs = describe_topic_configs(admin, topic)
    assert {key: configs[key] for key in DECLARED} == DECLARED
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

    assert describe_topic_configs(admin, topic)["retention.ms"] == "7200000"
    assert len(admin.list_topics(topic, timeout=10).topics[topic].partitions) == 2
