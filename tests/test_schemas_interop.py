"""A producer in another language gets through: Avro Java's single-object encoder, via Kafka.

The Java program knows only schemas/avro/trajectory.avsc and the wire-format page; its jars come
from Maven Central through tests/interop/java/pom.xml.
"""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer

from infra.exceptions import InstallError
from infra.install import interop_classpath
from infra.settings import Settings
from schemas import TRAJECTORY_SCHEMA_PATH, TrajectoryCodec, unpack_float32, unpack_int32

JAVA_DIR = Path(__file__).parent / "interop" / "java"


def _java_classpath() -> str:
    """The jars the install step fetched (install step 'interop'); missing, the test fails at once."""
    try:
        return interop_classpath(Settings())
    except InstallError as exc:
        pytest.fail(str(exc), pytrace=False)


def test_java_producer_messages_decode(tmp_path: Path, bootstrap_servers: str, make_topic) -> None:
    topic = make_topic("interop", partitions=2)
    count = 12
    subprocess.run(
        ["java", "-cp", _java_classpath(), str(JAVA_DIR / "PublishTrajectories.java"),
         str(TRAJECTORY_SCHEMA_PATH), bootstrap_servers, topic, str(count)],
        check=True, timeout=180,
    )  # fmt: skip

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap_servers,
            "group.id": f"interop-{uuid.uuid4()}",
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([topic])
    codec = TrajectoryCodec()
    records = []
    try:
        for _ in range(60):
            for message in consumer.consume(num_messages=count, timeout=1.0):
                assert message.error() is None
                record = codec.decode(message.value())
                assert message.key() == record["group_id"].encode()
                records.append(record)
            if len(records) >= count:
                break
    finally:
        consumer.close()

    assert sorted(r["trajectory_id"] for r in records) == sorted(f"java-{i}" for i in range(count))
    r5 = next(r for r in records if r["trajectory_id"] == "java-5")
    assert unpack_int32(r5["prompt_tokens"]).tolist() == [1, 2, 3, 5]
    assert unpack_float32(r5["response_logprobs"]).tolist() == [-0.5, -1.5]
    assert r5["metadata"] == {"lang": "java"} and r5["policy_version"] == 3
    assert r5["created_at"].timestamp() * 1000 == 1764504000005
