"""`rollstream demo --loop`: generation, scoring, buffering, learning, new weights, generation again.

On one machine: the broker (`rollstream up`), `rollstream serve --follow` (a torch policy over
HTTP that loads each version the learner publishes), a rollout worker (tasks from the share
group, groups through the server, samples to rollouts.raw, acked after Kafka acked them),
`rollstream process` (the math verifier, GRPO advantages, Delta) and the learner (the replay
buffer with `max_lag`, the asynchronous loss, a version published every `publish_every` steps).

The task is addition modulo 5 over the digits 0-4 ("3+4" -> "2"), one answer token, judged by the
registry's math verifier: an untrained policy over the 7-token vocabulary answers right about
1 time in 7, and a small transformer learns it in a few minutes on the CPU. Tasks are drawn from
20 of the 25 prompts; the other 5 (b = a + 2 mod 5, whose mirror images a + b are trained on) are
held out: at each published version they are answered greedily and the reward logged to MLflow
beside the training reward, so it measures generalization to prompts never trained on.

With `LoopOptions.learner_process` and `rollout_processes` the learner (`rollstream learn`) and
some rollout workers (`rollstream rollout`) run as child processes that may be SIGKILLed: the
loop restarts a child that a signal ended, and the learner resumes from its checkpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from infra.exceptions import DemoError
from infra.processes import stderr_progress, tail, terminate
from infra.settings import Settings

MODULUS = 5
LOOP_DOMAIN = "math/arithmetic-000"
POLICY = "transformer"
GROUP_SIZE = 8
EXPERIMENT = "rollstream-loop"
MODEL_NAME = "rollstream-loop"
"""The MLflow registered model that collects every loop's published versions (each under its run)."""
Progress = Callable[[str], None]


def loop_tokenizer() -> Any:
    """The loop's vocabulary: the digits 0-4, '+' and eos (7 ids)."""
    from schemas.tokenizer import CharTokenizer

    return CharTokenizer([*"01234+", "<eos>"], eos="<eos>", name="mod5")


def prompts() -> list[tuple[str, str]]:
    """Every prompt of the task with its answer: ("3+4", "2")."""
    return [(f"{a}+{b}", str((a + b) % MODULUS)) for a in range(MODULUS) for b in range(MODULUS)]


def _held_out(text: str) -> bool:
    a, b = int(text[0]), int(text[2])
    return (b - a) % MODULUS == 2


def training_prompts() -> list[tuple[str, str]]:
    """The 20 prompts tasks are made of."""
    return [pair for pair in prompts() if not _held_out(pair[0])]


def heldout_prompts() -> list[tuple[str, str]]:
    """The 5 prompts never trained on (0+2, 1+3, 2+4, 3+0, 4+1: every answer once)."""
    return [pair for pair in prompts() if _held_out(pair[0])]


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
        concurrency: rollout workers, each generating one group at a time.
        seed: seeds the initial weights and the draws.
        synchronous: the synchronous baseline (bench/loop.py): wave v is submitted once version
            v is published, the server generates with it and every earlier task settled; the
            learner samples only once all of the wave's groups are in the table, trains on them
            alone (its buffer's max_lag 0) and publishes v+1. Generation and training never overlap.
        learner_process: run the learner as `rollstream learn --follow --checkpoint ...`, a child
            process restarted (resuming from its checkpoint) when a signal ends it; else on a thread.
        rollout_processes: how many of the `concurrency` rollout workers run as `rollstream
            rollout --concurrency 1` child processes, restarted when a signal ends them (each
            imports torch: about 0.8 GB here); the others run on threads of this process.
        checkpoint_every: the learner process's steps between checkpoints (and one per version).
        task_lock_ms: the lease on a task (the run's share group lock; None: `task_lock_ms` of
            the settings): a SIGKILLed worker's task comes back after it. Tasks get half of it
            (at most `task_deadline_ms`) as their deadline.
        model_name: register every published version as a model version of this MLflow model,
            under the learner's run (None: don't).
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
    learner_process: bool = False
    rollout_processes: int = 0
    checkpoint_every: int = 2
    task_lock_ms: int | None = None
    model_name: str | None = MODEL_NAME

    def __post_init__(self) -> None:
        if not 0 <= self.rollout_processes <= self.concurrency:
            raise ValueError(
                f"rollout_processes = {self.rollout_processes}: give 0 to concurrency ({self.concurrency})"
            )
        if self.wave * GROUP_SIZE * self.samples_per_insert < self.publish_every * self.rows_per_step:
            raise ValueError(
                f"a version trains on publish_every x rows_per_step / samples_per_insert = "
                f"{self.publish_every * self.rows_per_step / self.samples_per_insert:.0f} rows, more than a "
                f"wave of {self.wave} groups of {GROUP_SIZE} gives: the learner would wait for tasks the "
                "loop holds back; raise wave or samples_per_insert, or lower rows_per_step"
            )
        if self.synchronous and (self.learner_process or self.rollout_processes):
            raise ValueError(
                "the synchronous baseline gates the learner in process: run it without "
                "learner_process and rollout_processes"
            )


