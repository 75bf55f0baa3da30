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
        unknown_domains=settings.unknown_domains,
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


@command(app, "process", "run the Faust stream processor until stopped (SIGTERM / Ctrl-C)")
def process(
    common: Common,
    app_id: Annotated[
        str, typer.Option("--app-id", help="names the offsets stored in Delta; keep it stable")
    ] = "rollstream-processor",
    group_id: Annotated[
        str | None, typer.Option("--group-id", help="Kafka consumer group (default: the app id)")
    ] = None,
    write_retries: Annotated[
        int, typer.Option("--write-retries", help="Delta write attempts before the worker stops")
    ] = 5,
    no_ultra: Annotated[bool, typer.Option("--no-ultra", help="do not consume the ultra-long topic")] = False,
    batch_size: Annotated[int, typer.Option("--batch-size")] = 500,
    batch_within: Annotated[
        float, typer.Option("--batch-within", help="seconds to wait to fill a batch")
    ] = 0.25,
    loglevel: Annotated[str, typer.Option("--loglevel")] = "info",
    advantage: Annotated[
        Literal["grpo", "dr_grpo"], typer.Option("--advantage", help="group advantage")
    ] = "grpo",
    per_component: Annotated[
        bool, typer.Option("--per-component", help="normalize each reward component, then sum")
    ] = False,
    band_pass: Annotated[
        tuple[float, float] | None,
        typer.Option("--band-pass", metavar="LO HI", help="flag groups outside this success rate"),
    ] = None,
    overlong: Annotated[
        tuple[int, int] | None,
        typer.Option("--overlong", metavar="MAX CACHE", help="DAPO overlong penalty (tokens)"),
    ] = None,
    group_timeout: Annotated[
        float, typer.Option("--group-timeout", help="event-time group timeout, seconds")
    ] = 300.0,
    group_wall_timeout: Annotated[
        float, typer.Option("--group-wall-timeout", help="wall-clock group timeout, seconds")
    ] = 30.0,
    domain_decay: Annotated[
        float, typer.Option("--domain-decay", help="weight kept per reward, (0, 1]")
    ] = 1.0,
    domain_warmup: Annotated[
        int, typer.Option("--domain-warmup", help="rewards before a domain standardizes")
    ] = 32,
    commit_mb: Annotated[
        int, typer.Option("--commit-mb", help="commit once decided rows hold this many MiB")
    ] = 64,
    commit_interval: Annotated[
        float, typer.Option("--commit-interval", help="commit at least this often, seconds")
    ] = 1.0,
    session_timeout: Annotated[
        float,
        typer.Option(
            "--session-timeout",
            help="Kafka session timeout: how long a killed worker holds its partitions, seconds",
        ),
    ] = 10.0,
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
    task_window: Annotated[
        int | None,
        typer.Option("--task-window", help="completed task ids remembered per partition (default: settings)"),
    ] = None,
    no_progress: Annotated[bool, typer.Option("--no-progress", help="no progress bars (logs, CI)")] = False,
) -> int:
    # Until the worker installs its own handlers, a stop request ends the command cleanly: nothing
    # has been consumed yet (without this, SIGTERM while importing killed it with -15).
    signal.signal(signal.SIGTERM, _exit_before_start)
    from schemas.profile import load_profile
    from stream_processors import create_app, run_worker
    from stream_processors.advantages import GroupNormalization, OverlongPenalty

    if workers > 1:
        from infra.cli.common import INVOCATION
        from infra.workers import run_workers, worker_argv

        return run_workers(worker_argv(INVOCATION), workers)
    settings = common.settings()
    app = create_app(
        verifiers=_verifiers(settings),
        sandbox_pool_size=settings.sandbox_pool_size,
        verifier_processes=settings.verifier_processes,
        bootstrap_servers=settings.bootstrap_servers,
        kafka_client=settings.kafka_client,
        lake_dir=settings.lake_uri,
        storage_options=settings.delta_storage_options(),
        raw_topic=settings.raw_topic,
        ultra_topic=None if no_ultra else settings.ultra_topic,
        dlq_topic=settings.dlq_topic,
        app_id=app_id,
        group_id=group_id,
        batch_size=batch_size,
        batch_within_s=batch_within,
        write_retries=write_retries,
        profile=load_profile(settings.profile_path or None),
        normalization=GroupNormalization(
            mode=advantage,
            per_component=per_component,
            band_pass=band_pass,
            overlong=OverlongPenalty(overlong[0], overlong[1]) if overlong else None,
        ),
        group_event_timeout_s=group_timeout,
        group_wall_timeout_s=group_wall_timeout,
        domain_decay=domain_decay,
        domain_warmup=domain_warmup,
        task_window=settings.task_window if task_window is None else task_window,
        commit_bytes=commit_mb * 2**20,
        commit_interval_s=commit_interval,
        session_timeout_s=session_timeout,
        instance_id=_instance_id(instance_id, worker_index, group_id or app_id),
        data_dir=settings.state_dir / ("faust" if worker_index is None else f"faust-{worker_index}"),
    )
    import threading

    from infra.progress_bars import Bars, bars_wanted, follow_catch_up
    from infra.watch import group_lag

    topics = (settings.raw_topic,) if no_ultra else (settings.raw_topic, settings.ultra_topic)
    stop = threading.Event()
    with Bars(enabled=bars_wanted() and not no_progress) as bars:
        follow_catch_up(
            bars,
            lambda: group_lag(settings.bootstrap_servers, topics, group_id or app_id, settings.kafka_client),
            stop=stop,
        )
        try:
            run_worker(app, loglevel=loglevel)
        finally:
            stop.set()
    return 0


