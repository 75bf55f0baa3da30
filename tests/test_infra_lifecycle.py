"""`up` / `status` / `down` on a private stack: its own state dir, free ports, a small heap.

The shared dev broker on 9092/9093 is never touched; every process these tests start is stopped by
pid in a finalizer, even when an assertion fails.
"""

from __future__ import annotations

import os
import socket
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, Message, Producer

from infra import services
from infra.broker import BrokerPaths
from infra.exceptions import BrokerError, PortInUseError
from infra.processes import command_line, group_members, port_is_free
from infra.settings import Settings
from infra.topics import admin_client, describe_topic_configs, load_topics


def free_ports(count: int) -> list[int]:
    """Ports the kernel hands out as free right now (never the dev broker's 9092/9093)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def private_settings(state_dir: Path, **changes: Any) -> Settings:
    kafka, controller, mlflow = free_ports(3)
    values: dict[str, Any] = {
        "state_dir": state_dir,
        "kafka_host": "127.0.0.1",
        "kafka_port": kafka,
        "controller_port": controller,
        "mlflow_port": mlflow,
        "kafka_heap": "512m",
        "raw_topic": "rollouts.raw",
        "ultra_topic": "rollouts.ultra",
        "dlq_topic": "rollouts.dlq",
    }
    return Settings.load(**{**values, **changes})


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Settings]:
    settings = private_settings(tmp_path / "state")
    yield settings
    services.down(settings, progress=lambda _: None)


@pytest.mark.slow(124)
@pytest.mark.timeout(240)
def test_up_status_down_twice_on_the_same_storage(stack: Settings) -> None:
    messages: list[str] = []
    specs = load_topics(stack)

    first = services.up(stack, mlflow_server=True, progress=messages.append)

    assert first.running and first.pid is not None
    broker_argv = command_line(first.pid)
    assert "kafka.Kafka" in broker_argv and f"-Xmx{stack.kafka_heap}" in broker_argv
    created = ["altered"] + ["created"] * len(specs)  # the tasks share group's configs, then each topic
    assert sorted(change.action for change in first.changes) == created
    assert set(first.topics) == {spec.name for spec in specs} and not first.missing_topics
    admin = admin_client(stack.bootstrap_servers)
    for spec in specs:
        configs = describe_topic_configs(admin, spec.name)
        assert {key: configs[key] for key in spec.config} == dict(spec.config)
        assert len(admin.list_topics(spec.name, timeout=10).topics[spec.name].partitions) == spec.partitions
    assert first.mlflow.running and first.mlflow.pid is not None
    with urllib.request.urlopen(f"{first.mlflow.url}/health", timeout=10) as response:
        assert response.status == 200

    _assert_size_limits(stack)
    cluster_id = _cluster_id(stack)

    again = services.up(stack, mlflow_server=True, progress=messages.append)

    assert (again.pid, again.mlflow.pid) == (first.pid, first.mlflow.pid)
    assert [change.action for change in again.changes] == ["unchanged"] * (len(specs) + 1)
    assert any("already running" in message for message in messages)

    stopped = services.down(stack, progress=messages.append)

    assert stopped == [f"mlflow server (pid {first.mlflow.pid})", f"kafka broker (pid {first.pid})"]
    assert not Path(f"/proc/{first.pid}").exists()
    assert group_members(first.mlflow.pid) == []
    assert port_is_free("127.0.0.1", stack.kafka_port) and port_is_free("127.0.0.1", stack.mlflow_port)
    after = services.status(stack)
    assert not after.running and not after.mlflow.running and after.topics == ()
    assert services.down(stack, progress=messages.append) == []

    restarted = services.up(stack, progress=messages.append)

    assert restarted.running and restarted.pid not in (None, first.pid)
    assert _cluster_id(stack) == cluster_id  # formatted once, reused
    assert [change.action for change in restarted.changes] == ["unchanged"] * (len(specs) + 1)
    assert services.status(stack).topics == restarted.topics
    assert not restarted.mlflow.running
    assert services.down(stack, progress=messages.append) == [f"kafka broker (pid {restarted.pid})"]
    assert not Path(f"/proc/{restarted.pid}").exists()


def _cluster_id(settings: Settings) -> str:
    meta = (BrokerPaths.of(settings).data / "meta.properties").read_text()
    return next(line.split("=", 1)[1] for line in meta.splitlines() if line.startswith("cluster.id="))


def _assert_size_limits(settings: Settings) -> None:
    """A 5 MiB message fits the ultra topic (64 MiB) but not the raw one (4 MiB)."""
    producer = Producer(
        {"bootstrap.servers": settings.bootstrap_servers, "message.max.bytes": 70_000_000, "linger.ms": 0}
    )
    results: dict[str, KafkaError | None] = {}
    payload = os.urandom(5 * 1024 * 1024)

    def delivered(err: KafkaError | None, msg: Message) -> None:
        results[str(msg.topic())] = err

    for topic in (settings.ultra_topic, settings.raw_topic):
        producer.produce(topic, payload, on_delivery=delivered)
    assert producer.flush(30) == 0
    assert results[settings.ultra_topic] is None
    raw_error = results[settings.raw_topic]
    assert raw_error is not None and raw_error.code() == KafkaError.MSG_SIZE_TOO_LARGE


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("port_name", "flag", "env"),
    [
        ("kafka_port", "--kafka-port", "ROLLSTREAM_KAFKA__PORT"),
        ("controller_port", "--controller-port", "ROLLSTREAM_KAFKA__CONTROLLER_PORT"),
    ],
)
def test_taken_port_is_refused_clearly(stack: Settings, port_name: str, flag: str, env: str) -> None:
    port = getattr(stack, port_name)
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        with pytest.raises(PortInUseError) as caught:
            services.up(stack, progress=lambda _: None)
    assert str(caught.value) == (
        f"port {port} on 127.0.0.1 is taken by another process; pick another with {flag} or {env}"
    )
    assert not BrokerPaths.of(stack).pid_file.exists()
    assert not services.status(stack).running


@pytest.mark.timeout(90)
def test_broker_that_cannot_start_reports_its_log(tmp_path: Path) -> None:
    settings = private_settings(tmp_path / "state", kafka_heap="1k")
    with pytest.raises(BrokerError) as caught:
        services.up(settings, progress=lambda _: None)
    message = str(caught.value)
    assert "exited with code" in message and str(BrokerPaths.of(settings).console_log) in message
    assert "heap" in message.lower()  # the JVM's own complaint, from the log's last lines
    assert not BrokerPaths.of(settings).pid_file.exists()
    with pytest.raises(KafkaException):
        admin_client(settings.bootstrap_servers).list_topics(timeout=1)


def test_pid_file_naming_a_foreign_process_is_ignored_never_signalled(stack: Settings) -> None:
    pid_file = BrokerPaths.of(stack).pid_file
    pid_file.parent.mkdir(parents=True)
    pid_file.write_text(f"{os.getpid()}\n")  # this pytest process: alive, but not a broker of ours

    assert not services.status(stack).running
    assert services.down(stack, progress=lambda _: None) == []
    assert not pid_file.exists()  # the stale file is gone; this process is still here to assert it