@dataclass
class VersionReward:
    """The training reward of the groups one version generated: per-group means, pooled."""

    version: int
    groups: int
    mean: float
    se: float


@dataclass
class LoopSummary:
    """What a loop run did; `accounted_for` says every task ended as one complete group or a task
    dead letter (`done`: tasks with a complete group in the table; `dead`: the others with a task
    dead letter; `missing`: neither)."""

    submitted: int
    done: int
    dead: int
    missing: int
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
    restarts: dict[str, int] = field(default_factory=dict)
    learner_resumed_from: int = 0
    logs: dict[str, str] = field(default_factory=dict)

    @property
    def accounted_for(self) -> bool:
        return (
            self.missing == 0
            and self.done + self.dead == self.submitted
            and self.complete_groups == self.done
        )

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["accounted_for"] = self.accounted_for
        return out


@dataclass(frozen=True)
class LoopView:
    """What `run_loop`'s `on_tick` sees, about four times a second.

    Attributes:
        version: the newest published version (-1 before the first).
        pids: the loop's child processes by name: serve, process, learner, rollout-<i>.
        restarts: how often each restartable child was restarted.
        submitted: tasks submitted so far.
        settled: of those, tasks that ended (see `LoopSummary`; the workers' counts when every
            worker runs on a thread).
        held: the task ids each rollout child (rollout-<i>) holds a lease on now, from the task
            outcome log (started, and not yet done, released, requeued or dead).
    """

    version: int
    pids: dict[str, int]
    restarts: dict[str, int]
    submitted: int
    settled: int
    held: dict[str, frozenset[str]] = field(default_factory=dict)


Tick = Callable[[LoopView], None]
MAX_RESTARTS = 5


class _Children:
    """Child processes of the loop, each with a log; stopped by PID with SIGTERM.

    A restartable child that a signal ended (a SIGKILL, the OOM killer) is started again with
    the same command line; a child that exits on its own is an error of the loop.
    """

    def __init__(self, settings: Settings, progress: Progress | None = None) -> None:
        self.env = {**os.environ, **settings.as_env()}
        self.logs = settings.state_dir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.progress = progress or stderr_progress
        self.running: dict[str, subprocess.Popen[bytes]] = {}
        self.argv: dict[str, list[str]] = {}
        self.restartable: set[str] = set()
        self.restarts: Counter[str] = Counter()

    def start(self, name: str, argv: list[str], *, restartable: bool = False) -> subprocess.Popen[bytes]:
        with (self.logs / f"loop-{name}.log").open("ab") as log:
            child = subprocess.Popen(
                [sys.executable, "-m", "infra.cli", *argv], stdout=subprocess.PIPE, stderr=log, env=self.env
            )
        self.running[name], self.argv[name] = child, argv
        if restartable:
            self.restartable.add(name)
        return child

    def check(self) -> None:
        for name, child in list(self.running.items()):
            code = child.poll()
            if code is None:
                continue
            if name in self.restartable and code < 0 and self.restarts[name] < MAX_RESTARTS:
                self.restarts[name] += 1
                self.progress(
                    f"the loop's {name} (pid {child.pid}) was ended by signal {-code}; restarting it "
                    f"(restart {self.restarts[name]})"
                )
                self.start(name, self.argv[name])
                continue
            raise DemoError(
                f"the loop's {name} exited with code {code}; its log ends with:\n"
                f"{tail(self.logs / f'loop-{name}.log')}"
            )

    def pids(self) -> dict[str, int]:
        return {name: child.pid for name, child in self.running.items()}

    def stop_one(self, name: str) -> bytes:
        """Stop one child with SIGTERM; returns what it printed on stdout."""
        child = self.running.pop(name)
        if child.poll() is None:
            terminate(child.pid, timeout=60.0)
        out = child.stdout.read() if child.stdout is not None else b""
        child.wait()
        if child.returncode != 0:
            raise DemoError(
                f"the loop's {name} exited with code {child.returncode} when stopped; its log ends with:\n"
                f"{tail(self.logs / f'loop-{name}.log')}"
            )
        return out

    def stop(self) -> None:
        for child in self.running.values():
            if child.poll() is None:
                terminate(child.pid, timeout=30.0)
            child.wait()


