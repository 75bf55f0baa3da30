"""The ``kafka_client`` setting reaches every Kafka client rollstream builds, and Faust's consumer."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaException

from infra.accounting import high_watermarks as topic_ends
from infra.topics import admin_client
from infra.watch import group_lag
from producers import Publisher
from producers.exceptions import ProducerError
from stream_processors.app import create_app
from stream_processors.preflight import high_watermarks, topic_ids, topic_partitions
from stream_processors.rescore import fetch_messages

pytestmark = pytest.mark.timeout(120)

BOGUS = {"rollstream.not.a.property": "1"}


def test_every_client_takes_the_passthrough(bootstrap_servers: str, make_topic: Callable[..., str]) -> None:
    """An unknown librdkafka property fails each client's construction: proof it was handed over."""
    topic = make_topic("passthrough", partitions=2)
    calls: dict[str, Callable[[dict[str, str]], Any]] = {
        "preflight.topic_partitions": lambda c: topic_partitions(bootstrap_servers, [topic], kafka_client=c),
        "preflight.high_watermarks": lambda c: high_watermarks(bootstrap_servers, [topic], kafka_client=c),
        "preflight.topic_ids": lambda c: topic_ids(bootstrap_servers, [topic], kafka_client=c),
        "accounting.high_watermarks": lambda c: topic_ends(bootstrap_servers, topic, kafka_client=c),
        "watch.group_lag": lambda c: group_lag(bootstrap_servers, (topic,), "g", c),
        "rescore.fetch_messages": lambda c: fetch_messages(bootstrap_servers, [], kafka_client=c),
        "topics.admin_client": lambda c: admin_client(bootstrap_servers, c).list_topics(timeout=10),
        "Publisher": lambda c: Publisher(
            bootstrap_servers=bootstrap_servers, topic=topic, extra_config=c
        ).close(),
    }
    for name, call in calls.items():
        call({"client.id": "rollstream-passthrough-test"})  # a real property: works against the broker
        with pytest.raises((KafkaException, ProducerError), match="No such configuration property"):
            call(BOGUS)
            pytest.fail(f"{name} ignored kafka_client")


def test_worker_hands_security_to_its_consumers_and_the_dead_letter_producer(
    tmp_path: Path, bootstrap_servers: str
) -> None:
    secured = {
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "processor",
        "sasl.password": "s3cret",
    }
    app = create_app(
        bootstrap_servers=bootstrap_servers, lake_dir=tmp_path, raw_partitions=1, kafka_client=secured
    )
    for lane in app.lanes.values():  # each lane's consumer (Faust itself opens no Kafka client)
        assert {key: lane.intake.config[key] for key in secured} == secured
    app.stage.dead_letters.close()  # its producer would retry the SASL handshake for the whole run
    with pytest.raises(KafkaException, match="No such configuration property"):  # the dead-letter producer
        create_app(
            bootstrap_servers=bootstrap_servers, lake_dir=tmp_path, raw_partitions=1, kafka_client=BOGUS
        )