def _exit_before_start(signum: int, _frame: object) -> None:
    raise SystemExit(0)


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
        bootstrap_servers=settings.bootstrap_servers,
        kafka_client=settings.kafka_client,
        progress=progress,
    )
    print(json.dumps(summary))
    return 0


@command(app, "learn", "train on the Delta table through the replay buffer, tracked in MLflow")
def learn(
    common: Common,
    steps: Annotated[
        int | None, typer.Option("--steps", help="optimizer steps (default 20; with --follow: until stopped)")
    ] = None,
    follow: Annotated[
        bool, typer.Option("--follow", help="keep training as the table grows, until SIGTERM / Ctrl-C")
    ] = False,
    experiment: Annotated[str, typer.Option("--experiment")] = "rollstream",
    checkpoint: Annotated[
        Path | None,
        typer.Option(
            "--checkpoint", help="one file for weights, optimizer, buffer position; resumed if present"
        ),
    ] = None,
    checkpoint_every: Annotated[int, typer.Option("--checkpoint-every")] = 10,
    rows_log: Annotated[
        Path | None, typer.Option("--rows-log", help="JSON lines naming each step's rows")
    ] = None,
    start_version: Annotated[
        int, typer.Option("--start-version", help="first table version read (time travel)")
    ] = 0,
    end_version: Annotated[
        int | None, typer.Option("--end-version", help="last table version read (default: latest at start)")
    ] = None,
    token_budget: Annotated[int, typer.Option("--token-budget", help="padded slots per batch")] = 16_384,
    max_length: Annotated[
        int, typer.Option("--max-length", help="prompt + response tokens kept per row")
    ] = 2048,
    vocab_size: Annotated[
        int | None, typer.Option("--vocab-size", help="default: the vocab_size setting (32768)")
    ] = None,
    no_profile_match: Annotated[
        bool, typer.Option("--no-profile-match", help="do not draw buckets in the profile's shares")
    ] = False,
    max_uses: Annotated[
        int | None, typer.Option("--max-uses", help="each row at most this many times, oldest first")
    ] = None,
    max_lag: Annotated[
        int | None, typer.Option("--max-lag", help="hard limit on learner version - policy_version")
    ] = None,
    half_life: Annotated[
        float | None, typer.Option("--half-life", help="freshness weight halves per this much lag")
    ] = None,
    priority_alpha: Annotated[
        float | None, typer.Option("--priority-alpha", help="prioritized by |advantage| ** alpha")
    ] = None,
    samples_per_insert: Annotated[
        float | None, typer.Option("--samples-per-insert", help="rate limit: rows sampled per row inserted")
    ] = None,
    min_size: Annotated[int, typer.Option("--min-size", help="rows inserted before the first sample")] = 1,
    capacity_rows: Annotated[
        int | None, typer.Option("--capacity-rows", help="most rows held (default: no row bound)")
    ] = None,
    capacity_tokens: Annotated[
        int, typer.Option("--capacity-tokens", help="most prompt + response tokens held (about 8 bytes each)")
    ] = 8_000_000,
    eviction: Annotated[Literal["oldest", "stalest"], typer.Option("--eviction")] = "oldest",
    lr: Annotated[float, typer.Option("--lr")] = 1e-3,
    clip_epsilon: Annotated[float, typer.Option("--clip-epsilon")] = 0.2,
    kl_coef: Annotated[
        float, typer.Option("--kl-coef", help="KL penalty to the initial policy (0: none)")
    ] = 0.0,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    no_progress: Annotated[bool, typer.Option("--no-progress", help="no progress bars (logs, CI)")] = False,
    policy: Annotated[
        str, typer.Option("--policy", help='"tiny", "transformer" or an import path "module:factory"')
    ] = "tiny",
    objective: Annotated[Literal["decoupled_ppo", "tis"], typer.Option("--objective")] = "decoupled_ppo",
    aggregation: Annotated[Literal["grpo", "dr_grpo"], typer.Option("--aggregation")] = "grpo",
    layout: Annotated[Literal["padded", "packed"], typer.Option("--layout", help="batch layout")] = "padded",
    device: Annotated[str, typer.Option("--device", help="cpu or cuda")] = "cpu",
    publish_every: Annotated[
        int | None,
        typer.Option(
            "--publish-every",
            help="publish the weights by version every N steps (lake/weights, the policies table); "
            "the learner's version is then the published number",
        ),
    ] = None,
    register_model: Annotated[
        str | None, typer.Option("--register-model", help="also register each version as this MLflow model")
    ] = None,
    announce: Annotated[
        bool,
        typer.Option("--announce", help="announce each version on the compacted rollouts.policies topic"),
    ] = False,
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

    from consumers import learn as run_learn
    from consumers.learner_metrics import LearnerMetrics
    from consumers.versioning import PublishOptions
    from infra.progress_bars import Bars, bars_wanted
    from schemas.metrics import serve_metrics

    if metrics_port is not None and not 0 <= metrics_port < 65536:
        raise UsageError(f"--metrics-port {metrics_port}; give a port, 0 for a free one, or leave it out")
    settings = common.settings()
    steps = steps if steps is not None else (None if follow else 20)
    publish = None
    if publish_every is not None:
        publish = PublishOptions(
            lake_uri=settings.lake_uri,
            every=publish_every,
            storage_options=settings.delta_storage_options(),
            model_name=register_model,
            kafka_config=settings.kafka_config() if announce else None,
        )
    bars = Bars(enabled=bars_wanted() and not no_progress)
    metrics = LearnerMetrics()
    server = None if metrics_port is None else serve_metrics(metrics.registry, port=metrics_port)
    if server is not None:
        progress(f"learn: metrics at http://127.0.0.1:{server.port}/metrics")
    with bars, contextlib.ExitStack() as closing:
        if server is not None:
            closing.callback(server.close)
        result = run_learn(
            table_uri=settings.lake_table_uri("trajectories"),
            storage_options=settings.delta_storage_options(),
            tracking_uri=settings.tracking_uri,
            experiment=experiment,
            steps=steps,
            lr=lr,
            clip_epsilon=clip_epsilon,
            kl_coef=kl_coef,
            seed=seed,
            checkpoint_path=checkpoint,
            checkpoint_every=checkpoint_every,
            rows_log=rows_log,
            policy=policy,
            objective=objective,
            aggregation=aggregation,
            layout=layout,
            device=device,
            publish=publish,
            progress=bars.line,
            on_step=lambda step, total: bars.advance("learn", step, total),
            stop=stop,
            metrics=metrics,
            follow=follow,
            start_version=start_version,
            end_version=end_version,
            token_budget=token_budget,
            max_length=max_length,
            vocab_size=vocab_size or settings.vocab_size,
            profile_path=settings.profile_path or None,
            profile_matched=not no_profile_match,
            max_uses=max_uses,
            max_lag=max_lag,
            half_life=half_life,
            priority_alpha=priority_alpha,
            samples_per_insert=samples_per_insert,
            min_size=min_size,
            capacity_rows=capacity_rows,
            capacity_tokens=capacity_tokens,
            eviction=eviction,
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