def loop_settings(settings: Settings, run: str, task_lock_ms: int | None = None) -> Settings:
    """The settings of loop run `run`: its own lake and topics on the same broker and tracking store."""
    prefix = f"rollouts.loop-{run}"
    lock = {}
    if task_lock_ms is not None:
        lock = {
            "task_lock_ms": task_lock_ms,
            "task_deadline_ms": min(settings.task_deadline_ms, task_lock_ms),
        }
    return settings.replace(
        lake_uri=str(settings.state_dir / "loop" / run / "lake"),
        raw_topic=f"{prefix}.raw",
        ultra_topic=f"{prefix}.ultra",
        dlq_topic=f"{prefix}.dlq",
        tasks_topic=f"{prefix}.tasks",
        task_dlq_topic=f"{prefix}.tasks.dlq",
        task_outcomes_topic=f"{prefix}.tasks.outcomes",
        task_group=f"{prefix}.tasks",
        **lock,
    )


def run_loop(
    settings: Settings,
    options: LoopOptions,
    *,
    progress: Progress,
    run: str | None = None,
    on_tick: Tick | None = None,
) -> LoopSummary:
    """Run the closed loop until `options.versions` (or the time limit), then drain and account.

    The run gets its own lake (``<state_dir>/loop/<run>/lake``) and topics (`loop_settings`).
    `on_tick` is called with a `LoopView` about four times a second (a fault test kills children
    by their pids from it).
    """
    import torch

    from consumers.policies import load_policy
    from consumers.weights import publish_version
    from infra import services

    started = time.monotonic()
    signal.signal(signal.SIGTERM, _interrupt)  # the children are stopped on the way out
    run = run or uuid.uuid4().hex[:8]
    settings = loop_settings(settings, run, options.task_lock_ms)
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
    children = _Children(settings, progress)
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
        for i in range(options.rollout_processes):
            children.start(
                f"rollout-{i}", _rollout_argv(settings, options, url, token_file, i), restartable=True
            )
        loop = _Loop(settings, options, url, tokenizer, children, settings.state_dir / "loop" / run, progress)
        return loop.drive(started, on_tick)
    finally:
        children.stop()


def _rollout_argv(
    settings: Settings, options: LoopOptions, url: str, token_file: Any, index: int
) -> list[str]:
    return [
        "rollout",
        "--backend",
        url,
        "--tokenizer",
        str(token_file),
        "--concurrency",
        "1",
        "--max-lag",
        str(options.max_lag),
        "--lake",
        settings.lake_uri,
        "--worker-id",
        f"loop-rollout-p{index}",
    ]


