"""The `rollstream` command line: one sub-command per job, each a thin shell over the library.

This module is the edge of the system: it folds the config file, environment and flags into one
`Settings` object and passes plain keyword arguments down to the rooms.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaException

from infra.settings import Settings
from schemas.exceptions import RollstreamError


class UsageError(RollstreamError):
    """A flag's value cannot be used; the message says which and what to write."""


def _progress(message: str) -> None:
    print(f"[rollstream] {message}", file=sys.stderr, flush=True)


def _settings(args: argparse.Namespace) -> Settings:
    return Settings.load(
        args.config,
        state_dir=args.state_dir,
        kafka_port=args.kafka_port,
        controller_port=args.controller_port,
        mlflow_port=args.mlflow_port,
        brokers=args.brokers,
    )


def _up(args: argparse.Namespace) -> int:
    from infra import services

    status = services.up(
        _settings(args),
        mlflow_server=args.mlflow_server,
        secure=args.secure,
        object_store=args.object_store,
        progress=_progress,
    )
    print(status.describe())
    return 0


def _down(args: argparse.Namespace) -> int:
    from infra import services

    stopped = services.down(_settings(args), progress=_progress)
    print("stopped: " + ", ".join(stopped) if stopped else "nothing was running")
    return 0


def _status(args: argparse.Namespace) -> int:
    from infra import services

    settings = _settings(args)
    if args.watch:
        from infra.broker import broker_status
        from infra.watch import take_snapshot, watch

        def look() -> Any:
            return take_snapshot(
                broker=broker_status(settings),
                bootstrap_servers=settings.bootstrap_servers,
                topics=(settings.raw_topic, settings.ultra_topic),
                lake_dir=settings.lake_uri,
                tracking_uri=settings.tracking_uri,
                group=args.group,
                storage_options=settings.delta_storage_options(),
                kafka_client=settings.kafka_client,
            )

        watch(look, interval_s=args.interval, iterations=args.iterations)
        return 0
    status = services.status(settings)
    print(json.dumps(status.as_dict(), default=str) if args.json else status.describe())
    return 0 if status.running else 3


def _produce(args: argparse.Namespace) -> int:
    from producers.loadgen import LoadSpec, run_load
    from producers.progress import rate_bar

    settings = _settings(args)
    seed = random.SystemRandom().randrange(2**31) if args.seed is None else args.seed
    spec = LoadSpec(
        bootstrap_servers=settings.bootstrap_servers,
        topic=settings.raw_topic,
        ultra_topic=settings.ultra_topic,
        trajectories=args.trajectories,
        workers=args.workers,
        rate=args.rate,
        seed=seed,
        num_domains=args.domains,
        group_sizes=(args.group_size_min, args.group_size_max),
        ultra_share=args.ultra_share,
        malformed_share=args.malformed_share,
        profile_path=args.profile,
        lane=args.lane,
        extra_config=dict(settings.kafka_client),
    )
    _progress(
        f"publishing {spec.trajectories} messages from {spec.workers} processes to {spec.topic} "
        f"(seed {seed}, target {f'{spec.rate:g}/s' if spec.rate else 'as fast as possible'})"
    )
    with rate_bar(enabled=not args.no_progress) as update:
        report = run_load(spec, progress=update)
    print(json.dumps({"seed": seed, **report.as_dict()}))
    return 0 if report.failed == 0 and not report.as_dict()["errors"] else 1


