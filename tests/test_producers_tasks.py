"""The task queue on a real share group: leases, lock expiry, attempts, dead letters, priorities, status.

Every broker test gets fresh task topics and a fresh share group whose lock is LOCK_MS (short, so
a dead worker's tasks come back within the test) and whose heartbeat is 1 s (members join fast).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from infra.broker import render_properties
from infra.exceptions import SettingsError
from infra.settings import Settings
from infra.topics import ShareGroupSpec, load_topics, provision_share_group
from producers.tasks import (
    Lease,
    LeaseExpiredError,
    PriorityScheduler,
    TaskDeadLetter,
    TaskQueue,
    TaskQueueError,
    TaskSubmitter,
    TaskTopics,
    read_status,
)
from schemas.packing import pack_int32
from schemas.task import Task, TaskCodec, TaskError

ROOT = Path(__file__).resolve().parents[1]
LOCK_MS = 4_000
DEADLINE_MS = 1_000


def _row(task_id: str, priority: int | str = 0, **changes: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "task_id": task_id,
        "prompt_tokens": [11, 12, 13],
        "domain": "math/algebra-001",
        "task_type": "math",
        "expected_answer": "2",
        "group_size": 4,
        "max_tokens": 32,
        "priority": priority,
        "deadline_ms": DEADLINE_MS,
    }
    row.update(changes)
    return row


class TaskEnv:
    """Fresh task topics named like infra/topics.toml's, a provisioned share group, and helpers."""

    def __init__(self, admin: AdminClient, bootstrap_servers: str, *, partitions: int = 1) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.prefix = f"test-tasks-{uuid.uuid4().hex[:10]}"
        self.topics = TaskTopics.named(
            self.prefix, dead_letters=f"{self.prefix}.dlq", outcomes=f"{self.prefix}.out"
        )
        self.group = self.prefix
        self.names = [*self.topics.classes.values(), self.topics.dead_letters, self.topics.outcomes]
        task_topics = set(self.topics.classes.values())
        futures = admin.create_topics(
            [NewTopic(name, partitions if name in task_topics else 1, 1) for name in self.names]
        )
        for future in futures.values():
            future.result(timeout=30)
        config = {
            "share.auto.offset.reset": "earliest",
            "share.record.lock.duration.ms": str(LOCK_MS),
            "share.delivery.count.limit": "5",
            "share.heartbeat.interval.ms": "1000",
        }
        provision_share_group(admin, ShareGroupSpec(self.group, config))
        self.queues: list[TaskQueue] = []

    def submit(self, rows: list[Any]) -> Any:
        with TaskSubmitter(
            bootstrap_servers=self.bootstrap_servers,
            topics=self.topics,
            lock_ms=LOCK_MS,
            default_deadline_ms=DEADLINE_MS,
        ) as submitter:
            return submitter.submit(rows)

    def queue(self, **options: Any) -> TaskQueue:
        queue = TaskQueue(
            bootstrap_servers=self.bootstrap_servers, topics=self.topics, group=self.group, **options
        )
        self.queues.append(queue)
        return queue

    def take_all(
        self, queue: TaskQueue, count: int, *, max_tasks: int = 1, within: float = 30.0, done: bool = False
    ) -> list[Lease]:
        leases: list[Lease] = []
        end = time.monotonic() + within
        while len(leases) < count and time.monotonic() < end:
            taken = queue.take(max_tasks, timeout=1.0)
            for lease in taken if done else ():
                assert lease.attempt == 1 and lease.expires_in() > 0
                lease.done()
            leases += taken
        assert len(leases) == count, f"took {len(leases)} of {count} within {within} s"
        return leases

    def status(self) -> dict[str, Any]:
        result = read_status(bootstrap_servers=self.bootstrap_servers, topics=self.topics, lock_ms=LOCK_MS)
        return {name: vars(counts) for name, counts in result.classes.items()}

    def dead_letters(self, expected: int) -> list[TaskDeadLetter]:
        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap_servers,
                "group.id": uuid.uuid4().hex,
                "enable.auto.commit": False,
            }
        )
        consumer.assign([TopicPartition(self.topics.dead_letters, 0, OFFSET_BEGINNING)])
        letters: list[TaskDeadLetter] = []
        end = time.monotonic() + 10
        while time.monotonic() < end and len(letters) <= expected:
            message = consumer.poll(0.5 if len(letters) < expected else 1.0)
            if message is None:
                if len(letters) >= expected:
                    break
                continue
            if message.error() is None:
                letters.append(TaskDeadLetter.from_message(message))
        consumer.close()
        return letters