def _learner_argv(options: LoopOptions, vocab_size: int, checkpoint: Any) -> list[str]:
    argv = [
        "learn",
        "--follow",
        "--no-progress",
        "--experiment",
        EXPERIMENT,
        "--policy",
        POLICY,
        "--layout",
        "packed",
        "--token-budget",
        str(4 * options.rows_per_step),
        "--max-length",
        "8",
        "--vocab-size",
        str(vocab_size),
        "--no-profile-match",
        "--max-lag",
        str(options.max_lag),
        "--samples-per-insert",
        str(options.samples_per_insert),
        "--min-size",
        str(options.rows_per_step),
        "--lr",
        str(options.lr),
        "--seed",
        str(options.seed),
        "--publish-every",
        str(options.publish_every),
        "--checkpoint",
        str(checkpoint),
        "--checkpoint-every",
        str(options.checkpoint_every),
    ]
    if options.model_name is not None:
        argv += ["--register-model", options.model_name]
    return argv


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


def _table_exists(settings: Settings) -> bool:
    from deltalake import DeltaTable

    return bool(
        DeltaTable.is_deltatable(
            settings.lake_table_uri("trajectories"), storage_options=settings.delta_storage_options()
        )
    )


class _ThreadLearner:
    """`consumers.learn` on a thread of the driver (it waits for the table itself)."""

    def __init__(self, settings: Settings, options: LoopOptions, vocab_size: int, gate: Any) -> None:
        self.stop = threading.Event()
        self.learned: dict[str, Any] = {}
        self.args = (settings, options, vocab_size, gate)
        self.thread = threading.Thread(target=self._run, name="loop-learner", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def tick(self) -> None:
        if "error" in self.learned or not self.thread.is_alive():
            raise DemoError(f"the loop's learner stopped: {self.learned.get('error', 'it returned early')}")

    def finish(self) -> dict[str, Any]:
        self.stop.set()
        self.thread.join(timeout=120)
        if self.thread.is_alive():
            raise DemoError("the loop's learner did not stop within 120 s of being asked to")
        if "error" in self.learned:
            raise DemoError(f"the loop's learner failed: {self.learned['error']}") from self.learned["error"]
        return dict(self.learned["result"].as_dict())

    def _run(self) -> None:
        from consumers import LearnerOptions, learn
        from consumers.replay import ReplayConfig
        from consumers.versioning import PublishOptions

        settings, options, vocab_size, gate = self.args
        try:
            _wait_for_table(settings, self.stop)
            replay = ReplayConfig(
                table_uri=settings.lake_table_uri("trajectories"),
                storage_options=settings.delta_storage_options(),
                follow=True,
                layout="packed",
                token_budget=4 * options.rows_per_step,
                max_length=8,
                vocab_size=vocab_size,
                profile_matched=False,
                max_lag=0 if options.synchronous else options.max_lag,
                samples_per_insert=options.samples_per_insert,
                min_size=options.wave * GROUP_SIZE if options.synchronous else options.rows_per_step,
                sample_timeout_s=5.0,
                poll_interval_s=0.2,
                seed=options.seed,
            )
            self.learned["result"] = learn(
                replay,
                LearnerOptions(experiment=EXPERIMENT, steps=None, lr=options.lr, policy=POLICY),
                tracking_uri=settings.tracking_uri,
                publish=PublishOptions(
                    lake_uri=settings.lake_uri,
                    every=options.publish_every,
                    storage_options=settings.delta_storage_options(),
                    model_name=options.model_name,
                ),
                on_publish=gate,
                stop=self.stop,
            )
        except BaseException as exc:  # reported by tick() and finish()
            self.learned["error"] = exc


class _ProcessLearner:
    """`rollstream learn --follow --checkpoint ...` as a restartable child, started once the table exists."""

    def __init__(self, settings: Settings, children: _Children, argv: list[str]) -> None:
        self.settings, self.children, self.argv = settings, children, argv
        self.started = False

    def start(self) -> None:
        pass

    def tick(self) -> None:
        if not self.started and _table_exists(self.settings):
            self.children.start("learner", self.argv, restartable=True)
            self.started = True

    def finish(self) -> dict[str, Any]:
        if not self.started:
            raise DemoError("the loop's learner never started: no trajectories table; see the process log")
        lines = self.children.stop_one("learner").decode().strip().splitlines()
        if not lines:
            raise DemoError("the loop's learner printed no result when stopped; see its log")
        return dict(json.loads(lines[-1]))


class _Loop:
    """One loop run's driver: submits waves, watches versions, scores held-out prompts, drains."""

    def __init__(
        self,
        settings: Settings,
        options: LoopOptions,
        url: str,
        tokenizer: Any,
        children: _Children,
        run_dir: Any,
        progress: Progress,
    ) -> None:
        from consumers.weights import PolicyWatcher

        self.settings, self.options, self.children, self.progress = settings, options, children, progress
        self.heldout: dict[int, float] = {}
        self.evaluate = _HeldoutEvaluator(tokenizer, settings, self.heldout, progress)
        self.ledger = _Ledger(settings)
        self.rollout = _Rollout(settings, options, url, tokenizer)
        self.watcher = PolicyWatcher(settings.lake_uri, storage_options=settings.delta_storage_options())
        self.gate = _SyncGate(settings, options, url, self.rollout) if options.synchronous else None
        self.learner: _ThreadLearner | _ProcessLearner
        if options.learner_process:
            argv = _learner_argv(options, tokenizer.vocab_size, run_dir / "learner.ckpt")
            self.learner = _ProcessLearner(settings, children, argv)
        else:
            self.learner = _ThreadLearner(settings, options, tokenizer.vocab_size, self.gate)
        self.submitted = 0
        self.on_tick: Tick | None = None
        self.holdings: _Holdings | None = None

    def drive(self, started: float, on_tick: Tick | None) -> LoopSummary:
        self.on_tick = on_tick
        self.learner.start()
        self.rollout.start()
        result: dict[str, Any] | None = None
        try:
            self._feed(started)
            self._drain()
            self.rollout.stop()
            for name in [n for n in self.children.running if n.startswith("rollout-")]:
                self.children.stop_one(name)
            if self.gate is not None:
                self.gate.stop.set()  # a synchronous learner may wait in the gate for a wave
            result = self.learner.finish()
            self.evaluate.catch_up(self.watcher, run_id=result["run_id"])
            return _summary(self, result, started)
        finally:
            if self.gate is not None:
                self.gate.stop.set()
            self.rollout.stop()
            if result is None and isinstance(self.learner, _ThreadLearner):
                self.learner.stop.set()
            self.ledger.close()
            if self.holdings is not None:
                self.holdings.close()

    def _tick(self) -> int:
        """Check every piece, start the learner once it can, score new versions; the newest version."""
        self.children.check()
        self.rollout.check()
        self.learner.tick()
        self.evaluate.catch_up(self.watcher)
        latest = self.watcher.latest()
        version = -1 if latest is None else latest.number
        if self.on_tick is not None:
            view = LoopView(
                version,
                self.children.pids(),
                dict(self.children.restarts),
                self.submitted,
                self._settled(),
                self._holdings().held() if self.options.rollout_processes else {},
            )
            self.on_tick(view)
        return version

    def _holdings(self) -> _Holdings:
        if self.holdings is None:
            self.holdings = _Holdings(self.settings)
        return self.holdings

    def _settled(self) -> int:
        if self.options.learner_process or self.options.rollout_processes:
            self.ledger.refresh()
            return self.ledger.settled()
        return self.rollout.settled()

    def _feed(self, started: float) -> None:
        """Submit waves of tasks until the learner reaches the target version or the time runs out."""
        options, wave, last = self.options, 0, -2
        while True:
            version = self._tick()
            settled = self._settled()
            if version != last:
                self.progress(f"learner at version {version}; tasks done {settled}/{self.submitted}")
                last = version
            if version >= options.versions or time.monotonic() - started > options.time_limit_s:
                return
            # One wave a version, at most max_lag waves ahead of the learner: each version's weights
            # generate about a wave of groups, and no group waits for the learner longer than the
            # staleness limit allows.
            if self.gate is not None:
                if wave <= max(version, 0) and settled == self.submitted and self.gate.serving(version):
                    self._submit(wave)
                    wave += 1
                    self.gate.submitted = self.submitted
            elif wave <= max(version, 0) + options.max_lag - 1 and self.submitted - settled < options.wave:
                self._submit(wave)
                wave += 1
            time.sleep(0.25)

    def _submit(self, wave: int) -> None:
        ids = _submit(self.settings, self.options, wave)
        self.ledger.submitted.extend(ids)
        self.submitted += len(ids)

    def _drain(self) -> None:
        """Wait until every submitted task has a complete group in the table or a task dead letter."""
        lock_s = self.settings.task_lock_ms / 1000
        limit = 180 + (lock_s if self.options.rollout_processes else 0)
        deadline = time.monotonic() + limit
        self.progress(f"draining: {self.submitted} tasks submitted")
        while True:
            self._tick()
            self.ledger.refresh()
            missing = self.ledger.missing()
            if not missing:
                return
            if time.monotonic() > deadline:
                raise DemoError(
                    f"{len(missing)} of {self.submitted} tasks have neither a complete group in the table "
                    f"nor a task dead letter after {limit:.0f} s of draining (e.g. {missing[:3]})"
                )
            time.sleep(0.5)


def _wait_for_table(settings: Settings, stop: threading.Event, timeout_s: float = 180.0) -> None:
    """Wait until `rollstream process` made the trajectories table (its first commit)."""
    uri, deadline = settings.lake_table_uri("trajectories"), time.monotonic() + timeout_s
    while not _table_exists(settings):
        if stop.is_set() or time.monotonic() > deadline:
            raise DemoError(f"no trajectories table at {uri} within {timeout_s:.0f} s; see the process log")
        time.sleep(0.5)


class _SyncGate:
    """`LoopOptions.synchronous`: after publishing version v the learner waits here until wave v
    was submitted and all its groups are in the table (or the loop stops); the wait is logged as
    `sync_wait_s` at the publishing step."""

    def __init__(self, settings: Settings, options: LoopOptions, url: str, rollout: _Rollout) -> None:
        self.settings, self.wave, self.url, self.rollout = settings, options.wave, url, rollout
        self.stop = threading.Event()
        self.submitted = 0

    def serving(self, version: int) -> bool:
        """Whether the server generates with `version` (or newer) already."""
        import httpx

        return int(httpx.get(f"{self.url}/health", timeout=10).json()["weight_version"]) >= version

    def __call__(self, record: Any, policy: Any) -> None:
        import mlflow

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


class _Ledger:
    """Which submitted tasks ended: a complete group in the trajectories table, or a task dead letter.

    The table and the task dead-letter topic are what the loop's accounting rests on, not the
    workers' counters (a SIGKILLed worker takes its counters with it).
    """

    def __init__(self, settings: Settings) -> None:
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        self.settings = settings
        self.submitted: list[str] = []
        self.complete: set[str] = set()
        self.dead: set[str] = set()
        self._read_at = -math.inf
        topic = settings.task_dlq_topic
        self._consumer = Consumer(
            {
                **dict(settings.kafka_client),
                "bootstrap.servers": settings.bootstrap_servers,
                "group.id": f"rollstream-loop-ledger-{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": False,
            }
        )
        partitions = self._consumer.list_topics(topic, timeout=30).topics[topic].partitions
        self._partitions = [TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions]
        self._consumer.assign(self._partitions)

    def refresh(self, every_s: float = 1.0) -> None:
        """Read new dead letters and the table's complete groups (at most every `every_s`)."""
        import polars as pl

        from producers.tasks import TaskDeadLetter

        if time.monotonic() - self._read_at < every_s:
            return
        self._read_at = time.monotonic()
        for message in self._consumer.consume(10_000, timeout=0.1):
            if message.error() is None:
                self.dead.add(TaskDeadLetter.from_message(message).task_id)
        if not _table_exists(self.settings):
            return
        rows = pl.read_delta(
            self.settings.lake_table_uri("trajectories"),
            columns=["task_id", "group_status"],
            storage_options=self.settings.delta_storage_options(),
        )
        done = rows.filter(pl.col("task_id").is_not_null() & (pl.col("group_status") == "complete"))
        self.complete = set(done["task_id"].unique().to_list())

    def read_to_end(self, timeout_s: float = 30.0) -> None:
        """Every dead letter written so far, and the table as it is now."""
        from producers.tasks import TaskDeadLetter

        ends = {
            tp.partition: self._consumer.get_watermark_offsets(tp, timeout=timeout_s)[1]
            for tp in self._partitions
        }
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            positions = {tp.partition: tp.offset for tp in self._consumer.position(self._partitions)}
            if all(end <= 0 or positions.get(p, -1) >= end for p, end in ends.items()):
                break
            for message in self._consumer.consume(10_000, timeout=0.5):
                if message.error() is None:
                    self.dead.add(TaskDeadLetter.from_message(message).task_id)
        self._read_at = -math.inf
        self.refresh()

    def settled(self) -> int:
        return sum(1 for task in self.submitted if task in self.complete or task in self.dead)

    def missing(self) -> list[str]:
        return [task for task in self.submitted if task not in self.complete and task not in self.dead]

    def close(self) -> None:
        self._consumer.close()


class _Holdings:
    """The leases rollout children hold now, read from the task outcome log as it grows."""

    def __init__(self, settings: Settings) -> None:
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        self._consumer = Consumer(
            {
                **dict(settings.kafka_client),
                "bootstrap.servers": settings.bootstrap_servers,
                "group.id": f"rollstream-loop-holdings-{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": False,
            }
        )
        topic = settings.task_outcomes_topic
        partitions = self._consumer.list_topics(topic, timeout=30).topics[topic].partitions
        self._consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        self._leases: dict[tuple[str, int, int], tuple[str, str]] = {}  # coordinates -> (worker, task)

    def held(self) -> dict[str, frozenset[str]]:
        """Task ids by rollout child name (``rollout-<i>``, whose worker id is ``loop-rollout-p<i>``)."""
        from producers.tasks import Outcome

        for message in self._consumer.consume(10_000, timeout=0.05):
            value = message.value()
            if message.error() is not None or value is None:
                continue
            outcome = Outcome.decode(value)
            if outcome.event == "started":
                self._leases[outcome.coordinates] = (outcome.worker_id, outcome.task_id)
            else:
                self._leases.pop(outcome.coordinates, None)
        by_child: dict[str, set[str]] = {}
        for worker, task in self._leases.values():
            if worker.startswith("loop-rollout-p"):
                by_child.setdefault(f"rollout-{worker.removeprefix('loop-rollout-p')}", set()).add(task)
        return {name: frozenset(tasks) for name, tasks in by_child.items()}

    def close(self) -> None:
        self._consumer.close()


def _submit(settings: Settings, options: LoopOptions, wave: int) -> list[str]:
    """Submit wave `wave` of tasks; returns their ids."""
    from producers.tasks import TaskSubmitter, TaskTopics
    from schemas import pack_int32

    tokenizer = loop_tokenizer()
    pairs = training_prompts()
    deadline_ms = min(settings.task_deadline_ms, settings.task_lock_ms // 2)
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
                "deadline_ms": deadline_ms,
            }
        )
    topics = TaskTopics.named(
        settings.tasks_topic, dead_letters=settings.task_dlq_topic, outcomes=settings.task_outcomes_topic
    )
    with TaskSubmitter(
        bootstrap_servers=settings.bootstrap_servers,
        topics=topics,
        lock_ms=settings.task_lock_ms,
        default_deadline_ms=deadline_ms,
        extra_config=settings.kafka_client,
    ) as submitter:
        report = submitter.submit(tasks)
    if report.refused:
        raise DemoError(f"the loop's tasks were refused: {report.refused[0].reason}")
    return [str(task["task_id"]) for task in tasks]


