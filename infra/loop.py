"""`rollstream demo --loop`: generation, scoring, buffering, learning, new weights, generation again.

On one machine: the broker (`rollstream up`), `rollstream serve --follow` (a torch policy over
HTTP that loads each version the learner publishes), a rollout worker (tasks from the share
group, groups through the server, samples to rollouts.raw, acked after Kafka acked them),
`rollstream process` (the math verifier, GRPO advantages, Delta) and the learner (the replay
buffer with `max_lag`, the asynchronous loss, a version published every `publish_every` steps).

The task is addition modulo 5 over the digits 0-4 ("3+4" -> "2"), one answer token, judged by the
registry's math verifier: an untrained policy over the 7-token vocabulary answers right about
1 time in 7, and a small transformer learns it in a few minutes on the CPU. At each published
version every one of the 25 prompts is also answered greedily (the held-out evaluation; these
answers are never trained on), logged to MLflow beside the training reward.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from infra.exceptions import DemoError
from infra.processes import tail, terminate
from infra.settings import Settings

MODULUS = 5
LOOP_DOMAIN = "math/arithmetic-000"
POLICY = "transformer"
GROUP_SIZE = 8
Progress = Callable[[str], None]


def loop_tokenizer() -> Any:
    """The loop's vocabulary: the digits 0-4, '+' and eos (7 ids)."""
    from schemas.tokenizer import CharTokenizer

    return CharTokenizer([*"01234+", "<eos>"], eos="<eos>", name="mod5")


def prompts() -> list[tuple[str, str]]:
    """Every prompt of the task with its answer: ("3+4", "2")."""
    return [(f"{a}+{b}", str((a + b) % MODULUS)) for a in range(MODULUS) for b in range(MODULUS)]


@dataclass(frozen=True)
class LoopOptions:
    """How long and how hard the loop runs.

    Attributes:
        versions: stop submitting once the learner published this version.
        time_limit_s: stop submitting after this long, whatever the version.
        publish_every: optimizer steps between published versions.
        max_lag: the replay buffer's and the rollout worker's staleness limit, in versions.
        wave: tasks submitted at a time: one wave per published version, at most `max_lag`
            waves ahead of the learner.
        rows_per_step: rows in a batch (each prompt + answer is 4 tokens).
        samples_per_insert: rows sampled per row inserted (the learner waits for fresh rows).
        lr: the learner's learning rate.
        concurrency: groups the rollout worker generates at once.
        seed: seeds the initial weights and the draws.
        synchronous: the synchronous baseline (bench/loop.py): wave v is submitted once version
            v is published, the server generates with it and every earlier task settled; the
            learner samples only once all of the wave's groups are in the table, trains on them
            alone (its buffer's max_lag 0) and publishes v+1. Generation and training never overlap.
    """

    versions: int = 8
    time_limit_s: float = 300.0
    publish_every: int = 4
    max_lag: int = 2
    wave: int = 64
    rows_per_step: int = 256
    samples_per_insert: float = 2.0
    lr: float = 5e-3
    concurrency: int = 8
    seed: int = 0
    synchronous: bool = False


@dataclass
class VersionReward:
    """The training reward of the groups one version generated: per-group means, pooled."""

    version: int
    groups: int
    mean: float
    se: float


@dataclass
class LoopSummary:
    """What a loop run did; `accounted_for` says every task ended as a group or a dead letter."""

    submitted: int
    done: int
    dead: int
    groups_in_table: int
    complete_groups: int
    versions_published: int
    max_staleness_trained: int
    rewards: list[VersionReward]
    heldout: dict[int, float]
    run_id: str
    table_uri: str
    tracking_uri: str
    seconds: float
    logs: dict[str, str] = field(default_factory=dict)

    @property
    def accounted_for(self) -> bool:
        return self.done + self.dead == self.submitted and self.complete_groups == self.done

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["accounted_for"] = self.accounted_for
        return out


