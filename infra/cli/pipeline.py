"""Commands that move trajectories: produce, process, rescore, learn, demo."""

import contextlib
import json
import random
import signal
from pathlib import Path
from typing import Annotated, Any, Literal

import typer

from infra.cli.common import Common, UsageError, command, progress
from infra.settings import Settings

app = typer.Typer()


def _verifiers(settings: Settings, versions: dict[str, str] | None = None) -> Any:
    from schemas.domains import DomainRegistry
    from stream_processors.sandbox import EnvironmentStore, Sandbox
    from stream_processors.verifiers import DomainVerifiers

    return DomainVerifiers(
        DomainRegistry.load(settings.domain_registry or None),
        sandbox=Sandbox(settings.sandbox_dir / "work"),
        environments=EnvironmentStore(settings.sandbox_dir / "environments"),
        unknown_domains=settings.stream.unknown_domains,
        versions=versions,
    )


@command(app, "produce", "load generator: worker processes publish a synthetic fleet at a target rate")
def produce(
    common: Common,
    trajectories: Annotated[
        int, typer.Option("--trajectories", help="messages in all, malformed included")
    ] = 10_000,
    workers: Annotated[int, typer.Option("--workers", help="publishing processes")] = 4,
    rate: Annotated[
        float | None, typer.Option("--rate", help="target messages/s over all workers (default: flat out)")
    ] = None,
    seed: Annotated[
        int | None, typer.Option("--seed", help="fleet seed (default: a fresh one, printed)")
    ] = None,
    domains: Annotated[int, typer.Option("--domains", help="size of the fleet's domain catalog")] = 300,
    group_size_min: Annotated[int, typer.Option("--group-size-min")] = 8,
    group_size_max: Annotated[int, typer.Option("--group-size-max")] = 16,
    ultra_share: Annotated[
        float, typer.Option("--ultra-share", help="share of ultra-long samples (600k-1M tokens)")
    ] = 0.0,
    malformed_share: Annotated[
        float, typer.Option("--malformed-share", help="share of malformed messages")
    ] = 0.005,
    profile: Annotated[
        Path | None, typer.Option("--profile", help="workload profile lengths are drawn from")
    ] = None,
    lane: Annotated[Literal["throughput", "latency"], typer.Option("--lane")] = "throughput",
    no_progress: Annotated[bool, typer.Option("--no-progress", help="no progress bar (logs, CI)")] = False,
) -> int:
    from producers.loadgen import LoadSpec, run_load
    from producers.progress import rate_bar

    settings = common.settings()
    seed = random.SystemRandom().randrange(2**31) if seed is None else seed
    spec = LoadSpec(
        bootstrap_servers=settings.bootstrap_servers,
        topic=settings.raw_topic,
        ultra_topic=settings.ultra_topic,
        trajectories=trajectories,
        workers=workers,
        rate=rate,
        seed=seed,
        num_domains=domains,
        group_sizes=(group_size_min, group_size_max),
        ultra_share=ultra_share,
        malformed_share=malformed_share,
        profile_path=profile,
        lane=lane,
        extra_config=dict(settings.kafka_client),
    )
    progress(
        f"publishing {spec.trajectories} messages from {spec.workers} processes to {spec.topic} "
        f"(seed {seed}, target {f'{spec.rate:g}/s' if spec.rate else 'as fast as possible'})"
    )
    with rate_bar(enabled=not no_progress) as update:
        report = run_load(spec, progress=update)
    print(json.dumps({"seed": seed, **report.as_dict()}))
    return 0 if report.failed == 0 and not report.as_dict()["errors"] else 1


