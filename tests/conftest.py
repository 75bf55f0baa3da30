"""Shared fixtures: every test runs against the real broker that `rollstream up` started.

The broker address comes from ROLLSTREAM_KAFKA__BOOTSTRAP_SERVERS (default 127.0.0.1:9092). A missing
broker is a test error, never a skip: `bash infra/run.sh test` starts one.
"""

from __future__ import annotations

import contextlib
import os
import socket
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Order files by the seconds their `slow(seconds)` tests declare, most first; the rest keep
    their order after them.

    `infra/test.sh` runs the suite on pytest-xdist workers, a file at a time each (``--dist
    loadscope``): starting the long files first lets the short ones fill in beside them.
    """
    seconds: dict[Path, float] = defaultdict(float)
    for item in items:
        if (marker := item.get_closest_marker("slow")) is not None:
            seconds[item.path] += float(marker.args[0])
    items.sort(key=lambda item: -seconds.get(item.path, 0.0))


@pytest.fixture(scope="session")
def bootstrap_servers() -> str:
    servers = os.environ.get("ROLLSTREAM_KAFKA__BOOTSTRAP_SERVERS", "127.0.0.1:9092")
    host, _, port = servers.split(",")[0].rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as exc:
        raise RuntimeError(
            f"no Kafka broker at {servers}: run the tests with `bash infra/run.sh test`, "
            "or start one with `rollstream up` and export ROLLSTREAM_KAFKA__BOOTSTRAP_SERVERS"
        ) from exc
    return servers


@pytest.fixture
def admin(bootstrap_servers: str) -> AdminClient:
    """A fresh AdminClient per test: a session-long one stayed stuck after the broker was briefly
    fenced under load (every create_topics then timed out for the rest of a CI run)."""
    return AdminClient({"bootstrap.servers": bootstrap_servers})


@pytest.fixture
def make_topic(admin: AdminClient) -> Iterator[Callable[..., str]]:
    """Create fresh, uniquely named topics for one test and delete them afterwards."""
    created: list[str] = []

    def make(prefix: str = "test", partitions: int = 1, config: dict[str, str] | None = None) -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:10]}"
        futures = admin.create_topics([NewTopic(name, partitions, 1, config=config or {})])
        futures[name].result(timeout=30)
        created.append(name)
        return name

    yield make
    if created:
        for future in admin.delete_topics(created).values():
            with contextlib.suppress(Exception):  # a topic already gone is fine at teardown
                future.result(timeout=30)