class _Children:
    """Child processes of the loop, each with a log; stopped by PID with SIGTERM."""

    def __init__(self, settings: Settings) -> None:
        self.env = {**__import__("os").environ, **settings.as_env()}
        self.logs = settings.state_dir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.running: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        with (self.logs / f"loop-{name}.log").open("ab") as log:
            child = subprocess.Popen(
                [sys.executable, "-m", "infra.cli", *argv], stdout=subprocess.PIPE, stderr=log, env=self.env
            )
        self.running[name] = child
        return child

    def check(self) -> None:
        for name, child in self.running.items():
            if child.poll() is not None:
                raise DemoError(
                    f"the loop's {name} exited with code {child.returncode}; its log ends with:\n"
                    f"{tail(self.logs / f'loop-{name}.log')}"
                )

    def stop(self) -> None:
        for child in self.running.values():
            if child.poll() is None:
                terminate(child.pid, timeout=30.0)
            child.wait()


def loop_settings(settings: Settings, run: str) -> Settings:
    """The settings of loop run `run`: its own lake and topics on the same broker and tracking store."""
    prefix = f"rollouts.loop-{run}"
    return settings.replace(
        lake_uri=str(settings.state_dir / "loop" / run / "lake"),
        raw_topic=f"{prefix}.raw",
        ultra_topic=f"{prefix}.ultra",
        dlq_topic=f"{prefix}.dlq",
        tasks_topic=f"{prefix}.tasks",
        task_dlq_topic=f"{prefix}.tasks.dlq",
        task_outcomes_topic=f"{prefix}.tasks.outcomes",
        task_group=f"{prefix}.tasks",
    )


def run_loop(
    settings: Settings, options: LoopOptions, *, progress: Progress, run: str | None = None
) -> LoopSummary:
    """Run the closed loop until `options.versions` (or the time limit), then drain and account.

    The run gets its own lake (``<state_dir>/loop/<run>/lake``) and topics (`loop_settings`).
    """
    import torch

    from consumers.policies import load_policy
    from consumers.weights import publish_version
    from infra import services

    started = time.monotonic()
    signal.signal(signal.SIGTERM, _interrupt)  # the children are stopped on the way out
    settings = loop_settings(settings, run or uuid.uuid4().hex[:8])
    services.up(settings, progress=progress)
    tokenizer = loop_tokenizer()
    token_file = settings.state_dir / "mod5-tokenizer.json"
    tokenizer.save(token_file)
    lake = settings.lake_uri
    torch.manual_seed(options.seed)
    initial = load_policy(POLICY, vocab_size=tokenizer.vocab_size)
    published = publish_version(
        {k: v.detach().contiguous() for k, v in initial.state_dict().items()},  # type: ignore[attr-defined]
        lake_uri=lake,
        number=0,
        step=0,
        storage_options=settings.delta_storage_options(),
    )
    progress(f"version 0 published ({published.path})")
    children = _Children(settings)
    try:
        server = children.start(
            "serve",
            [
                "serve",
                "--policy",
                POLICY,
                "--tokenizer",
                str(token_file),
                "--port",
                "0",
                "--follow",
                "--weights",
                published.path,
                "--sha256",
                published.sha256,
                "--version",
                "0",
            ],
        )
        url = _listening_url(server, children)
        children.start("process", ["process", "--group-wall-timeout", "30"])
        return _drive(settings, options, url, tokenizer, children, started, progress)
    finally:
        children.stop()