@command(
    app,
    "process",
    "run the Faust stream processor until stopped (SIGTERM / Ctrl-C)",
    sections=("stream", "sandbox"),
)
def process(
    common: Common,
    loglevel: Annotated[str, typer.Option("--loglevel")] = "info",
    workers: Annotated[
        int,
        typer.Option("--workers", help="worker processes in the consumer group (one per partition at most)"),
    ] = 1,
    instance_id: Annotated[
        str | None,
        typer.Option(
            "--instance-id",
            help="static group membership: worker i is '<id>-i'; a restart within the session timeout keeps its partitions",
        ),
    ] = None,
    worker_index: Annotated[int | None, typer.Option("--worker-index", hidden=True)] = None,
    no_progress: Annotated[bool, typer.Option("--no-progress", help="no progress bars (logs, CI)")] = False,
) -> int:
    # Until the worker installs its own handlers, a stop request ends the command cleanly: nothing
    # has been consumed yet.
    signal.signal(signal.SIGTERM, _exit_before_start)
    if workers > 1:
        from infra.cli.common import INVOCATION
        from infra.workers import run_workers, worker_argv

        return run_workers(worker_argv(INVOCATION), workers)
    settings = common.settings()
    from dataclasses import replace

    from infra.cli.stage_options import keywords, worker_options
    from stream_processors import create_app, run_worker

    configured = worker_options(settings)
    options = replace(
        configured,
        verifiers=_verifiers(settings),
        instance_id=_instance_id(instance_id, worker_index, configured.group),
        data_dir=settings.state_dir / ("faust" if worker_index is None else f"faust-{worker_index}"),
        metrics_port=_metrics_port(configured.metrics_port, worker_index),
    )
    app = create_app(**keywords(options))
    import threading

    from infra.metrics_endpoints import register_when_serving, registration_path, unregister
    from infra.progress_bars import Bars, bars_wanted, follow_catch_up
    from infra.watch import group_lag

    topics = tuple(options.topics)
    stop = threading.Event()
    register_when_serving(app, settings.state_dir)
    with Bars(enabled=bars_wanted() and not no_progress) as bars:
        follow_catch_up(
            bars,
            lambda: group_lag(settings.bootstrap_servers, topics, options.group, settings.kafka_client),
            stop=stop,
        )
        try:
            run_worker(app, loglevel=loglevel)
        finally:
            stop.set()
            unregister(registration_path(settings.state_dir, "stream"))
    return 0


def _exit_before_start(signum: int, _frame: object) -> None:
    raise SystemExit(0)


def _metrics_port(port: int | None, worker_index: int | None) -> int | None:
    """Worker i's metrics port: ``metrics_port + i`` (None: a free one)."""
    return None if port is None else port + (worker_index or 0)


def _instance_id(given: str | None, worker_index: int | None, group: str) -> str | None:
    """Worker i's static member id: ``<given>-i``; `--workers` children without one get ``<group>-<host>-i``."""
    if given is None and worker_index is None:
        return None
    if given is None:
        import socket

        given = f"{group}-{socket.gethostname()}"
    return f"{given}-{worker_index or 0}"


@command(app, "rescore", "judge stored trajectories with a verifier version; write the rescores table")
def rescore(
    common: Common,
    domain: Annotated[str, typer.Option("--domain", help="the domain to rescore")],
    verifier_version: Annotated[
        str, typer.Option("--verifier-version", help="the verifier version to judge with")
    ],
    table_version: Annotated[
        int | None, typer.Option("--table-version", help="the trajectories version (default latest)")
    ] = None,
) -> int:
    from stream_processors.rescore import rescore as run_rescore

    settings = common.settings()
    summary = run_rescore(
        lake_dir=settings.lake_uri,
        storage_options=settings.delta_storage_options(),
        domain=domain,
        verifier_version=verifier_version,
        table_version=table_version,
        verifiers=_verifiers(settings),
        pool_size=settings.sandbox.pool_size,
        bootstrap_servers=settings.bootstrap_servers,
        kafka_client=settings.kafka_client,
        progress=progress,
    )
    print(json.dumps(summary))
    return 0


