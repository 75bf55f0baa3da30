"""The Faust app's wiring (lanes of batched intake) and its startup checks against the broker and the lake."""

from __future__ import annotations

import uuid
from concurrent.futures import Future

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient
from stream_support import publish

from producers.fleet import SyntheticFleet
from schemas import TrajectoryCodec
from stream_processors import BatchProcessor, Coordinates, DeadLetter, DeadLetters, DeltaSink, SourceMessage
from stream_processors.app import ULTRA_MAX_MESSAGE_BYTES, create_app, faust_broker_url
from stream_processors.exceptions import StreamProcessorError
from stream_processors.lanes import RAW_MAX_MESSAGE_BYTES
from stream_processors.preflight import check_stored_offsets, high_watermarks, topic_partition_count

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
    assert app.conf.web_enabled is True  # Faust's web server serves /metrics and /health
    assert app.conf.web_bind == "127.0.0.1" and app.conf.web_port > 0
    assert str(app.conf.store) == "memory:"
    assert app.boot_strategy.enable_kafka is False  # no Faust consumer may join the group
    lanes = app.lanes
    assert {name: lane.intake.topic for name, lane in lanes.items()} == {
        "raw": "rollouts.raw",
        "ultra": "rollouts.ultra",
    }
    raw, ultra = lanes["raw"].intake.config, lanes["ultra"].intake.config
    assert raw["group.id"] == ultra["group.id"] == "grp"
    assert raw["auto.offset.reset"] == "earliest"
    assert raw["enable.auto.commit"] is False and raw["enable.auto.offset.store"] is False
    assert ultra["max.partition.fetch.bytes"] == ULTRA_MAX_MESSAGE_BYTES == 64 * 2**20
    assert raw["max.partition.fetch.bytes"] == RAW_MAX_MESSAGE_BYTES == 4 * 2**20
    assert (lanes["raw"].batch_size, lanes["ultra"].batch_size) == (500, 4)
    only_raw = create_app(
        bootstrap_servers=bootstrap_servers, lake_dir=tmp_path, ultra_topic=None, raw_partitions=1
    )
    assert [lane.intake.topic for lane in only_raw.lanes.values()] == ["rollouts.raw"]
    with pytest.raises(ValueError, match="batch_within_s"):
        create_app(bootstrap_servers="x:1", lake_dir=tmp_path, batch_within_s=0, raw_partitions=1)


def test_broker_url_lists_every_server():
    assert faust_broker_url("a:9092, b:9093") == "kafka://a:9092;kafka://b:9093"


def test_partition_count_comes_from_the_broker(bootstrap_servers, make_topic, admin: AdminClient, tmp_path):
    assert topic_partition_count(bootstrap_servers, make_topic("stream-raw", partitions=3)) == 3
    missing = f"stream-missing-{uuid.uuid4().hex[:8]}"
    with pytest.raises(StreamProcessorError, match=rf"topic '{missing}' is not available.*rollstream up"):
        topic_partition_count(bootstrap_servers, missing, timeout_s=5)
    raw = make_topic("stream-raw", partitions=1)
    with pytest.raises(StreamProcessorError, match=rf"topic '{missing}'.*ultra_topic=None"):
        create_app(bootstrap_servers=bootstrap_servers, lake_dir=tmp_path, raw_topic=raw, ultra_topic=missing)
    assert missing not in admin.list_topics(timeout=10).topics  # the lookups never create topics


def test_stored_offsets_ahead_of_a_topic_are_refused(bootstrap_servers, make_topic, tmp_path):
    raw = make_topic("stream-raw", partitions=1)
    codec = TrajectoryCodec()
    values = [codec.encode(r) for r in SyntheticFleet(seed=5).trajectories(3)]
    publish(bootstrap_servers, raw, [(None, v) for v in values])
    assert high_watermarks(bootstrap_servers, [raw]) == {(raw, 0): 3}
    sink = DeltaSink(tmp_path / "trajectories", app_id="proc")
    letters = DeadLetters(tmp_path / "dead_letters", app_id="proc")
    stores = [("trajectories", sink), ("dead_letters", letters)]

    def write_at(offset: int) -> None:
        batch = BatchProcessor().process([SourceMessage(Coordinates(raw, 0, offset), None, values[0])])
        assert sink.write(batch.rows, batch.coordinates) == 1

    check_stored_offsets(bootstrap_servers, [raw], stores)  # nothing stored yet
    write_at(2)
    check_stored_offsets(bootstrap_servers, [raw], stores)  # caught up with the topic: fine
    letters.write([DeadLetter("bad", "DecodeError", b"x", None, Coordinates(raw, 0, 3))])
    with pytest.raises(StreamProcessorError, match=rf"dead_letters table stored offset 3 for {raw}\[0\]"):
        check_stored_offsets(bootstrap_servers, [raw], stores)
    write_at(100)
    with pytest.raises(StreamProcessorError) as caught:
        check_stored_offsets(bootstrap_servers, [raw], stores)
    message = str(caught.value)
    assert (
        f"trajectories table stored offset 100 for {raw}[0], but that partition ends at offset 3" in message
    )
    assert "new lake directory" in message and "new app_id" in message


def test_end_offsets_are_asked_again_while_a_new_partition_has_no_leader(
    bootstrap_servers, make_topic, monkeypatch
):
    """A topic created a moment ago can answer NOT_LEADER_FOR_PARTITION; preflight asks again."""
    topic = make_topic("leaderless", partitions=2)
    publish(bootstrap_servers, topic, [(b"k", b"v")] * 3)  # one key: one partition
    real = AdminClient.list_offsets
    refused: list[int] = []

    def list_offsets(self, request, **kwargs):
        if len(refused) < 2:  # as the broker answers before the leader is known
            refused.append(1)
            failed: Future = Future()
            failed.set_exception(KafkaException(KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION)))
            return {tp: failed for tp in request}
        return real(self, request, **kwargs)

    monkeypatch.setattr(AdminClient, "list_offsets", list_offsets)
    ends = high_watermarks(bootstrap_servers, [topic])
    assert set(ends) == {(topic, 0), (topic, 1)} and sorted(ends.values()) == [0, 3]
    assert len(refused) == 2
