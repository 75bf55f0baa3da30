"""`rollstream rollout`: a rollout worker taking tasks, generating through a backend, publishing."""

import asyncio
import contextlib
import json
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Annotated, Any, Literal

import typer

from infra.cli.common import Common, UsageError, command, progress
from infra.settings import Settings

app = typer.Typer()

PAUSE_MOMENTS = ("taken", "publishing", "published")
LAKE_POLL_S = 1.0
"""How often the lake's policies table is read for the newest version."""


@command(
    app,
    "rollout",
    "take tasks, generate their groups through a backend, publish them, then ack",
    sections=("rollout",),
)
def rollout(
    common: Common,
    backend: Annotated[
        str, typer.Option("--backend", help="the server's URL (vLLM, SGLang, rollstream serve), or 'torch'")
    ],
    policy: Annotated[
        str | None,
        typer.Option("--policy", help='with --backend torch: "tiny", "transformer" or module:factory'),
    ] = None,
    vocab_size: Annotated[
        int | None,
        typer.Option("--vocab-size", help="token ids must be below it (default: the model's, else settings)"),
    ] = None,
    tokenizer: Annotated[
        str | None,
        typer.Option(
            "--tokenizer", help="tokenizer file or module:factory, for text prompts and sample text"
        ),
    ] = None,
    server_version: Annotated[
        int | None,
        typer.Option("--server-version", help="the weight version of a server that reports none (vLLM)"),
    ] = None,
    lake: Annotated[
        str | None,
        typer.Option(
            "--lake", help="the lake whose policies table holds the newest version (torch follows it)"
        ),
    ] = None,
    worker_id: Annotated[
        str | None, typer.Option("--worker-id", help="stamped on every sample (default <host>-<pid>)")
    ] = None,
    max_tasks: Annotated[
        int | None, typer.Option("--max-tasks", help="stop after this many tasks were taken and settled")
    ] = None,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            "--metrics-port",
            help="serve /metrics and /health on this port (0: a free one, logged); default off",
        ),
    ] = None,
    test_pause_at: Annotated[
        str | None, typer.Option("--test-pause-at", hidden=True, help="test hook (docs/rollout.md)")
    ] = None,
) -> int:
    signal.signal(signal.SIGTERM, _exit_before_start)
    if test_pause_at is not None and test_pause_at not in PAUSE_MOMENTS:
        raise UsageError(f"--test-pause-at {test_pause_at!r}; give one of {', '.join(PAUSE_MOMENTS)}")
    if backend == "torch" and policy is None:
        raise UsageError("--backend torch needs --policy (tiny, transformer or module:factory)")
    if backend != "torch" and policy is not None:
        raise UsageError(f"--policy is for --backend torch; the server at {backend} serves its own")
    if max_tasks is not None and max_tasks < 1:
        raise UsageError(f"--max-tasks {max_tasks}; give at least 1, or leave it out to run until stopped")
    if metrics_port is not None and not 0 <= metrics_port < 65536:
        raise UsageError(f"--metrics-port {metrics_port}; give a port, 0 for a free one, or leave it out")
    settings = common.settings()
    if settings.rollout.max_lag is not None and lake is None:
        raise UsageError("--max-lag needs --lake LAKE: the newest version is read from its policies table")
    worker = worker_id or f"{socket.gethostname()}-{os.getpid()}"
    stats = asyncio.run(
        _work(
            settings,
            backend=backend,
            policy=policy,
            vocab_size=vocab_size,
            tokenizer_spec=tokenizer,
            dialect=settings.rollout.dialect,
            server_version=server_version,
            concurrency=settings.rollout.concurrency,
            max_lag=settings.rollout.max_lag,
            on_weight_change=settings.rollout.on_weight_change,
            lake=lake,
            worker_id=worker,
            max_tasks=max_tasks,
            metrics_port=metrics_port,
            pause_at=test_pause_at,
        )
    )
    print(json.dumps(stats))
    return 0