@command(
    app,
    "learn",
    "train on the Delta table through the replay buffer, tracked in MLflow",
    sections=("learner", "replay"),
)
def learn(
    common: Common,
    vocab_size: Annotated[
        int | None, typer.Option("--vocab-size", help="default: the vocab_size setting")
    ] = None,
    no_progress: Annotated[bool, typer.Option("--no-progress", help="no progress bars (logs, CI)")] = False,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            "--metrics-port",
            help="serve /metrics and /health on this port (0: a free one, logged); default off",
        ),
    ] = None,
) -> int:
    import threading

    # Before the heavy imports (torch): a SIGTERM while starting still ends the run cleanly.
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    settings = common.settings()

    from consumers import learn as run_learn
    from consumers.learner_metrics import LearnerMetrics
    from consumers.versioning import PublishOptions
    from infra.cli.stage_options import learner_options, replay_config
    from infra.metrics_endpoints import registered, url_for
    from infra.progress_bars import Bars, bars_wanted
    from schemas.metrics import serve_metrics

    if metrics_port is not None and not 0 <= metrics_port < 65536:
        raise UsageError(f"--metrics-port {metrics_port}; give a port, 0 for a free one, or leave it out")
    if vocab_size is not None:
        settings = settings.replace(vocab_size=vocab_size)
    learner = settings.learner
    publish = None
    if learner.publish_every is not None:
        publish = PublishOptions(
            lake_uri=settings.lake_uri,
            every=learner.publish_every,
            storage_options=settings.delta_storage_options(),
            model_name=learner.register_model,
            kafka_config=settings.kafka_config() if learner.announce else None,
        )
    bars = Bars(enabled=bars_wanted() and not no_progress)
    metrics = LearnerMetrics()
    server = None if metrics_port is None else serve_metrics(metrics.registry, port=metrics_port)
    if server is not None:
        progress(f"learn: metrics at http://127.0.0.1:{server.port}/metrics")
    with bars, contextlib.ExitStack() as closing:
        if server is not None:
            closing.callback(server.close)
            closing.enter_context(
                registered(settings.state_dir, "learner", url_for("127.0.0.1", server.port))
            )
        result = run_learn(
            replay_config(settings),
            learner_options(settings),
            tracking_uri=settings.tracking_uri,
            publish=publish,
            progress=bars.line,
            on_step=lambda step, total: bars.advance("learn", step, total),
            stop=stop,
            metrics=metrics,
        )
    print(json.dumps(result.as_dict()))
    return 0


@command(app, "demo", "up, publish, process, learn, and print where every trajectory went")
def demo(
    common: Common,
    trajectories: Annotated[int, typer.Option("--trajectories")] = 10_000,
    seed: Annotated[
        int | None, typer.Option("--seed", help="fleet seed (default: a fresh one, printed)")
    ] = None,
    bad_fraction: Annotated[
        float, typer.Option("--bad-fraction", help="share of malformed messages")
    ] = 0.005,
    steps: Annotated[int, typer.Option("--steps", help="learner steps")] = 20,
    timeout: Annotated[float, typer.Option("--timeout", help="seconds to wait for the processor")] = 900.0,
    as_json: Annotated[bool, typer.Option("--json", help="end with the summary as one JSON object")] = False,
    no_progress: Annotated[bool, typer.Option("--no-progress", help="no progress bars (logs, CI)")] = False,
    loop: Annotated[
        bool,
        typer.Option(
            "--loop",
            help="the closed loop: tasks, rollstream serve, a rollout worker, process, learn, reload",
        ),
    ] = False,
    versions: Annotated[int, typer.Option("--versions", help="with --loop: versions to publish")] = 8,
    time_limit: Annotated[
        float, typer.Option("--time-limit", help="with --loop: seconds before submitting stops")
    ] = 300.0,
) -> int:
    from infra.demo import run_demo
    from infra.progress_bars import Bars, bars_wanted

    if loop:
        from infra.loop import LoopOptions, run_loop

        result = run_loop(
            common.settings(),
            LoopOptions(versions=versions, time_limit_s=time_limit, seed=seed or 0),
            progress=progress,
        )
        for reward in result.rewards:
            held = result.heldout.get(reward.version)
            progress(
                f"version {reward.version}: {reward.groups} groups, training reward {reward.mean:.3f} "
                f"(se {reward.se:.3f})" + ("" if held is None else f", held-out greedy {held:.2f}")
            )
        progress(
            f"{result.submitted} tasks: {result.done} done, {result.dead} dead; {result.complete_groups} complete "
            f"groups in {result.table_uri}; MLflow run {result.run_id} at {result.tracking_uri}"
        )
        if as_json:
            print(json.dumps(result.as_dict()))
        return 0 if result.accounted_for else 1

    bars = Bars(enabled=bars_wanted(as_json=as_json) and not no_progress)
    with bars:
        summary = run_demo(
            common.settings(),
            trajectories=trajectories,
            seed=seed,
            bad_fraction=bad_fraction,
            learn_steps=steps,
            timeout_s=timeout,
            progress=bars.line,
            advance=bars.advance if bars.enabled else None,
        )
    print(summary.describe())
    if as_json:
        print(json.dumps(summary.as_dict()))
    return 0 if summary.accounted_for else 1
