"""`rollstream up --secure`: SASL/SCRAM over TLS, one user per role, ACLs that keep each role to its topics.

A broker of its own (own state dir and ports) beside the suite's plaintext one.
"""

from __future__ import annotations

import stat
import time
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from stack_support import free_port_block
from stream_support import publish, start_worker, stop_worker, table_rows, wait_for

from infra import services
from infra.secure import SecurePaths, client_config
from infra.settings import Settings
from infra.topics import admin_client
from producers import Publisher
from producers.fleet import SyntheticFleet, without_code

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    base = free_port_block(4, start=39700)
    settings = Settings(
        state_dir=tmp_path_factory.mktemp("secure") / "stack",
        kafka_port=base,
        controller_port=base + 1,
        mlflow_port=base + 2,
        kafka_heap="384m",
    )
    try:
        services.up(settings, secure=True)
        yield settings
    finally:
        services.down(settings)


def _config(settings: Settings, role: str, password: str | None = None) -> dict[str, str | int]:
    paths = SecurePaths.of(settings.state_dir)
    return {**client_config(paths, role, password), "bootstrap.servers": settings.bootstrap_servers}


def _produce(settings: Settings, role: str, topic: str) -> KafkaError | None:
    producer = Producer({**_config(settings, role), "message.timeout.ms": 15_000})
    results: list[KafkaError | None] = []
    producer.produce(topic, b"probe", partition=0, on_delivery=lambda err, _msg: results.append(err))
    producer.flush(30)
    assert len(results) == 1, "no delivery report within 30 s"
    return results[0]