async def _work(
    settings: Settings,
    *,
    backend: str,
    policy: str | None,
    vocab_size: int | None,
    tokenizer_spec: str | None,
    dialect: Literal["openai", "generate", "sglang"],
    server_version: int | None,
    concurrency: int,
    max_lag: int | None,
    on_weight_change: Literal["finish", "abort"],
    lake: str | None,
    worker_id: str,
    max_tasks: int | None,
    metrics_port: int | None,
    pause_at: str | None,
) -> dict[str, Any]:
    from infra.metrics_endpoints import register, unregister, url_for
    from infra.serve import load_tokenizer
    from producers.aio import AsyncPublisher
    from producers.rollout import RolloutOptions, RolloutWorker
    from producers.rollout_metrics import RolloutMetrics
    from producers.tasks import TaskQueue, TaskTopics
    from schemas.metrics import Readiness, serve_metrics

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    tokenizer = load_tokenizer(tokenizer_spec) if tokenizer_spec else None
    engine = _backend(settings, backend, policy, vocab_size, tokenizer, dialect, server_version)
    versions = _LakeVersions(lake, settings.delta_storage_options()) if lake else None
    queue = publisher = None
    follower: asyncio.Task[None] | None = None
    metrics = RolloutMetrics()
    readiness = Readiness(("task_queue",))
    server = None if metrics_port is None else serve_metrics(metrics.registry, readiness, port=metrics_port)
    registration = None
    if server is not None:
        progress(f"rollout {worker_id}: metrics at http://127.0.0.1:{server.port}/metrics")
        registration = register(settings.state_dir, "rollout", url_for("127.0.0.1", server.port))
    try:
        if versions is not None and backend == "torch":
            await _catch_up(engine, versions)
            follower = asyncio.create_task(_follow(engine, versions, stop))
        info = await engine.model_info()
        options = RolloutOptions(
            worker_id=worker_id,
            concurrency=concurrency,
            max_lag=max_lag,
            on_weight_change=on_weight_change,
            vocab_size=vocab_size or info.vocab_size or settings.vocab_size,
        )
        queue = await asyncio.to_thread(
            TaskQueue,
            bootstrap_servers=settings.bootstrap_servers,
            topics=TaskTopics.named(
                settings.tasks_topic,
                dead_letters=settings.task_dlq_topic,
                outcomes=settings.task_outcomes_topic,
            ),
            group=settings.task_group,
            worker_id=worker_id,
            slots=concurrency,
            max_attempts=settings.task_max_attempts,
            low_every=settings.task_low_every,
            extra_config=settings.kafka_client,
        )
        publisher = AsyncPublisher(
            bootstrap_servers=settings.bootstrap_servers,
            topic=settings.raw_topic,
            ultra_topic=settings.ultra_topic,
            extra_config=dict(settings.kafka_client),
        )
        readiness.mark("task_queue")
        worker = RolloutWorker(
            queue,
            engine,
            publisher,
            options,
            versions=versions,
            tokenizer=tokenizer,
            progress=_progress_lines(),
            metrics=metrics,
            on_step=None if pause_at is None else _pause_at(pause_at),
        )
        progress(
            f"rollout {worker_id}: tasks from {settings.task_group} ({settings.tasks_topic}.*), "
            f"{concurrency} at once, through {backend}, to {settings.raw_topic}; SIGTERM or Ctrl-C stops it"
        )
        stats = await worker.run(stop, max_tasks=max_tasks)
    finally:
        stop.set()
        readiness.stop()
        if follower is not None:
            await asyncio.gather(follower, return_exceptions=True)
        if publisher is not None:
            await publisher.close()
        if queue is not None:
            await asyncio.to_thread(queue.close)  # requeues whatever is still open
        await engine.close()
        if registration is not None:
            unregister(registration)
        if server is not None:
            server.close()
    progress(
        f"rollout {worker_id}: done {stats.done}, failed {stats.failed}, dead {stats.dead}, "
        f"requeued {stats.requeued}; {stats.samples} samples published"
    )
    return {
        "worker_id": worker_id,
        "started": stats.started,
        "done": stats.done,
        "failed": stats.failed,
        "dead": stats.dead,
        "requeued": stats.requeued,
        "samples": stats.samples,
        "lag_waits": stats.lag_waits,
        "generate_s": round(stats.generate_s, 3),
    }