def _interrupt(_signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt


def _listening_url(server: subprocess.Popen[bytes], children: _Children) -> str:
    assert server.stdout is not None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = server.stdout.readline().decode()
        if line.startswith("listening on "):
            return line.split()[-1]
        children.check()
    raise DemoError("rollstream serve did not say where it listens within 120 s")


def _drive(
    settings: Settings,
    options: LoopOptions,
    url: str,
    tokenizer: Any,
    children: _Children,
    started: float,
    progress: Progress,
) -> LoopSummary:
    from consumers import learn
    from consumers.versioning import PublishOptions

    heldout: dict[int, float] = {}
    evaluate = _HeldoutEvaluator(tokenizer, settings.tracking_uri, heldout, progress)
    stop_learner = threading.Event()
    learned: dict[str, Any] = {}
    rollout = _Rollout(settings, options, url, tokenizer)
    gate = _SyncGate(settings, options, url, rollout, stop_learner, evaluate) if options.synchronous else None

    def learner() -> None:
        try:
            _wait_for_table(settings, stop_learner)
            learned["result"] = learn(
                table_uri=settings.lake_table_uri("trajectories"),
                storage_options=settings.delta_storage_options(),
                tracking_uri=settings.tracking_uri,
                experiment="rollstream-loop",
                steps=None,
                lr=options.lr,
                seed=options.seed,
                policy=POLICY,
                publish=PublishOptions(
                    lake_uri=settings.lake_uri,
                    every=options.publish_every,
                    storage_options=settings.delta_storage_options(),
                ),
                on_publish=evaluate if gate is None else gate,
                stop=stop_learner,
                follow=True,
                layout="packed",
                token_budget=4 * options.rows_per_step,
                max_length=8,
                vocab_size=tokenizer.vocab_size,
                profile_matched=False,
                max_lag=0 if options.synchronous else options.max_lag,
                samples_per_insert=options.samples_per_insert,
                min_size=options.wave * GROUP_SIZE if options.synchronous else options.rows_per_step,
                sample_timeout_s=5.0,
                poll_interval_s=0.2,
            )
        except BaseException as exc:  # reported by the driver
            learned["error"] = exc

    thread = threading.Thread(target=learner, name="loop-learner", daemon=True)
    thread.start()
    rollout.start()
    submitted = 0
    try:
        submitted = _feed(settings, options, rollout, learned, thread, children, started, progress, gate)
        _drain(settings, rollout, submitted, children, progress)
    finally:
        stop_learner.set()
        rollout.stop()
        thread.join(timeout=120)
    if "error" in learned:
        raise DemoError(f"the loop's learner failed: {learned['error']}") from learned["error"]
    result = learned["result"]
    return _summary(settings, options, rollout, submitted, result, heldout, started, children)


def _wait_for_table(settings: Settings, stop: threading.Event, timeout_s: float = 180.0) -> None:
    """Wait until `rollstream process` made the trajectories table (its first commit)."""
    from deltalake import DeltaTable

    uri, deadline = settings.lake_table_uri("trajectories"), time.monotonic() + timeout_s
    while not DeltaTable.is_deltatable(uri, storage_options=settings.delta_storage_options()):
        if stop.is_set() or time.monotonic() > deadline:
            raise DemoError(f"no trajectories table at {uri} within {timeout_s:.0f} s; see the process log")
        time.sleep(0.5)


def _feed(
    settings: Settings,
    options: LoopOptions,
    rollout: _Rollout,
    learned: dict[str, Any],
    thread: threading.Thread,
    children: _Children,
    started: float,
    progress: Progress,
    gate: _SyncGate | None = None,
) -> int:
    """Submit waves of tasks until the learner reaches the target version or the time runs out."""
    from consumers.weights import PolicyWatcher

    watcher = PolicyWatcher(settings.lake_uri, storage_options=settings.delta_storage_options())
    submitted, wave, last = 0, 0, -1
    while True:
        children.check()
        rollout.check()
        if "error" in learned or not thread.is_alive():
            raise DemoError(f"the loop's learner stopped: {learned.get('error', 'it returned early')}")
        latest = watcher.latest()
        version = -1 if latest is None else latest.number
        if version != last:
            progress(f"learner at version {version}; tasks done {rollout.settled()}/{submitted}")
            last = version
        if version >= options.versions or time.monotonic() - started > options.time_limit_s:
            return submitted
        # One wave a version, at most max_lag waves ahead of the learner: each version's weights
        # generate about a wave of groups, and no group waits for the learner longer than the
        # staleness limit allows.
        if gate is not None:
            if wave <= max(version, 0) and rollout.settled() == submitted and gate.serving(version):
                submitted += _submit(settings, options, wave)
                wave += 1
                gate.submitted = submitted
        elif wave <= max(version, 0) + options.max_lag - 1 and submitted - rollout.settled() < options.wave:
            submitted += _submit(settings, options, wave)
            wave += 1
        time.sleep(0.25)


class _SyncGate:
    """`LoopOptions.synchronous`: after publishing version v the learner waits here until wave v
    was submitted and all its groups are in the table (or the loop stops); the wait is logged as
    `sync_wait_s` at the publishing step."""

    def __init__(
        self,
        settings: Settings,
        options: LoopOptions,
        url: str,
        rollout: _Rollout,
        stop: threading.Event,
        then: Callable[[Any, Any], None],
    ) -> None:
        self.settings, self.wave, self.url = settings, options.wave, url
        self.rollout, self.stop, self.then = rollout, stop, then
        self.submitted = 0

    def serving(self, version: int) -> bool:
        """Whether the server generates with `version` (or newer) already."""
        import httpx

        return int(httpx.get(f"{self.url}/health", timeout=10).json()["weight_version"]) >= version

    def __call__(self, record: Any, policy: Any) -> None:
        import mlflow

        self.then(record, policy)
        waited = time.perf_counter()
        while not self.stop.is_set():
            submitted = self.submitted
            if submitted >= (record.number + 1) * self.wave and self._in_table(submitted):
                break
            time.sleep(0.05)
        if record.run_id:  # the learner idles here: its share of wall time waiting for rows
            mlflow.MlflowClient(self.settings.tracking_uri).log_metric(
                record.run_id, "sync_wait_s", time.perf_counter() - waited, step=record.step
            )

    def _in_table(self, submitted: int) -> bool:
        return (
            self.rollout.settled() >= submitted
            and _groups_in_table(self.settings) >= self.rollout.stats_done()
        )


def _groups_in_table(settings: Settings) -> int:
    """Tasks with rows in the trajectories table."""
    import polars as pl

    return int(
        pl.read_delta(
            settings.lake_table_uri("trajectories"),
            columns=["task_id"],
            storage_options=settings.delta_storage_options(),
        )
        .filter(pl.col("task_id").is_not_null())["task_id"]
        .n_unique()
    )


def _drain(
    settings: Settings, rollout: _Rollout, submitted: int, children: _Children, progress: Progress
) -> None:
    """Wait until every submitted task is settled and its group is in the table."""

    deadline = time.monotonic() + 180
    progress(f"draining: {submitted} tasks submitted")
    while rollout.settled() < submitted:
        children.check()
        rollout.check()
        if time.monotonic() > deadline:
            raise DemoError(f"only {rollout.settled()}/{submitted} tasks settled within 180 s of draining")
        time.sleep(0.25)
    while True:
        children.check()
        groups = _groups_in_table(settings)
        if groups >= rollout.stats_done():
            return
        if time.monotonic() > deadline:
            raise DemoError(
                f"{groups} of {rollout.stats_done()} completed tasks are in the table after draining"
            )
        time.sleep(0.5)


def _submit(settings: Settings, options: LoopOptions, wave: int) -> int:
    from producers.tasks import TaskSubmitter, TaskTopics
    from schemas import pack_int32

    tokenizer = loop_tokenizer()
    pairs = prompts()
    tasks = []
    for i in range(options.wave):
        text, answer = pairs[(wave * options.wave + i) % len(pairs)]
        tasks.append(
            {
                "task_id": f"loop-{uuid.uuid4().hex[:12]}",
                "domain": LOOP_DOMAIN,
                "task_type": "math",
                "prompt_tokens": pack_int32(tokenizer.encode(text)),
                "expected_answer": answer,
                "group_size": GROUP_SIZE,
                "max_tokens": 1,
                "temperature": 1.0,
                "priority": 1,
            }
        )
    topics = TaskTopics.named(
        settings.tasks_topic, dead_letters=settings.task_dlq_topic, outcomes=settings.task_outcomes_topic
    )
    with TaskSubmitter(
        bootstrap_servers=settings.bootstrap_servers,
        topics=topics,
        lock_ms=settings.task_lock_ms,
        default_deadline_ms=min(settings.task_deadline_ms, settings.task_lock_ms),
        extra_config=settings.kafka_client,
    ) as submitter:
        report = submitter.submit(tasks)
    if report.refused:
        raise DemoError(f"the loop's tasks were refused: {report.refused[0].reason}")
    return report.total


class _Rollout:
    """A rollout worker on a thread of its own, against the loop's server."""

    def __init__(self, settings: Settings, options: LoopOptions, url: str, tokenizer: Any) -> None:
        self.settings, self.options, self.url, self.tokenizer = settings, options, url, tokenizer
        self.workers: list[Any] = []
        self.error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="loop-rollout", daemon=True)
        self._ready = threading.Event()

    def start(self) -> None:
        self._thread.start()
        if not self._ready.wait(120):
            raise DemoError("the loop's rollout worker did not start within 120 s")
        self.check()

    def settled(self) -> int:
        return sum(int(w.stats.done + w.stats.dead) for w in self.workers)

    def stats_done(self) -> int:
        return sum(int(w.stats.done) for w in self.workers)

    def check(self) -> None:
        if self.error is not None:
            raise DemoError(f"the loop's rollout worker failed: {self.error}") from self.error

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=120)

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # reported by check()
            self.error = exc
        finally:
            self._ready.set()

    async def _main(self) -> None:
        from consumers.weights import PolicyWatcher
        from producers.aio import AsyncPublisher
        from producers.backends import HttpBackend
        from producers.rollout import RolloutOptions, RolloutWorker
        from producers.tasks import TaskQueue, TaskTopics

        settings = self.settings
        watcher = PolicyWatcher(settings.lake_uri, storage_options=settings.delta_storage_options())
        topics = TaskTopics.named(
            settings.tasks_topic, dead_letters=settings.task_dlq_topic, outcomes=settings.task_outcomes_topic
        )
        # One single-slot queue per concurrent task: a multi-slot TaskQueue keeps polling one
        # member while tasks wait on the partitions of its other members (docs/rollout.md, Tasks).
        queues = [
            TaskQueue(
                bootstrap_servers=settings.bootstrap_servers,
                topics=topics,
                group=settings.task_group,
                worker_id=f"loop-rollout-{i}",
                slots=1,
                max_attempts=settings.task_max_attempts,
                low_every=settings.task_low_every,
                extra_config=settings.kafka_client,
            )
            for i in range(self.options.concurrency)
        ]
        backend = HttpBackend(self.url)
        publisher = AsyncPublisher(
            bootstrap_servers=settings.bootstrap_servers,
            topic=settings.raw_topic,
            ultra_topic=settings.ultra_topic,
            extra_config=dict(settings.kafka_client),
        )
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        self.workers = [
            RolloutWorker(
                queue,
                backend,
                publisher,
                RolloutOptions(worker_id=f"loop-rollout-{i}", concurrency=1, max_lag=self.options.max_lag),
                versions=_Newest(watcher),
                tokenizer=self.tokenizer,
            )
            for i, queue in enumerate(queues)
        ]
        self._ready.set()
        try:
            await asyncio.gather(*(worker.run(self._stop) for worker in self.workers))
        finally:
            await publisher.close()
            await backend.close()
            for queue in queues:
                queue.close()