@pytest.fixture(params=[1])
def env(request: pytest.FixtureRequest, admin: AdminClient, bootstrap_servers: str) -> Iterator[TaskEnv]:
    """Task topics of `request.param` partitions each (1 unless a test parametrizes it indirectly)."""
    tasks = TaskEnv(admin, bootstrap_servers, partitions=request.param)
    yield tasks
    for queue in tasks.queues:
        with contextlib.suppress(Exception):
            queue.close()
    for future in admin.delete_topics(tasks.names).values():
        with contextlib.suppress(Exception):
            future.result(timeout=30)


# Without a broker: the contract, the scheduler, the declarations.


def test_task_fields_are_checked_and_round_trip() -> None:
    codec = TaskCodec()
    text = Task(
        task_id="t-text",
        prompt_text="What is 1 + 1?",
        tokenizer="arithmetic-char-v1",
        domain="code/fizzbuzz-000",
        task_type="code",
        unit_tests="assert True",
        group_size=8,
        max_tokens=64,
        top_k=20,
        seed=7,
        priority=1,
        deadline_ms=60_000,
        created_at=datetime(2026, 12, 1, 12, 0, 0, 123456, tzinfo=UTC),
        metadata={"source": "test"},
    )
    decoded = codec.decode(codec.encode(text))
    assert decoded == text and decoded.created_at.microsecond == 123000
    tokens = Task.from_dict(
        {**text.as_dict(), "prompt_text": None, "tokenizer": None, "prompt_tokens": pack_int32([5, 6])}
    )
    assert codec.decode(codec.encode(tokens)).prompt_ids.tolist() == [5, 6]
    bad = {
        "prompt_text": (None, "give exactly one prompt"),
        "top_p": (0.0, r"top_p = 0.0; give a number in \(0, 1\]"),
        "top_k": (0, "top_k = 0; give a positive k, or null"),
        "priority": (2, r"priority = 2; give one of 0 \(low\), 1 \(high\)"),
        "group_size": (0, "group_size = 0"),
        "unit_tests": (None, "task_type 'code' is verified against unit_tests, which is missing"),
        "temperature": (float("nan"), "temperature = nan"),
    }
    for name, (value, message) in bad.items():
        with pytest.raises(TaskError, match=message):
            Task.from_dict({**text.as_dict(), name: value})
    with pytest.raises(TaskError, match=r"unknown field\(s\) \['colour'\]"):
        Task.from_dict({**text.as_dict(), "colour": "red"})


def test_the_scheduler_serves_high_first_and_low_once_in_y() -> None:
    scheduler = PriorityScheduler([0, 1], low_every=3)
    served = []
    for _ in range(9):  # both classes always have tasks
        priority = scheduler.order()[0]
        scheduler.started(priority)
        served.append(priority)
    assert served == [1, 1, 0] * 3
    scheduler.started(1)
    scheduler.started(1)
    assert scheduler.order() == [0, 1]
    scheduler.started(1)  # low had none: high was served, low stays first
    assert scheduler.order() == [0, 1]


