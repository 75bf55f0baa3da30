"""Helpers of the rollout worker tests: fresh task topics and share group, `rollstream serve` and
`rollstream rollout` subprocesses, an in-process worker, and reading back what was published."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from infra.topics import ShareGroupSpec, provision_share_group
from producers.aio import AsyncPublisher
from producers.backends import GenerationBackend, HttpBackend, HttpOptions
from producers.rollout import Environment, RolloutOptions, RolloutStats, RolloutWorker, VersionSource
from producers.tasks import TaskDeadLetter, TaskQueue, TaskSubmitter, TaskTopics
from schemas import TrajectoryCodec

ROOT = Path(__file__).resolve().parents[1]
PYTHONPATH = os.pathsep.join([str(ROOT), str(ROOT / "tests")])
VOCAB = 27  # backend_support.CharTokenizer: ids 1..26 letters, 0 eos
MAX_LENGTH = 512  # backend_support.CausalMeanPolicy.max_length
LOCK_MS = 5_000
DEADLINE_MS = 3_000
START_TIMEOUT_S = 90
DOMAIN = "math/arithmetic-000"


def task_row(task_id: str, prompt: Sequence[int], **changes: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "task_id": task_id,
        "prompt_tokens": list(prompt),
        "domain": DOMAIN,
        "task_type": "math",
        "expected_answer": "7",
        "group_size": 2,
        "max_tokens": 3,
        "deadline_ms": DEADLINE_MS,
    }
    row.update(changes)
    return row


def prompt_of(test: int, i: int) -> list[int]:
    """A prompt unique to (test, i) in the shared server's log: letters only (ids 1..26)."""
    return [test, 1 + i % 26, 1 + (i // 26) % 26, 5]


class RolloutEnv:
    """Fresh task topics, raw and dead-letter topics, and a share group with a `lock_ms` lock."""

    def __init__(
        self,
        admin: AdminClient,
        bootstrap_servers: str,
        *,
        raw_partitions: int = 2,
        task_partitions: int = 1,
        lock_ms: int = LOCK_MS,
    ) -> None:
        self.admin = admin
        self.bootstrap_servers = bootstrap_servers
        self.prefix = f"test-rollout-{uuid.uuid4().hex[:10]}"
        self.topics = TaskTopics.named(
            self.prefix, dead_letters=f"{self.prefix}.dlq", outcomes=f"{self.prefix}.out"
        )
        self.group = self.prefix
        self.raw, self.ultra, self.dlq = f"{self.prefix}.raw", f"{self.prefix}.ultra", f"{self.prefix}.rawdlq"
        self.raw_partitions = raw_partitions
        self.lock_ms = lock_ms
        self.names = [*self.topics.classes.values(), self.topics.dead_letters, self.topics.outcomes]
        self.names += [self.raw, self.ultra, self.dlq]
        partitions = {self.raw: raw_partitions} | dict.fromkeys(self.topics.classes.values(), task_partitions)
        new = [NewTopic(name, partitions.get(name, 1), 1) for name in self.names]
        for future in admin.create_topics(new).values():
            future.result(timeout=30)
        config = {
            "share.auto.offset.reset": "earliest",
            "share.record.lock.duration.ms": str(lock_ms),
            "share.delivery.count.limit": "5",
            "share.heartbeat.interval.ms": "1000",
        }
        provision_share_group(admin, ShareGroupSpec(self.group, config))
        self.queues: list[TaskQueue] = []

    def submit(self, rows: list[dict[str, Any]]) -> Any:
        with TaskSubmitter(
            bootstrap_servers=self.bootstrap_servers,
            topics=self.topics,
            lock_ms=self.lock_ms,
            default_deadline_ms=DEADLINE_MS,
        ) as submitter:
            report = submitter.submit(rows)
        assert not report.refused, report.refused
        return report

    def queue(self, **options: Any) -> TaskQueue:
        queue = TaskQueue(
            bootstrap_servers=self.bootstrap_servers, topics=self.topics, group=self.group, **options
        )
        self.queues.append(queue)
        return queue

    def settings_env(self, state_dir: Path) -> dict[str, str]:
        """The environment a `rollstream` subprocess needs to work on these topics."""
        return {
            **os.environ,
            "PYTHONPATH": PYTHONPATH,
            "ROLLSTREAM_KAFKA__BOOTSTRAP_SERVERS": self.bootstrap_servers,
            "ROLLSTREAM_STATE_DIR": str(state_dir),
            "ROLLSTREAM_ROLLOUT__TASKS_TOPIC": self.prefix,
            "ROLLSTREAM_ROLLOUT__TASK_DLQ_TOPIC": self.topics.dead_letters,
            "ROLLSTREAM_ROLLOUT__TASK_OUTCOMES_TOPIC": self.topics.outcomes,
            "ROLLSTREAM_ROLLOUT__TASK_GROUP": self.group,
            "ROLLSTREAM_ROLLOUT__TASK_DEADLINE_MS": str(DEADLINE_MS),
            "ROLLSTREAM_KAFKA__RAW_TOPIC": self.raw,
            "ROLLSTREAM_KAFKA__ULTRA_TOPIC": self.ultra,
            "ROLLSTREAM_KAFKA__DLQ_TOPIC": self.dlq,
        }

    def samples(self, expected: int, timeout_s: float = 30.0) -> list[dict[str, Any]]:
        """Every trajectory on the raw topic (decoded, with its partition), waiting for `expected`."""
        out: list[dict[str, Any]] = []
        for message in read_all(self.bootstrap_servers, self.raw, self.raw_partitions, expected, timeout_s):
            record = dict(CODEC.decode(message.value()))
            record["_partition"] = message.partition()
            out.append(record)
        return out

    def dead_letters(self, expected: int) -> list[TaskDeadLetter]:
        messages = read_all(self.bootstrap_servers, self.topics.dead_letters, 1, expected, 15.0)
        return [TaskDeadLetter.from_message(m) for m in messages]

    def outcomes(self, task_id: str) -> list[dict[str, Any]]:
        """The outcome log's events of one task, for failure messages."""
        messages = read_all(self.bootstrap_servers, self.topics.outcomes, 1, 10**6, 2.0)
        events = [json.loads(m.value()) for m in messages]
        return [e for e in events if e.get("task_id") == task_id]

    def close(self) -> None:
        for queue in self.queues:
            with contextlib.suppress(Exception):
                queue.close()
        for future in self.admin.delete_topics(self.names).values():
            with contextlib.suppress(Exception):
                future.result(timeout=30)


CODEC = TrajectoryCodec()


def read_all(
    bootstrap_servers: str, topic: str, partitions: int, expected: int, timeout_s: float
) -> list[Any]:
    """Every message of `topic`, waiting up to `timeout_s` for `expected`, then 1 s more for extras."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap_servers, "group.id": "reader", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    out: list[Any] = []
    try:
        deadline = time.monotonic() + timeout_s
        while len(out) < expected and time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                out.append(message)
        grace = time.monotonic() + 1.0
        while time.monotonic() < grace:
            message = consumer.poll(0.1)
            if message is not None and message.error() is None:
                out.append(message)
    finally:
        consumer.close()
    return out


@dataclass
class Served:
    """A `rollstream serve` subprocess of the stand-in policy, and its response log."""

    url: str
    log: Path
    process: subprocess.Popen[str]
    state_dir: Path | None = None

    def requests(self) -> dict[tuple[int, ...], list[list[dict[str, Any]]]]:
        """The logged answers by prompt: each request's samples in index order."""
        by_request: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for line in self.log.read_text().splitlines():
            entry = json.loads(line)
            by_request[entry["request_id"]].append(entry)
        out: dict[tuple[int, ...], list[list[dict[str, Any]]]] = defaultdict(list)
        for lines in by_request.values():
            lines.sort(key=lambda entry: entry["index"])
            out[tuple(lines[0]["prompt_ids"])].append(lines)
        return out


def start_server(tmp: Path) -> Served:
    log = tmp / "responses.jsonl"
    command = [sys.executable, "-m", "infra.cli", "serve", "--policy", "backend_support:causal_policy"]
    command += ["--vocab-size", str(VOCAB), "--port", "0", "--tokenizer", "backend_support:CharTokenizer"]
    command += ["--response-log", str(log)]
    state_dir = tmp / "state"  # its own: where it registers its /metrics
    process = subprocess.Popen(
        command,
        cwd=tmp,
        env={**os.environ, "PYTHONPATH": PYTHONPATH, "ROLLSTREAM_STATE_DIR": str(state_dir)},
        stdout=subprocess.PIPE,
        stderr=(tmp / "serve.err").open("w"),
        text=True,
    )
    line = read_line(process, START_TIMEOUT_S)
    if not line.startswith("listening on "):
        stop_process(process, signal.SIGKILL)
        raise AssertionError(
            f"rollstream serve did not start: {line!r}; {(tmp / 'serve.err').read_text()[-2000:]}"
        )
    return Served(line.split()[-1], log, process, state_dir)


def read_line(process: subprocess.Popen[str], timeout_s: float) -> str:
    """The next line of the process's stdout, or '' when none came within `timeout_s`."""
    found: list[str] = []
    reader = threading.Thread(
        target=lambda: found.append(process.stdout.readline() if process.stdout else "")
    )
    reader.daemon = True
    reader.start()
    reader.join(timeout_s)
    return found[0].strip() if found else ""


def stop_process(process: subprocess.Popen[str], sig: int = signal.SIGTERM, timeout_s: float = 60.0) -> int:
    """Send `sig` to the process by its pid and wait; SIGKILL it if it does not exit in time."""
    if process.poll() is None:
        os.kill(process.pid, sig)
    try:
        return process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        os.kill(process.pid, signal.SIGKILL)
        process.wait(30)
        raise AssertionError(f"pid {process.pid} ignored signal {sig} for {timeout_s} s") from None


def start_rollout(env: RolloutEnv, url: str, state_dir: Path, *args: str) -> subprocess.Popen[str]:
    """`rollstream rollout` as a subprocess on the env's topics; stderr goes to rollout-<n>.err."""
    state_dir.mkdir(parents=True, exist_ok=True)
    err = state_dir / f"rollout-{uuid.uuid4().hex[:6]}.err"
    command = [sys.executable, "-m", "infra.cli", "rollout", "--backend", url, *args]
    return subprocess.Popen(
        command,
        cwd=state_dir,
        env=env.settings_env(state_dir),
        stdout=subprocess.PIPE,
        stderr=err.open("w"),
        text=True,
    )


def run_worker(
    env: RolloutEnv,
    backend: GenerationBackend | str,
    *,
    within_s: float,
    until: Callable[[RolloutStats], bool] = lambda _: False,
    max_tasks: int | None = None,
    environment: Environment | None = None,
    versions: VersionSource | None = None,
    queue_options: dict[str, Any] | None = None,
    on_running: Callable[[RolloutWorker], None] | None = None,
    **options: Any,
) -> RolloutStats:
    """An in-process `RolloutWorker` on the env's topics until `until(stats)`, `max_tasks` or `within_s`."""
    options.setdefault("worker_id", "w-test")
    concurrency = options.setdefault("concurrency", 1)
    queue = env.queue(slots=concurrency, worker_id=options["worker_id"], **(queue_options or {}))

    async def main() -> RolloutStats:
        engine = (
            HttpBackend(backend, HttpOptions(attempts=2, backoff_s=0.05))
            if isinstance(backend, str)
            else backend
        )
        publisher = AsyncPublisher(
            bootstrap_servers=env.bootstrap_servers, topic=env.raw, ultra_topic=env.ultra
        )
        worker = RolloutWorker(
            queue, engine, publisher, RolloutOptions(**options), versions=versions, environment=environment
        )
        stop = asyncio.Event()

        async def watch() -> None:
            end = time.monotonic() + within_s
            while not (stop.is_set() or until(worker.stats)) and time.monotonic() < end:
                if on_running is not None:
                    on_running(worker)
                await asyncio.sleep(0.05)
            stop.set()

        watcher = asyncio.create_task(watch())
        try:
            return await worker.run(stop, max_tasks=max_tasks)
        finally:
            stop.set()
            await watcher
            await publisher.close()
            if isinstance(backend, str):
                await engine.close()

    try:
        return asyncio.run(main())
    finally:
        queue.close()
