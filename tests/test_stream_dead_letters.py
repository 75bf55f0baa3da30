"""The dead-letter writer against the real broker: big letters, cut letters, no duplicate sends."""

from __future__ import annotations

import os

import polars as pl
import pytest
from confluent_kafka.admin import NewTopic
from stream_support import read_topic

from stream_processors import Coordinates, DeadLetter, DeadLetters
from stream_processors.dead_letters import DLQ_MAX_MESSAGE_BYTES, FALLBACK_MESSAGE_BYTES
from stream_processors.exceptions import SinkError

pytestmark = pytest.mark.timeout(120)
MIB = 2**20


def letter(size: int, offset: int = 0) -> DeadLetter:
    return DeadLetter("bad bytes", "DecodeError", os.urandom(size), b"key", Coordinates("src", 0, offset))


def stored_raw(dead_letters: DeadLetters) -> list[bytes]:
    return pl.read_delta(dead_letters.table.uri).sort("offset")["raw"].to_list()


def test_a_letter_as_big_as_an_ultra_message_arrives_whole(bootstrap_servers, make_topic, tmp_path):
    dlq = make_topic("stream-dlq", config={"max.message.bytes": str(DLQ_MAX_MESSAGE_BYTES)})
    dead_letters = DeadLetters(tmp_path / "dl", bootstrap_servers=bootstrap_servers, topic=dlq)
    big = letter(int(2.4 * MIB))
    assert dead_letters.write([big, letter(10, offset=1)]) == 2
    dead_letters.close()
    messages = read_topic(bootstrap_servers, dlq, 2)
    assert [m.value() for m in messages] == [big.raw, stored_raw(dead_letters)[1]]
    assert "value_truncated" not in dict(messages[0].headers())
    assert stored_raw(dead_letters)[0] == big.raw
    with pytest.raises(SinkError, match=r"after DeadLetters\.close"):
        dead_letters.write([letter(1, offset=2)])


def test_a_letter_over_the_producer_limit_is_cut_on_the_topic_and_whole_in_the_table(
    bootstrap_servers, make_topic, tmp_path
):
    dlq = make_topic("stream-dlq", config={"max.message.bytes": str(DLQ_MAX_MESSAGE_BYTES)})
    dead_letters = DeadLetters(
        tmp_path / "dl",
        bootstrap_servers=bootstrap_servers,
        topic=dlq,
        producer_config={"message.max.bytes": MIB},
    )
    big = letter(int(2.4 * MIB))
    assert dead_letters.write([big]) == 1
    (message,) = read_topic(bootstrap_servers, dlq, 1)
    headers = dict(message.headers())
    assert len(message.value()) < MIB and big.raw.startswith(message.value())
    assert (
        headers["value_truncated"]
        .decode()
        .endswith(f"of {len(big.raw)} bytes; the full value is in the dead_letters table")
    )
    assert headers["source_offset"] == b"0"
    assert stored_raw(dead_letters) == [big.raw]


def test_a_letter_the_topic_rejects_as_too_large_is_sent_again_cut(bootstrap_servers, make_topic, tmp_path):
    dlq = make_topic("stream-dlq", config={"max.message.bytes": str(MIB + 12)})  # Kafka's default limit
    dead_letters = DeadLetters(tmp_path / "dl", bootstrap_servers=bootstrap_servers, topic=dlq)
    small, big = letter(100, offset=0), letter(int(2.4 * MIB), offset=1)
    assert dead_letters.write([small, big]) == 2
    messages = read_topic(bootstrap_servers, dlq, 2)
    assert [dict(m.headers())["source_offset"] for m in messages] == [
        b"0",
        b"1",
    ]  # source_offset: each letter once
    assert messages[0].value() == small.raw
    assert len(messages[1].value()) <= FALLBACK_MESSAGE_BYTES and big.raw.startswith(messages[1].value())
    assert "value_truncated" in dict(messages[1].headers())
    assert stored_raw(dead_letters) == [small.raw, big.raw]


def test_a_retry_after_a_failed_table_append_sends_nothing_twice(bootstrap_servers, make_topic, tmp_path):
    dlq = make_topic("stream-dlq")
    blocker = tmp_path / "lake"
    blocker.write_text("a file where the lake should be")
    dead_letters = DeadLetters(blocker / "dead_letters", bootstrap_servers=bootstrap_servers, topic=dlq)
    letters = [letter(50, offset=i) for i in range(3)]
    with pytest.raises(SinkError, match="dead_letters"):
        dead_letters.write(letters)  # sent to the topic, then the append fails
    blocker.unlink()
    assert dead_letters.write(letters) == 3  # what Stage's retry does
    messages = read_topic(bootstrap_servers, dlq, 3)
    assert sorted(m.value() for m in messages) == sorted(d.raw for d in letters)


def test_letters_left_queued_by_a_flush_timeout_are_purged_not_sent_twice(
    bootstrap_servers, admin, tmp_path, make_topic
):
    dlq = make_topic("stream-dlq")
    admin.delete_topics([dlq])[dlq].result(timeout=30)  # a name make_topic cleans up, with no topic yet
    dead_letters = DeadLetters(
        tmp_path / "dl",
        bootstrap_servers=bootstrap_servers,
        topic=dlq,
        producer_config={"allow.auto.create.topics": False},
        flush_timeout_s=1.0,
    )
    letters = [letter(50, offset=i) for i in range(3)]
    with pytest.raises(SinkError, match=r"3 letters undelivered after 1.0s \(purged"):
        dead_letters.write(letters)
    admin.create_topics([NewTopic(dlq, 1, 1)])[dlq].result(timeout=30)
    dead_letters.flush_timeout_s = 30.0
    assert dead_letters.write(letters) == 3
    dead_letters.close()
    messages = read_topic(bootstrap_servers, dlq, 3, timeout_s=30)
    assert sorted(m.value() for m in messages) == sorted(d.raw for d in letters)