def test_settings_declare_the_task_topics_group_and_broker_limits() -> None:
    settings = Settings.load(
        tasks_topic="q",
        task_lock_ms=120_000,
        task_deadline_ms=60_000,
        task_delivery_limit=6,
        task_max_attempts=4,
    )
    specs = {spec.role: spec for spec in load_topics(settings)}
    assert {specs[r].name for r in ("tasks_high", "tasks_low", "task_dlq", "task_outcomes")} == {
        "q.high",
        "q.low",
        "rollouts.tasks.dlq",
        "rollouts.tasks.outcomes",
    }
    group = specs["tasks_high"].share_group
    assert group is not None and group == specs["tasks_low"].share_group and specs["raw"].share_group is None
    assert group.name == "rollouts.tasks"
    assert dict(group.config) == {
        "share.auto.offset.reset": "earliest",
        "share.record.lock.duration.ms": "120000",
        "share.delivery.count.limit": "6",
    }
    properties = render_properties(settings, specs.values())
    assert "group.share.record.lock.duration.ms=120000\n" in properties
    assert "group.share.delivery.count.limit=6\n" in properties
    assert "group.share.max.record.lock.duration.ms=3600000\n" in properties
    with pytest.raises(
        SettingsError, match="task_max_attempts = 5 must be at least 1 and below task_delivery_limit = 5"
    ):
        Settings.load(task_max_attempts=5)
    with pytest.raises(
        SettingsError, match="task_deadline_ms = 700000 must be at least 1 and at most task_lock_ms"
    ):
        Settings.load(task_lock_ms=600_000, task_deadline_ms=700_000)


# Against the broker.


@pytest.mark.timeout(90)
def test_tasks_are_taken_once_acknowledged_and_counted(env: TaskEnv) -> None:
    rows = [_row(f"t{i:02d}", priority=i % 2) for i in range(20)]
    rows += [
        _row("long", deadline_ms=LOCK_MS + 1),
        _row("no-answer", expected_answer=None),
        _row("t00"),
        {**_row("text"), "prompt_tokens": None, "prompt_text": "1 + 1 =", "tokenizer": "char"},
    ]
    report = env.submit(rows)
    assert report.submitted == {"low": 11, "high": 10}
    reasons = {refusal.task_id: refusal.reason for refusal in report.refused}
    assert set(reasons) == {"long", "no-answer", "t00"}
    assert "outlasts the share group's lock of 4000 ms" in reasons["long"]
    assert "appears twice" in reasons["t00"]
    queue = env.queue(slots=4, worker_id="w-test")

    first = env.take_all(queue, 4, max_tasks=4)
    counts = env.status()
    assert counts["high"]["in_flight"] + counts["low"]["in_flight"] == 4
    assert counts["high"]["pending"] + counts["low"]["pending"] == 17
    for lease in first:
        lease.done()
    rest = env.take_all(queue, 17, max_tasks=4, done=True)

    taken = [lease.task_id for lease in first + rest]
    assert sorted(taken) == sorted([f"t{i:02d}" for i in range(20)] + ["text"])
    assert next(lease for lease in rest + first if lease.task_id == "text").task.prompt_text == "1 + 1 ="
    with pytest.raises(TaskQueueError, match="already settled"):
        first[0].done()
    assert queue.take(4, timeout=1.5) == []
    assert queue.stats.records == 21  # one task per record batch: a poll leased only what was started
    expected = {
        "submitted": 10,
        "pending": 0,
        "in_flight": 0,
        "done": 10,
        "dead": 0,
        "retries": 0,
        "requeued": 0,
    }
    assert env.status() == {
        "high": {"priority": "high", **expected},
        "low": {"priority": "low", **expected, "submitted": 11, "done": 11},
    }


@pytest.mark.timeout(120)
@pytest.mark.parametrize("env", [4], indirect=True)
def test_a_queue_of_several_slots_serves_tasks_on_every_partition(env: TaskEnv) -> None:
    rows = [_row(f"p{i:02d}", priority=i % 2) for i in range(48)]
    env.submit(rows)
    queue = env.queue(slots=4)
    done: list[str] = []
    partitions: set[tuple[str, int]] = set()
    end = time.monotonic() + 60
    while len(done) < len(rows) and time.monotonic() < end:
        taken = queue.take(4, timeout=1.0)
        for lease in taken:  # settled at once: open leases stay below the slots
            assert lease.attempt == 1
            lease.done()
            done.append(lease.task_id)
            partitions.add(lease.coordinates[:2])
    assert sorted(done) == sorted(row["task_id"] for row in rows), f"{len(done)} of {len(rows)} taken"
    assert len(partitions) == 8  # 4 partitions of each class held tasks, and each was served
    assert queue.stats.stale == 0 and queue.stats.dead == 0
    counts = env.status()
    assert (counts["high"]["done"], counts["low"]["done"]) == (24, 24)
    assert counts["high"]["pending"] + counts["low"]["pending"] == 0