def _backend(
    settings: Settings,
    url: str,
    policy: str | None,
    vocab_size: int | None,
    tokenizer: Any,
    dialect: Literal["openai", "generate", "sglang"],
    server_version: int | None,
) -> Any:
    """An `HttpBackend` for a URL, or a `TorchBackend` over `consumers.policies.load_policy`."""
    if url != "torch":
        from producers.backends import HttpBackend, HttpOptions

        if "://" not in url:
            raise UsageError(f"--backend {url!r}: give the server's URL (http://host:port) or 'torch'")
        return HttpBackend(url, HttpOptions(dialect=dialect, version=server_version))
    from consumers.policies import load_policy
    from producers.backends import TorchBackend

    assert policy is not None
    vocab = vocab_size or getattr(tokenizer, "vocab_size", None) or settings.vocab_size
    eos_id = getattr(tokenizer, "eos_id", None)
    model: Any = load_policy(policy, vocab_size=vocab)
    return TorchBackend(
        model, eos_id=eos_id if isinstance(eos_id, int) else None, tokenizer=tokenizer, model_id=policy
    )


class _LakeVersions:
    """The newest version in a lake's policies table (a `VersionSource`), read at most every LAKE_POLL_S."""

    def __init__(self, lake: str, storage_options: Any) -> None:
        from consumers.weights import PolicyWatcher

        self.storage_options = storage_options
        self._watcher = PolicyWatcher(lake, storage_options=storage_options)
        self._lock = threading.Lock()  # the worker and the torch follower read from their own threads
        self._read_at = -LAKE_POLL_S
        self.record: Any = None

    def newest(self) -> int | None:
        with self._lock:
            if time.monotonic() - self._read_at >= LAKE_POLL_S:
                self.record = self._watcher.latest()
                self._read_at = time.monotonic()
            return None if self.record is None else int(self.record.number)


async def _catch_up(engine: Any, versions: _LakeVersions) -> None:
    """Load the lake's newest version into the torch backend when it is newer than the one held."""
    from consumers.weights import load_weights

    await asyncio.to_thread(versions.newest)
    record = versions.record
    if record is None or record.number <= engine.version:
        return
    tensors = await asyncio.to_thread(load_weights, record, storage_options=versions.storage_options)
    await engine.set_weights(tensors, version=record.number)
    progress(f"rollout: generating with policy version {record.number} (step {record.step})")


async def _follow(engine: Any, versions: _LakeVersions, stop: asyncio.Event) -> None:
    """Keep the torch backend on the lake's newest version until `stop`."""
    while not stop.is_set():
        try:
            await _catch_up(engine, versions)
        except Exception as exc:  # a version that does not load now may load at the next poll
            progress(f"rollout: loading the newest policy version failed: {exc}")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), LAKE_POLL_S)


def _progress_lines() -> Callable[[str], None]:
    """A line per settled task on a terminal; otherwise one every 100."""
    terminal = sys.stderr.isatty()
    settled = [0]

    def show(line: str) -> None:
        settled[0] += 1
        if terminal or settled[0] % 100 == 0:
            progress(f"rollout: {line}")

    return show


def _pause_at(moment: str) -> Callable[[Any, Any, int], None]:
    """The test hook: at `moment` ("publishing": before the middle sample of a group) print where
    and block the worker for good, so that a test can SIGKILL it there."""

    def hook(step: str, lease: Any, count: int) -> None:
        if step != moment or (step == "publishing" and count != lease.task.group_size // 2):
            return
        print(f"paused at {step} {count}: task {lease.task_id} attempt {lease.attempt}", flush=True)
        while True:
            time.sleep(3600)

    return hook


def _exit_before_start(signum: int, _frame: object) -> None:
    raise SystemExit(0)