@dataclass
class _Newest:
    watcher: Any

    def newest(self) -> int | None:
        latest = self.watcher.latest()
        return None if latest is None else int(latest.number)


class _HeldoutEvaluator:
    """Answers every prompt greedily at each published version and logs the reward to MLflow."""

    def __init__(self, tokenizer: Any, tracking_uri: str, out: dict[int, float], progress: Progress) -> None:
        from stream_processors.verifiers.domains import DomainVerifiers

        self.tokenizer, self.tracking_uri, self.out, self.progress = tokenizer, tracking_uri, out, progress
        self.verifiers = DomainVerifiers()

    def __call__(self, record: Any, policy: Any) -> None:
        import mlflow
        import torch

        from consumers.policies import sample

        pairs = prompts()
        was_training = policy.training
        policy.eval()
        with torch.no_grad():
            answers = sample(
                policy, [self.tokenizer.encode(p) for p, _ in pairs], max_new_tokens=1, temperature=0.0
            )
        policy.train(was_training)
        rewards = []
        for (text, expected), answer in zip(pairs, answers, strict=True):
            verdict = self.verifiers.judge(
                {
                    "trajectory_id": f"heldout-{text}",
                    "domain": LOOP_DOMAIN,
                    "task_type": "math",
                    "expected_answer": expected,
                    "response_text": self.tokenizer.decode(answer.tokens),
                }
            )
            rewards.append(verdict.reward)
        reward = sum(rewards) / len(rewards)
        self.out[record.number] = reward
        if record.run_id:
            mlflow.MlflowClient(self.tracking_uri).log_metric(
                record.run_id, "heldout/reward", reward, step=record.number
            )
        self.progress(
            f"version {record.number} published at step {record.step}: held-out greedy reward {reward:.2f}"
        )