def _first_message_or_error(settings: Settings, role: str, topic: str) -> bytes | KafkaError:
    consumer = Consumer(
        {**_config(settings, role), "group.id": "rollstream-probe", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is None:
                continue
            error = message.error()
            return error if error is not None else bytes(message.value() or b"")
        raise AssertionError(f"neither a message nor an error from {topic} within 30 s as {role}")
    finally:
        consumer.close()


def test_secrets_are_private_and_role_configs_written(stack: Settings):
    paths = SecurePaths.of(stack.state_dir)
    for secret in (paths.credentials, paths.ca_key, paths.broker_keystore, paths.role_config("producer")):
        assert stat.S_IMODE(secret.stat().st_mode) == 0o600, secret
    text = paths.role_config("producer").read_text()
    assert '"sasl.username" = "producer"' in text and "ssl.ca.location" in text


def test_plaintext_and_a_wrong_password_are_refused(stack: Settings):
    with pytest.raises(KafkaException):
        admin_client(stack.bootstrap_servers).list_topics(timeout=5)
    errors: list[KafkaError] = []
    producer = Producer({**_config(stack, "producer", "not-the-password"), "error_cb": errors.append})
    deadline = time.monotonic() + 30
    while not any(e.code() == KafkaError._AUTHENTICATION for e in errors) and time.monotonic() < deadline:
        producer.poll(0.5)
    assert any(e.code() == KafkaError._AUTHENTICATION for e in errors), errors


def test_acls_keep_each_role_to_its_topics(stack: Settings):
    assert _produce(stack, "producer", stack.raw_topic) is None
    refused = _produce(stack, "producer", stack.dlq_topic)
    assert refused is not None and refused.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert _produce(stack, "processor", stack.dlq_topic) is None
    # The dead letters' raw bytes: the operator reads them, the processor (which writes them) cannot.
    assert _first_message_or_error(stack, "operator", stack.dlq_topic) == b"probe"
    denied = _first_message_or_error(stack, "processor", stack.dlq_topic)
    assert isinstance(denied, KafkaError) and denied.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert _first_message_or_error(stack, "processor", stack.raw_topic) == b"probe"


def test_up_again_keeps_the_users(stack: Settings):
    before = SecurePaths.of(stack.state_dir).credentials.read_text()
    services.up(stack)
    assert SecurePaths.of(stack.state_dir).credentials.read_text() == before
    assert _produce(stack, "producer", stack.raw_topic) is None


def test_secure_refused_on_a_plaintext_state_dir(tmp_path: Path):
    settings = Settings(state_dir=tmp_path / "plain")
    (settings.state_dir / "kafka" / "data").mkdir(parents=True)
    (settings.state_dir / "kafka" / "data" / "meta.properties").write_text("formatted\n")
    with pytest.raises(Exception, match="plaintext broker"):
        services.up(settings, secure=True)


def test_producer_and_processor_work_with_their_role_settings(stack: Settings, tmp_path: Path):
    """The settings files `up --secure` writes are all a producer and a processor need."""
    paths = SecurePaths.of(stack.state_dir)
    producer_settings = Settings.load(paths.role_config("producer"))
    records = list(without_code(SyntheticFleet(5, group_size=4).trajectories(200)))
    with Publisher(
        bootstrap_servers=stack.bootstrap_servers,
        topic=stack.raw_topic,
        extra_config=dict(producer_settings.kafka_client),
    ) as publisher:
        for record in records:
            publisher.publish(record)
    garbage = [(b"bad", b"\x00not avro %d" % i) for i in range(3)]
    publish(stack.bootstrap_servers, stack.raw_topic, garbage, config=dict(producer_settings.kafka_client))
    lake, log = tmp_path / "lake", tmp_path / "worker.log"
    worker = start_worker(
        stack.bootstrap_servers,
        lake,
        stack.raw_topic,
        stack.dlq_topic,
        "rollstream-secure",
        "rollstream-secure",
        log,
        ultra=stack.ultra_topic,
        extra=["--config", str(paths.role_config("processor"))],
    )
    try:
        # The earlier tests' probes in the module's stack are dead letters too; ours have key b"bad".
        wait_for(
            lambda: table_rows(lake / "trajectories") == 200 and _garbage_letters(lake) == 3,
            180,
            worker,
            log,
            "200 rows and 3 dead letters",
        )
    finally:
        assert stop_worker(worker, log) == 0


def _garbage_letters(lake: Path) -> int:
    if table_rows(lake / "dead_letters") == 0:
        return 0
    letters = pl.read_delta(str(lake / "dead_letters"), columns=["key"])
    return letters.filter(pl.col("key") == pl.lit(b"bad", dtype=pl.Binary)).height


def test_the_producer_role_takes_and_settles_tasks_and_only_the_operator_reads_task_dead_letters(
    stack: Settings,
):
    from producers.tasks import TaskQueue, TaskSubmitter, TaskTopics, read_status

    producer = Settings.load(SecurePaths.of(stack.state_dir).role_config("producer"))
    client = dict(producer.kafka_client)
    topics = TaskTopics.named(
        stack.tasks_topic, dead_letters=stack.task_dlq_topic, outcomes=stack.task_outcomes_topic
    )
    row = {
        "task_id": "secure-1",
        "prompt_tokens": [1, 2, 3],
        "domain": "math/algebra-001",
        "task_type": "math",
        "expected_answer": "2",
        "group_size": 2,
        "max_tokens": 4,
        "deadline_ms": 60_000,
    }
    with TaskSubmitter(
        bootstrap_servers=stack.bootstrap_servers,
        topics=topics,
        lock_ms=stack.task_lock_ms,
        default_deadline_ms=60_000,
        extra_config=client,
    ) as submitter:
        assert submitter.submit([row]).submitted.get("low") == 1
    queue = TaskQueue(
        bootstrap_servers=stack.bootstrap_servers, topics=topics, group=stack.task_group, extra_config=client
    )
    try:
        leases = []
        deadline = time.monotonic() + 60
        while not leases and time.monotonic() < deadline:
            leases = queue.take(1, timeout=1.0)
        assert [lease.task_id for lease in leases] == ["secure-1"]
        leases[0].done()
    finally:
        queue.close()
    status = read_status(
        bootstrap_servers=stack.bootstrap_servers,
        topics=topics,
        lock_ms=stack.task_lock_ms,
        extra_config=client,
    )
    assert status.classes["low"].done == 1
    assert _produce(stack, "producer", stack.task_dlq_topic) is None
    assert _first_message_or_error(stack, "operator", stack.task_dlq_topic) == b"probe"
    denied = _first_message_or_error(stack, "producer", stack.task_dlq_topic)
    assert isinstance(denied, KafkaError) and denied.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    refused = _produce(stack, "processor", stack.task_dlq_topic)
    assert refused is not None and refused.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
