"""The Faust app's wiring: settings that the hazards demand, and the topic metadata lookup."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka.admin import AdminClient

from stream_processors.app import create_app, faust_broker_url, topic_partition_count
from stream_processors.exceptions import StreamProcessorError

pytestmark = pytest.mark.timeout(60)


def test_app_settings(tmp_path, bootstrap_servers):
    app = create_app(
        bootstrap_servers=bootstrap_servers,
        lake_dir=tmp_path,
        app_id="proc",
        group_id="grp",
        raw_partitions=4,
    )
    assert app.conf.id == "grp"
    assert app.conf.web_enabled is False
    assert app.conf.consumer_auto_offset_reset == "earliest"
    assert app.conf.topic_partitions == 4
    assert app.conf.topic_disable_leader is True
    assert str(app.conf.store) == "memory:"
    (agent,) = app.agents.values()
    assert agent.concurrency == 1
    assert list(agent.channel.topics) == ["rollouts.raw"]
    with pytest.raises(ValueError, match="batch_within_s"):
        create_app(bootstrap_servers="x:1", lake_dir=tmp_path, batch_within_s=0, raw_partitions=1)


def test_broker_url_lists_every_server():
    assert faust_broker_url("a:9092, b:9093") == "kafka://a:9092;kafka://b:9093"


def test_partition_count_comes_from_the_broker(bootstrap_servers, make_topic, admin: AdminClient):
    assert topic_partition_count(bootstrap_servers, make_topic("stream-raw", partitions=3)) == 3
    missing = f"stream-missing-{uuid.uuid4().hex[:8]}"
    with pytest.raises(StreamProcessorError, match=rf"topic '{missing}' is not available.*rollstream up"):
        topic_partition_count(bootstrap_servers, missing, timeout_s=5)
    assert missing not in admin.list_topics(timeout=10).topics  # the lookup never creates topics