def version_rewards(table_uri: str, storage_options: dict[str, str] | None = None) -> list[VersionReward]:
    """Per-version training reward of the loop's groups: the mean of per-group mean rewards and its se."""
    import polars as pl

    rows = pl.read_delta(
        table_uri,
        columns=["task_id", "group_id", "policy_version", "reward"],
        storage_options=storage_options,
    ).filter(pl.col("task_id").is_not_null())
    groups = rows.group_by("group_id").agg(pl.col("policy_version").min(), pl.col("reward").mean())
    out = []
    for version, frame in sorted(groups.group_by("policy_version"), key=lambda kv: int(kv[0][0])):
        means = frame["reward"].to_list()
        n = len(means)
        mean = sum(means) / n
        var = sum((m - mean) ** 2 for m in means) / max(n - 1, 1)
        out.append(VersionReward(int(version[0]), n, mean, math.sqrt(var / n)))
    return out


def _summary(
    settings: Settings,
    options: LoopOptions,
    rollout: _Rollout,
    submitted: int,
    result: Any,
    heldout: dict[int, float],
    started: float,
    children: _Children,
) -> LoopSummary:
    import mlflow
    import polars as pl

    table = settings.lake_table_uri("trajectories")
    rows = pl.read_delta(
        table,
        columns=["task_id", "group_id", "group_status"],
        storage_options=settings.delta_storage_options(),
    ).filter(pl.col("task_id").is_not_null())
    groups = rows.group_by("group_id").agg(pl.col("group_status").first())
    rewards = version_rewards(table, settings.delta_storage_options())
    client = mlflow.MlflowClient(settings.tracking_uri)
    for reward in rewards:
        client.log_metric(result.run_id, "reward_by_version", reward.mean, step=reward.version)
    staleness = client.get_metric_history(result.run_id, "staleness/max")
    return LoopSummary(
        submitted=submitted,
        done=rollout.stats_done(),
        dead=rollout.settled() - rollout.stats_done(),
        groups_in_table=groups.height,
        complete_groups=int((groups["group_status"] == "complete").sum()),
        versions_published=int(result.policy_version),
        max_staleness_trained=int(max((m.value for m in staleness), default=0)),
        rewards=rewards,
        heldout=dict(heldout),
        run_id=result.run_id,
        table_uri=table,
        tracking_uri=settings.tracking_uri,
        seconds=round(time.monotonic() - started, 1),
        logs={name: str(children.logs / f"loop-{name}.log") for name in children.running},
    )