def _verifiers(settings: Settings, versions: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
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


def _process(args: argparse.Namespace) -> int:
    from schemas.profile import load_profile
    from stream_processors import create_app, run_worker
    from stream_processors.advantages import GroupNormalization, OverlongPenalty

    if args.workers > 1:
        from infra.workers import run_workers, worker_argv

        return run_workers(worker_argv(args.argv), args.workers)
    settings = _settings(args)
    index = args.worker_index
    app = create_app(
        verifiers=_verifiers(settings),
        sandbox_pool_size=settings.sandbox_pool_size,
        bootstrap_servers=settings.bootstrap_servers,
        kafka_client=settings.kafka_client,
        lake_dir=settings.lake_uri,
        storage_options=settings.delta_storage_options(),
        raw_topic=settings.raw_topic,
        ultra_topic=None if args.no_ultra else settings.ultra_topic,
        dlq_topic=settings.dlq_topic,
        app_id=args.app_id,
        group_id=args.group_id,
        batch_size=args.batch_size,
        batch_within_s=args.batch_within,
        write_retries=args.write_retries,
        profile=load_profile(settings.profile_path or None),
        normalization=GroupNormalization(
            mode=args.advantage,
            per_component=args.per_component,
            band_pass=(args.band_pass[0], args.band_pass[1]) if args.band_pass else None,
            overlong=OverlongPenalty(args.overlong[0], args.overlong[1]) if args.overlong else None,
        ),
        group_event_timeout_s=args.group_timeout,
        group_wall_timeout_s=args.group_wall_timeout,
        domain_decay=args.domain_decay,
        domain_warmup=args.domain_warmup,
        commit_bytes=args.commit_mb * 2**20,
        commit_interval_s=args.commit_interval,
        session_timeout_s=args.session_timeout,
        instance_id=None if args.instance_id is None else f"{args.instance_id}-{index or 0}",
        data_dir=settings.state_dir / ("faust" if index is None else f"faust-{index}"),
    )
    run_worker(app, loglevel=args.loglevel)
    return 0


def _profile_fit(args: argparse.Namespace) -> int:
    from infra.profile_view import describe_profile
    from schemas.profile_fit import fit_profile, read_trace

    prompt, generated = read_trace(args.trace)
    profile = fit_profile(
        prompt,
        generated,
        quantiles=_floats(args.quantiles) if args.quantiles else None,
        edges=[int(x) for x in _floats(args.edges)] if args.edges else None,
        names=args.names.split(",") if args.names else None,
        source=args.source or str(args.trace),
    )
    print(describe_profile(profile, delivered=profile.mix(prompt + generated)))
    if args.out:
        print(f"\nwritten to {profile.save(args.out)} (use it: ROLLSTREAM_PROFILE_PATH={args.out})")
    else:
        print("\n" + profile.to_toml())
    return 0


def _profile_show(args: argparse.Namespace) -> int:
    from infra.profile_view import describe_profile
    from schemas.profile import load_profile

    path = args.file or _settings(args).profile_path or None
    print(describe_profile(load_profile(path)))
    return 0


def _offsets_reset(args: argparse.Namespace) -> int:
    from schemas.profile import load_profile
    from stream_processors.offsets import TxnTable
    from stream_processors.preflight import topic_ids, topic_partitions
    from stream_processors.state import reset_topic

    settings = _settings(args)
    client = settings.kafka_client
    partitions = topic_partitions(settings.bootstrap_servers, [args.topic], kafka_client=client)[args.topic]
    topic_id = topic_ids(settings.bootstrap_servers, [args.topic], kafka_client=client)[args.topic]
    options = settings.delta_storage_options()

    def table(name: str, partition_by: list[str] | None = None) -> TxnTable:
        uri = settings.lake_table_uri(name)
        return TxnTable(uri, app_id=args.app_id, partition_by=partition_by, storage_options=options)

    version = reset_topic(
        table("trajectories", ["bucket"]),
        table("dead_letters"),
        executions=table("executions"),
        topic=args.topic,
        partitions=partitions,
        topic_id=topic_id,
        profile_id=load_profile(settings.profile_path or None).id,
    )
    print(
        f"{args.topic} (id {topic_id}, {partitions} partitions) starts afresh at offset 0 for app id "
        f"{args.app_id!r}: trajectories version {version}; domain statistics kept"
    )
    return 0


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def _domains(args: argparse.Namespace) -> int:
    from schemas.domains import DomainRegistry

    registry = DomainRegistry.load(_settings(args).domain_registry or None)
    specs = [
        spec
        for name, spec in sorted(registry.items())
        if not args.task_type or spec.task_type == args.task_type
    ]
    for spec in specs:
        if args.json:
            print(
                json.dumps(
                    {
                        "domain": spec.name,
                        "task_type": spec.task_type,
                        "verifier": spec.verifier,
                        "options": dict(spec.options),
                    }
                )
            )
        else:
            own = ", ".join(f"{k}={v}" for k, v in sorted(spec.options.items()))
            print(f"{spec.name:32} {spec.task_type:12} {spec.verifier:12} {own}")
    print(f"{len(specs)} domains ({registry.source})", file=sys.stderr)
    return 0


def _rescore(args: argparse.Namespace) -> int:
    from stream_processors.rescore import rescore

    settings = _settings(args)
    summary = rescore(
        lake_dir=settings.lake_uri,
        storage_options=settings.delta_storage_options(),
        domain=args.domain,
        verifier_version=args.verifier_version,
        table_version=args.table_version,
        verifiers=_verifiers(settings),
        bootstrap_servers=settings.bootstrap_servers,
        kafka_client=settings.kafka_client,
        progress=_progress,
    )
    print(json.dumps(summary))
    return 0


def _learn(args: argparse.Namespace) -> int:
    import signal
    import threading

    from consumers import learn

    settings = _settings(args)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    steps = args.steps if args.steps is not None else (None if args.follow else 20)
    result = learn(
        table_uri=settings.lake_table_uri("trajectories"),
        storage_options=settings.delta_storage_options(),
        tracking_uri=settings.tracking_uri,
        experiment=args.experiment,
        steps=steps,
        lr=args.lr,
        clip_epsilon=args.clip_epsilon,
        kl_coef=args.kl_coef,
        seed=args.seed,
        checkpoint_path=args.checkpoint,
        checkpoint_every=args.checkpoint_every,
        rows_log=args.rows_log,
        progress=_progress,
        stop=stop,
        follow=args.follow,
        start_version=args.start_version,
        end_version=args.end_version,
        token_budget=args.token_budget,
        max_length=args.max_length,
        vocab_size=args.vocab_size or settings.vocab_size,
        profile_path=settings.profile_path or None,
        profile_matched=not args.no_profile_match,
        max_uses=args.max_uses,
        max_lag=args.max_lag,
        half_life=args.half_life,
        priority_alpha=args.priority_alpha,
        samples_per_insert=args.samples_per_insert,
        min_size=args.min_size,
        capacity_rows=args.capacity_rows,
        capacity_tokens=args.capacity_tokens,
        eviction=args.eviction,
    )
    print(json.dumps(result.as_dict()))
    return 0


def _sql(args: argparse.Namespace) -> int:
    from datetime import datetime

    from consumers.sql import query, resolve_versions

    settings = _settings(args)
    as_of = None
    if args.as_of:
        try:
            as_of = datetime.fromisoformat(args.as_of)
        except ValueError:
            raise UsageError(
                f"--as-of {args.as_of!r} is not an ISO timestamp, e.g. 2026-11-30T08:00:00+00:00"
            ) from None
    frame = query(
        args.query,
        lake_dir=settings.lake_uri,
        versions=resolve_versions(args.query, args.version),
        as_of=as_of,
        storage_options=settings.delta_storage_options(),
    )
    result = frame.collect()
    if args.format == "table":
        import polars as pl

        with pl.Config(tbl_rows=args.max_rows, tbl_cols=-1, fmt_str_lengths=60, fmt_table_cell_list_len=4):
            print(result)
    elif args.format == "csv":
        result.write_csv(args.out or sys.stdout)
    elif args.format == "json":
        result.write_ndjson(args.out or sys.stdout)
    else:
        if args.out is None and sys.stdout.isatty():
            raise UsageError("--format parquet writes binary: pass --out FILE or redirect stdout")
        result.write_parquet(args.out or sys.stdout.buffer)
    return 0


def _maintain(args: argparse.Namespace) -> int:
    from consumers.sql import existing_tables, table_location
    from infra.maintenance import maintain_table

    settings = _settings(args)
    options = settings.delta_storage_options()
    names = args.table or existing_tables(settings.lake_uri, storage_options=options)
    if not names:
        raise UsageError(f"no Delta tables under {settings.lake_uri}: nothing to maintain")
    for name in names:
        report = maintain_table(
            table_location(settings.lake_uri, name),
            storage_options=options,
            compact=not args.no_compact,
            checkpoint=not args.no_checkpoint,
            vacuum=not args.no_vacuum,
            delete=args.yes,
            retention_hours=args.retention_hours,
            progress=_progress,
        )
        print(json.dumps({"name": name, **report.as_dict()}))
    if not args.yes and not args.no_vacuum:
        _progress("vacuum was a dry run: run again with --yes to delete the files counted above")
    return 0


def _report(args: argparse.Namespace) -> int:
    from consumers.report import build_report

    settings = _settings(args)
    report = build_report(
        settings.lake_uri, args.out, progress=_progress, storage_options=settings.delta_storage_options()
    )
    _progress(f"open {report.html_path}")
    print(json.dumps(report.as_dict()))
    return 0


def _demo(args: argparse.Namespace) -> int:
    from infra.demo import run_demo

    summary = run_demo(
        _settings(args),
        trajectories=args.trajectories,
        seed=args.seed,
        bad_fraction=args.bad_fraction,
        learn_steps=args.steps,
        timeout_s=args.timeout,
        progress=_progress,
    )
    print(summary.describe())
    if args.json:
        print(json.dumps(summary.as_dict()))
    return 0 if summary.accounted_for else 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rollstream", description=__doc__)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", type=Path, help="settings file (default ./rollstream.toml if present)")
    common.add_argument("--state-dir", type=Path, help="where services keep data, logs and pid files")
    common.add_argument("--kafka-port", type=int, help="the broker's client port on 127.0.0.1")
    common.add_argument("--controller-port", type=int, help="the KRaft controller port on 127.0.0.1")
    common.add_argument(
        "--mlflow-port", type=int, help="the MLflow server's port on 127.0.0.1 (up --mlflow-server)"
    )
    common.add_argument(
        "--brokers", type=int, help="local Kafka nodes (up starts a KRaft cluster of this many; default 1)"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(
        name: str, handler: Callable[[argparse.Namespace], int], help_: str
    ) -> argparse.ArgumentParser:
        p = sub.add_parser(name, parents=[common], help=help_, description=help_)
        p.set_defaults(handler=handler)
        return p

    p = command("up", _up, "start the local Kafka broker (and MLflow server) and provision topics")
    p.add_argument("--mlflow-server", action="store_true", help="also start `mlflow server` on 127.0.0.1")
    p.add_argument(
        "--secure",
        action="store_true",
        help="SASL/SCRAM over TLS with per-role users and ACLs (certificates generated; docs/security.md)",
    )
    p.add_argument(
        "--object-store",
        action="store_true",
        help="also start MinIO on 127.0.0.1 for the lake (built once per machine with Go; docs/deploy.md)",
    )
    command("down", _down, "stop what `up` started, by pid")
    p = command("status", _status, "report the local services (exit 3 when the broker is down)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--watch",
        action="store_true",
        help="live view: lag per partition, rows/s, tables, learner; Ctrl-C ends",
    )
    p.add_argument("--interval", type=float, default=2.0, help="seconds between --watch refreshes")
    p.add_argument("--iterations", type=int, default=None, help="stop --watch after this many refreshes")
    p.add_argument("--group", default="rollstream-processor", help="the processor's consumer group, for lag")

    p = command(
        "produce", _produce, "load generator: worker processes publish a synthetic fleet at a target rate"
    )
    p.add_argument("--trajectories", type=int, default=10_000, help="messages in all, malformed included")
    p.add_argument("--workers", type=int, default=4, help="publishing processes")
    p.add_argument(
        "--rate", type=float, default=None, help="target messages/s over all workers (default: flat out)"
    )
    p.add_argument("--seed", type=int, default=None, help="fleet seed (default: a fresh one, printed)")
    p.add_argument("--domains", type=int, default=300, help="size of the fleet's domain catalog")
    p.add_argument("--group-size-min", type=int, default=8)
    p.add_argument("--group-size-max", type=int, default=16)
    p.add_argument(
        "--ultra-share", type=float, default=0.0, help="share of ultra-long samples (600k-1M tokens)"
    )
    p.add_argument("--malformed-share", type=float, default=0.005, help="share of malformed messages")
    p.add_argument("--profile", type=Path, default=None, help="workload profile lengths are drawn from")
    p.add_argument("--lane", choices=["throughput", "latency"], default="throughput")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (logs, CI)")

    p = command("process", _process, "run the Faust stream processor until stopped (SIGTERM / Ctrl-C)")
    p.add_argument(
        "--app-id", default="rollstream-processor", help="names the offsets stored in Delta; keep it stable"
    )
    p.add_argument("--group-id", default=None, help="Kafka consumer group (default: the app id)")
    p.add_argument(
        "--write-retries", type=int, default=5, help="Delta write attempts before the worker stops"
    )
    p.add_argument("--no-ultra", action="store_true", help="do not consume the ultra-long topic")
    p.add_argument("--batch-size", type=int, default=500)
    p.add_argument("--batch-within", type=float, default=0.25, help="seconds to wait to fill a batch")
    p.add_argument("--loglevel", default="info")
    p.add_argument("--advantage", choices=["grpo", "dr_grpo"], default="grpo", help="group advantage")
    p.add_argument("--per-component", action="store_true", help="normalize each reward component, then sum")
    p.add_argument(
        "--band-pass", type=float, nargs=2, metavar=("LO", "HI"), help="flag groups outside this success rate"
    )
    p.add_argument(
        "--overlong", type=int, nargs=2, metavar=("MAX", "CACHE"), help="DAPO overlong penalty (tokens)"
    )
    p.add_argument("--group-timeout", type=float, default=300.0, help="event-time group timeout, seconds")
    p.add_argument("--group-wall-timeout", type=float, default=30.0, help="wall-clock group timeout, seconds")
    p.add_argument("--domain-decay", type=float, default=1.0, help="weight kept per reward, (0, 1]")
    p.add_argument("--domain-warmup", type=int, default=32, help="rewards before a domain standardizes")
    p.add_argument("--commit-mb", type=int, default=64, help="commit once decided rows hold this many MiB")
    p.add_argument("--commit-interval", type=float, default=1.0, help="commit at least this often, seconds")
    p.add_argument(
        "--session-timeout",
        type=float,
        default=10.0,
        help="Kafka session timeout: how long a killed worker holds its partitions, seconds",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        help="worker processes in the consumer group (one per partition at most)",
    )
    p.add_argument(
        "--instance-id",
        default=None,
        help="static group membership: worker i is '<id>-i'; a restart within the session timeout keeps its partitions",
    )
    p.add_argument("--worker-index", type=int, default=None, help=argparse.SUPPRESS)

    profile = sub.add_parser("profile", help="inference workload profiles: fit one from a trace, show one")
    profile_sub = profile.add_subparsers(dest="profile_command", required=True, metavar="ACTION")
    p = profile_sub.add_parser("fit", parents=[common], help="fit a profile from a trace of request lengths")
    p.set_defaults(handler=_profile_fit)
    p.add_argument("trace", type=Path, help="CSV or Parquet with prompt and generated token counts")
    how = p.add_mutually_exclusive_group()
    how.add_argument("--quantiles", help="bucket edges at these quantiles of the total length, e.g. 0.5,0.9")
    how.add_argument("--edges", help="bucket edges in tokens, e.g. 1024,4096")
    p.add_argument("--names", help="bucket names, e.g. short,long,ultra_long")
    p.add_argument("--source", help="where the trace came from (default: its path)")
    p.add_argument("--out", type=Path, help="write the profile here (default: print it)")
    p = profile_sub.add_parser("show", parents=[common], help="print a profile with its histogram")
    p.set_defaults(handler=_profile_show)
    p.add_argument(
        "file", type=Path, nargs="?", help="profile file (default: profile_path, else the shipped one)"
    )

    offsets = sub.add_parser("offsets", help="the offsets and state stored in the lake")
    offsets_sub = offsets.add_subparsers(dest="offsets_command", required=True, metavar="ACTION")
    p = offsets_sub.add_parser(
        "reset", parents=[common], help="start a recreated topic afresh at offset 0 (keeps the rows)"
    )
    p.set_defaults(handler=_offsets_reset)
    p.add_argument("--topic", required=True)
    p.add_argument("--app-id", default="rollstream-processor")

    p = command(
        "domains", _domains, "list the domain registry: each domain's task type, verifier and options"
    )
    p.add_argument("--task-type", default=None, help="only this task type")
    p.add_argument("--json", action="store_true", help="one JSON object per line")

    p = command(
        "rescore", _rescore, "judge stored trajectories with a verifier version; write the rescores table"
    )
    p.add_argument("--domain", required=True, help="the domain to rescore")
    p.add_argument("--verifier-version", required=True, help="the verifier version to judge with")
    p.add_argument(
        "--table-version", type=int, default=None, help="the trajectories version (default latest)"
    )

    p = command("learn", _learn, "train on the Delta table through the replay buffer, tracked in MLflow")
    _learn_arguments(p)

    p = command(
        "sql", _sql, "run SQL over the lake's tables (trajectories, dead_letters, ...), with time travel"
    )
    p.add_argument("query", help='e.g. "SELECT domain, avg(reward) FROM trajectories GROUP BY domain"')
    p.add_argument(
        "--version",
        action="append",
        default=[],
        metavar="[TABLE=]N",
        help="read a table at version N (repeatable; a bare N applies to the one table the query names)",
    )
    p.add_argument("--as-of", help="read every table as it was at this ISO timestamp")
    p.add_argument("--format", choices=("table", "csv", "json", "parquet"), default="table")
    p.add_argument("--out", type=Path, help="write csv/json/parquet to this file instead of stdout")
    p.add_argument("--max-rows", type=int, default=40, help="rows shown by --format table")

    p = command(
        "maintain",
        _maintain,
        "compact, checkpoint and vacuum the lake's tables (vacuum: dry run unless --yes)",
    )
    p.add_argument(
        "--table", action="append", help="a table name (repeatable; default every table in the lake)"
    )
    p.add_argument("--retention-hours", type=int, default=168, help="versions kept readable by vacuum")
    p.add_argument("--yes", action="store_true", help="really delete the files vacuum finds")
    p.add_argument("--no-compact", action="store_true")
    p.add_argument("--no-checkpoint", action="store_true")
    p.add_argument("--no-vacuum", action="store_true")

    p = command("report", _report, "write an HTML report (and a PNG per plot) of the lake's tables")
    p.add_argument("--out", type=Path, default=Path("rollstream-report"), help="directory to write into")

    p = command("demo", _demo, "up, publish, process, learn, and print where every trajectory went")
    p.add_argument("--trajectories", type=int, default=10_000)
    p.add_argument("--seed", type=int, default=None, help="fleet seed (default: a fresh one, printed)")
    p.add_argument("--bad-fraction", type=float, default=0.005, help="share of malformed messages")
    p.add_argument("--steps", type=int, default=20, help="learner steps")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds to wait for the processor")
    p.add_argument("--json", action="store_true", help="end with the summary as one JSON object")
    return parser


def _learn_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--steps", type=int, default=None, help="optimizer steps (default 20; with --follow: until stopped)"
    )
    p.add_argument(
        "--follow", action="store_true", help="keep training as the table grows, until SIGTERM / Ctrl-C"
    )
    p.add_argument("--experiment", default="rollstream")
    p.add_argument(
        "--checkpoint",
        type=Path,
        default=None,
        help="one file for weights, optimizer, buffer position; resumed if present",
    )
    p.add_argument("--checkpoint-every", type=int, default=10)
    p.add_argument("--rows-log", type=Path, default=None, help="JSON lines naming each step's rows")
    p.add_argument("--start-version", type=int, default=0, help="first table version read (time travel)")
    p.add_argument(
        "--end-version", type=int, default=None, help="last table version read (default: latest at start)"
    )
    p.add_argument("--token-budget", type=int, default=16_384, help="padded slots per batch")
    p.add_argument("--max-length", type=int, default=2048, help="prompt + response tokens kept per row")
    p.add_argument("--vocab-size", type=int, default=None, help="default: the vocab_size setting (32768)")
    p.add_argument(
        "--no-profile-match", action="store_true", help="do not draw buckets in the profile's shares"
    )
    p.add_argument(
        "--max-uses", type=int, default=None, help="each row at most this many times, oldest first"
    )
    p.add_argument("--max-lag", type=int, default=None, help="hard limit on learner version - policy_version")
    p.add_argument("--half-life", type=float, default=None, help="freshness weight halves per this much lag")
    p.add_argument("--priority-alpha", type=float, default=None, help="prioritized by |advantage| ** alpha")
    p.add_argument(
        "--samples-per-insert", type=float, default=None, help="rate limit: rows sampled per row inserted"
    )
    p.add_argument("--min-size", type=int, default=1, help="rows inserted before the first sample")
    p.add_argument("--capacity-rows", type=int, default=None, help="most rows held (default: no row bound)")
    p.add_argument(
        "--capacity-tokens",
        type=int,
        default=8_000_000,
        help="most prompt + response tokens held (about 8 bytes each)",
    )
    p.add_argument("--eviction", choices=["oldest", "stalest"], default="oldest")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--clip-epsilon", type=float, default=0.2)
    p.add_argument("--kl-coef", type=float, default=0.0, help="KL penalty to the initial policy (0: none)")
    p.add_argument("--seed", type=int, default=0)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `rollstream` console script."""
    args = _parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return handler(args)
    except RollstreamError as exc:
        print(f"rollstream {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KafkaException as exc:
        print(
            f"rollstream {args.command}: error: Kafka: {exc.args[0].str() if exc.args else exc}; "
            "is the broker up? `rollstream status` tells, `rollstream up` starts it",
            file=sys.stderr,
        )
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