@pytest.mark.timeout(90)
def test_a_killed_worker_gives_its_tasks_back_after_the_lock(env: TaskEnv) -> None:
    env.submit([_row("k0"), _row("k1")])
    script = textwrap.dedent(
        f"""
        import os, signal, sys, time
        from producers.tasks import TaskQueue, TaskTopics
        topics = TaskTopics({dict(env.topics.classes)!r}, {env.topics.dead_letters!r}, {env.topics.outcomes!r})
        queue = TaskQueue(bootstrap_servers={env.bootstrap_servers!r}, topics=topics, group={env.group!r}, slots=2)
        leases = []
        while len(leases) < 2:
            leases += queue.take(2, timeout=1.0)
        print(" ".join(f"{{l.task_id}}:{{l.attempt}}" for l in leases), flush=True)
        time.sleep(60)
        """
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert child.stdout is not None
        line = child.stdout.readline().split()
        assert sorted(line) == ["k0:1", "k1:1"]
        child.send_signal(signal.SIGKILL)
    finally:
        child.kill()
        child.wait(30)
    assert env.status()["low"]["in_flight"] == 2

    queue = env.queue(slots=2)
    again = env.take_all(queue, 2, max_tasks=2)
    taken_at = time.monotonic()  # after the broker locked them
    assert sorted((lease.task_id, lease.attempt) for lease in again) == [("k0", 2), ("k1", 2)]
    late = next(lease for lease in again if lease.task_id == "k1")
    next(lease for lease in again if lease.task_id == "k0").done()
    assert late.expires_in() <= LOCK_MS / 1000
    time.sleep(taken_at + LOCK_MS / 1000 + 1.0 - time.monotonic())
    with pytest.raises(LeaseExpiredError, match="its lock of 4 s ran out first"):
        late.done()
    (third,) = env.take_all(queue, 1)
    assert (third.task_id, third.attempt) == ("k1", 3)
    third.done()
    assert env.status()["low"]["done"] == 2


@pytest.mark.timeout(90)
def test_a_task_that_always_fails_becomes_one_dead_letter_after_n_attempts(env: TaskEnv) -> None:
    env.submit([_row("doomed", priority="high")])
    queue = env.queue(max_attempts=3)
    outcomes = []
    for _ in range(3):
        (lease,) = env.take_all(queue, 1)
        outcomes.append((lease.attempt, lease.fail(f"generation failed on attempt {lease.attempt}")))
    assert outcomes == [(1, "released"), (2, "released"), (3, "dead")]
    assert queue.take(1, timeout=1.5) == []

    (letter,) = env.dead_letters(1)
    assert (letter.reason, letter.attempts, letter.task_id) == ("failed", 3, "doomed")
    assert letter.error == "generation failed on attempt 3"
    assert TaskCodec().decode(letter.value).task_id == "doomed"
    counts = env.status()["high"]
    assert (counts["dead"], counts["retries"], counts["pending"], counts["done"]) == (1, 2, 0, 0)


@pytest.mark.timeout(90)
def test_undecodable_task_bytes_become_a_dead_letter_not_a_stuck_worker(env: TaskEnv) -> None:
    producer = Producer({"bootstrap.servers": env.bootstrap_servers})
    producer.produce(env.topics.classes[0], b"\xc3\x01 not a task", key=b"junk")
    producer.flush(10)
    env.submit([_row("fine")])
    queue = env.queue()
    (lease,) = env.take_all(queue, 1)
    assert lease.task_id == "fine"
    lease.done()
    (letter,) = env.dead_letters(1)
    assert letter.reason == "malformed" and letter.value == b"\xc3\x01 not a task"
    assert "not an Avro single-object message" in letter.error or "fingerprint" in letter.error
    assert queue.stats.dead == 1
    assert env.status()["low"]["dead"] == 1


@pytest.mark.timeout(90)
def test_requeue_and_a_clean_close_use_no_attempt(env: TaskEnv) -> None:
    env.submit([_row("again")])
    queue = env.queue(max_attempts=2)
    for _ in range(3):
        (lease,) = env.take_all(queue, 1)
        assert lease.attempt == 1
        lease.requeue()
    (lease,) = env.take_all(queue, 1)
    assert lease.fail("one real failure") == "released"
    (lease,) = env.take_all(queue, 1)
    assert lease.attempt == 2
    queue.close()  # a clean stop with the lease open: requeued, still attempt 2
    with pytest.raises(TaskQueueError, match="closed"):
        queue.take()

    second = env.queue(max_attempts=2)
    (lease,) = env.take_all(second, 1)
    assert (lease.task_id, lease.attempt) == ("again", 2)
    assert lease.fail("second real failure") == "dead"
    counts = env.status()["low"]
    assert (counts["submitted"], counts["requeued"], counts["retries"], counts["dead"]) == (1, 4, 1, 1)


@pytest.mark.timeout(90)
def test_high_priority_first_and_low_once_in_y_on_a_backlog(env: TaskEnv) -> None:
    queue = env.queue(low_every=3)
    env.submit([_row("probe-high", priority=1), _row("probe-low", priority=0)])
    env.take_all(queue, 2, done=True)  # both classes' consumers have joined the group
    env.submit([_row(f"h{i}", priority=1) for i in range(9)] + [_row(f"l{i}", priority=0) for i in range(6)])

    order = "".join("H" if lease.priority == 1 else "L" for lease in env.take_all(queue, 15, done=True))
    backlog, tail = order[: order.rindex("H") + 1], order[order.rindex("H") + 1 :]
    assert "LL" not in backlog and "HHH" not in backlog, order  # high first; low 1 in 3 while both wait
    assert order.count("H") == 9 and set(tail) <= {"L"}, order


@pytest.mark.timeout(90)
def test_cli_submits_jsonl_and_parquet_and_reports_status(
    env: TaskEnv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from infra.cli import main

    for name, value in {
        "ROLLSTREAM_KAFKA__BOOTSTRAP_SERVERS": env.bootstrap_servers,
        "ROLLSTREAM_ROLLOUT__TASKS_TOPIC": env.prefix,
        "ROLLSTREAM_ROLLOUT__TASK_DLQ_TOPIC": env.topics.dead_letters,
        "ROLLSTREAM_ROLLOUT__TASK_OUTCOMES_TOPIC": env.topics.outcomes,
        "ROLLSTREAM_ROLLOUT__TASK_GROUP": env.group,
        "ROLLSTREAM_ROLLOUT__TASK_DEADLINE_MS": str(DEADLINE_MS),
        "ROLLSTREAM_STATE_DIR": str(tmp_path / "state"),
    }.items():
        monkeypatch.setenv(name, value)
    jsonl = tmp_path / "tasks.jsonl"
    jsonl.write_text("\n".join([json.dumps(_row("j0", "high")), "{not json", json.dumps(_row("j1"))]) + "\n")
    parquet = tmp_path / "tasks.parquet"
    pl.DataFrame([_row(f"p{i}") for i in range(3)]).write_parquet(parquet)

    assert main(["tasks", "submit", str(jsonl)]) == 1
    out = capsys.readouterr().out
    assert "submitted 2 (1 low, 1 high); refused 1" in out and "refused line 2: not JSON" in out
    assert main(["tasks", "submit", str(parquet), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["by_priority"] == {"low": 3, "high": 0}
    assert main(["tasks", "status", "--json"]) == 0
    classes = json.loads(capsys.readouterr().out)["classes"]
    assert (classes["low"]["pending"], classes["high"]["pending"]) == (4, 1)
    assert main(["tasks", "submit", str(tmp_path / "missing.jsonl")]) == 2