class _Rollout:
    """The loop's in-process rollout workers (`concurrency - rollout_processes` of them) on one
    thread's event loop, against the loop's server."""

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
            for i in range(self.options.concurrency - self.options.rollout_processes)
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
    """Answers the held-out prompts greedily with each published version (read back from the lake,
    sha256 checked) and logs `heldout/reward` to the learner's MLflow run, step = the version;
    `greedy/train_reward` beside it is the same on the training prompts.

    Versions published before the run id is known (version 0, by the loop) are logged once it is."""

    def __init__(self, tokenizer: Any, settings: Settings, out: dict[int, float], progress: Progress) -> None:
        from stream_processors.verifiers.domains import DomainVerifiers

        self.tokenizer, self.settings, self.out, self.progress = tokenizer, settings, out, progress
        self.verifiers = DomainVerifiers()
        self.policy: Any = None
        self.next = 0
        self.run_id: str | None = None
        self.unlogged: dict[int, tuple[float, float]] = {}

    def catch_up(self, watcher: Any, *, run_id: str | None = None) -> None:
        """Score every version published since the last call."""
        from consumers.weights import load_weights

        self.run_id = self.run_id or run_id
        latest = watcher.latest()
        while latest is not None and self.next <= latest.number:
            record = watcher.get(self.next)
            self.next += 1
            if record is None:
                continue
            weights = load_weights(record, storage_options=self.settings.delta_storage_options())
            reward, seen = self._score(weights, heldout_prompts()), self._score(weights, training_prompts())
            self.out[record.number] = reward
            self.unlogged[record.number] = (reward, seen)
            self.run_id = self.run_id or record.run_id
            self.progress(
                f"version {record.number} published at step {record.step}: greedy reward {reward:.2f} on "
                f"the held-out prompts, {seen:.2f} on the training prompts"
            )
        if self.run_id is not None and self.unlogged:
            import mlflow

            client = mlflow.MlflowClient(self.settings.tracking_uri)
            for number, (reward, seen) in sorted(self.unlogged.items()):
                client.log_metric(self.run_id, "heldout/reward", reward, step=number)
                client.log_metric(self.run_id, "greedy/train_reward", seen, step=number)
            self.unlogged.clear()

    def _score(self, weights: dict[str, Any], pairs: list[tuple[str, str]]) -> float:
        import torch

        from consumers.policies import load_policy, sample

        if self.policy is None:
            self.policy = load_policy(POLICY, vocab_size=self.tokenizer.vocab_size)
        self.policy.load_state_dict(weights)
        self.policy.eval()
        with torch.no_grad():
            answers = sample(
                self.policy, [self.tokenizer.encode(p) for p, _ in pairs], max_new_tokens=1, temperature=0.0
            )
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
        return sum(rewards) / len(rewards)


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


