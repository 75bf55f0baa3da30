"""Helpers of the stream worker tests: publish, run the worker as a subprocess, read results back."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Message, Producer, TopicPartition
from deltalake import DeltaTable

from producers.fleet import SyntheticFleet

REPO = Path(__file__).resolve().parents[1]
BIG = {"message.max.bytes": 67_108_864}
SOAK = os.environ.get("ROLLSTREAM_SOAK") == "1"
"""Larger counts for soak runs (`ROLLSTREAM_SOAK=1`); the default counts fit the test command's budget."""


@pytest.fixture(name="group_name")
def group_name_fixture(admin) -> Iterator[Callable[[str], str]]:
    """Unique consumer group names for one test, deleted from the broker afterwards."""
    made: list[str] = []

    def make(prefix: str) -> str:
        made.append(f"{prefix}-{uuid.uuid4().hex[:8]}")
        return made[-1]

    yield make
    for future in admin.delete_consumer_groups(made).values() if made else ():
        with contextlib.suppress(Exception):  # a group that never committed does not exist
            future.result(timeout=30)


def publish(
    bootstrap_servers: str,
    topic: str,
    messages: list[tuple[bytes | None, bytes]],
    config: Mapping[str, Any] | None = None,
) -> dict[tuple[int, int], bytes]:
    """Publish and return {(partition, offset): value} from the delivery reports."""
    producer = Producer(
        {"bootstrap.servers": bootstrap_servers, "enable.idempotence": True, "acks": "all", **(config or {})}
    )
    delivered: dict[tuple[int, int], bytes] = {}
    errors: list[str] = []

    def on_delivery(err, msg) -> None:
        if err is not None:
            errors.append(str(err))
        else:
            delivered[(msg.partition(), msg.offset())] = msg.value()

    for key, value in messages:
        producer.produce(topic, value=value, key=key, on_delivery=on_delivery)
        producer.poll(0)
    assert producer.flush(30) == 0
    assert not errors
    assert len(delivered) == len(messages)
    return delivered


def start_worker(
    bootstrap_servers: str,
    lake: Path | str,
    raw: str,
    dlq: str,
    app_id: str,
    group: str,
    log: Path,
    *,
    ultra: str | None = None,
    write_retries: int | None = None,
    extra: list[str] | None = None,
    env: Mapping[str, str] | None = None,
) -> subprocess.Popen:
    """`rollstream process` as a subprocess; its state (Faust's data dir) lands beside the log."""
    args = [
        sys.executable, "-m", "infra.cli", "process", "--app-id", app_id, "--group-id", group,
        "--batch-size", "250", "--batch-within", "0.5", "--loglevel", "info",
    ]  # fmt: skip
    if ultra is None:
        args.append("--no-ultra")
    if write_retries is not None:
        args += ["--write-retries", str(write_retries)]
    args += extra or []
    variables = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        "ROLLSTREAM_KAFKA__BOOTSTRAP_SERVERS": bootstrap_servers,
        "ROLLSTREAM_STATE_DIR": str(log.parent),
        "ROLLSTREAM_LAKE_URI": str(lake),
        "ROLLSTREAM_KAFKA__RAW_TOPIC": raw,
        "ROLLSTREAM_KAFKA__DLQ_TOPIC": dlq,
        **({"ROLLSTREAM_KAFKA__ULTRA_TOPIC": ultra} if ultra is not None else {}),
        **(env or {}),
    }
    return subprocess.Popen(
        args, cwd=log.parent, env=variables, stdout=log.open("w"), stderr=subprocess.STDOUT
    )


def wait_for_exit(proc: subprocess.Popen, log: Path, timeout: float) -> tuple[int, str]:
    """Wait for a worker that should stop by itself; returns its exit code and log."""
    try:
        code = proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    return code, log.read_text()


def stop_worker(proc: subprocess.Popen, log: Path) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)
        raise AssertionError(f"worker ignored SIGTERM for 60 s; log:\n{log.read_text()[-3000:]}") from None


def non_code_records(seed: int, trajectories: int) -> list[dict[str, Any]]:
    """Whole groups of 4 of the fleet's math, extraction and precomputed trajectories (no sandbox
    runs), drawn from `trajectories` fleet records."""
    records = [
        r
        for r in SyntheticFleet(seed=seed, group_size=4).trajectories(trajectories)
        if r["task_type"] in ("math", "extraction", "precomputed")
    ]
    return records[: len(records) - len(records) % 4]


def table_rows(uri: Path) -> int:
    if not DeltaTable.is_deltatable(str(uri)):
        return 0
    return pl.scan_delta(str(uri)).select(pl.len()).collect().item()


def wait_for(predicate, timeout_s: float, proc: subprocess.Popen, log: Path, what: str) -> float:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return time.monotonic()
        if proc.poll() is not None:
            raise AssertionError(
                f"worker exited with {proc.returncode} before {what}; log:\n{log.read_text()[-4000:]}"
            )
        time.sleep(0.25)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}; log:\n{log.read_text()[-4000:]}")


def committed_offsets(bootstrap_servers: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    """The group's committed offset per partition of `topic` (negative: none committed)."""
    probe = Consumer({"bootstrap.servers": bootstrap_servers, "group.id": group, "enable.auto.commit": False})
    try:
        committed = probe.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=10)
        return {tp.partition: tp.offset for tp in committed}
    finally:
        probe.close()


def group_caught_up(bootstrap_servers: str, group: str, topic: str, partitions: int) -> bool:
    """True when `group` has committed the end offset of every partition of `topic`."""
    probe = Consumer(
        {"bootstrap.servers": bootstrap_servers, "group.id": "probe", "enable.auto.commit": False}
    )
    try:
        for partition, offset in committed_offsets(bootstrap_servers, group, topic, partitions).items():
            _, high = probe.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
            if offset < high:
                return False
        return True
    finally:
        probe.close()


def read_topic(bootstrap_servers: str, topic: str, expected: int, timeout_s: float = 30.0) -> list[Message]:
    """Every message of partition 0, waiting for `expected` and then 2 s more for any extra."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap_servers, "group.id": "reader", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])  # no group membership, nothing to clean up
    out: list[Message] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(out) < expected and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                out.append(msg)
        end = time.monotonic() + 2.0
        while time.monotonic() < end:
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                out.append(msg)
    finally:
        consumer.close()
    return out