def _summary(loop: _Loop, result: dict[str, Any], started: float) -> LoopSummary:
    import mlflow
    import polars as pl

    settings = loop.settings
    loop.ledger.read_to_end()
    table = settings.lake_table_uri("trajectories")
    rows = pl.read_delta(
        table,
        columns=["task_id", "group_id", "group_status"],
        storage_options=settings.delta_storage_options(),
    ).filter(pl.col("task_id").is_not_null())
    groups = rows.group_by("group_id").agg(pl.col("group_status").first())
    rewards = version_rewards(table, settings.delta_storage_options())
    run_id = str(result["run_id"])
    client = mlflow.MlflowClient(settings.tracking_uri)
    for reward in rewards:
        client.log_metric(run_id, "reward_by_version", reward.mean, step=reward.version)
    staleness = client.get_metric_history(run_id, "staleness/max")
    submitted = set(loop.ledger.submitted)
    done = len(submitted & loop.ledger.complete)
    dead = len((submitted & loop.ledger.dead) - loop.ledger.complete)
    return LoopSummary(
        submitted=len(loop.ledger.submitted),
        done=done,
        dead=dead,
        missing=len(loop.ledger.missing()),
        groups_in_table=groups.height,
        complete_groups=int((groups["group_status"] == "complete").sum()),
        versions_published=int(result["policy_version"]),
        max_staleness_trained=int(max((m.value for m in staleness), default=0)),
        rewards=rewards,
        heldout=dict(loop.heldout),
        run_id=run_id,
        table_uri=table,
        tracking_uri=settings.tracking_uri,
        seconds=round(time.monotonic() - started, 1),
        restarts=dict(loop.children.restarts),
        learner_resumed_from=int(result.get("resumed_from", 0)),
        logs={name: str(loop.children.logs / f"loop-{name}.log") for name in loop.children.argv},
    )
