"""Commands for the local stack and the registries: up, down, status, domains, profile, offsets."""

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from infra.cli.common import Common, UsageError, command, progress
from schemas.defaults import StreamDefaults

app = typer.Typer()

profile_app = typer.Typer(help="inference workload profiles: fit one from a trace, show one")
offsets_app = typer.Typer(help="the offsets and state stored in the lake")


@command(app, "up", "start the local Kafka broker (and MLflow server) and provision topics")
def up(
    common: Common,
    mlflow_server: Annotated[
        bool, typer.Option("--mlflow-server", help="also start `mlflow server` on 127.0.0.1")
    ] = False,
    secure: Annotated[
        bool,
        typer.Option(
            "--secure",
            help="SASL/SCRAM over TLS with per-role users and ACLs (certificates generated; docs/security.md)",
        ),
    ] = False,
    object_store: Annotated[
        bool,
        typer.Option(
            "--object-store",
            help="also start MinIO on 127.0.0.1 for the lake (built once per machine with Go; docs/deploy.md)",
        ),
    ] = False,
) -> int:
    from infra import services

    status = services.up(
        common.settings(),
        mlflow_server=mlflow_server,
        secure=secure,
        object_store=object_store,
        progress=progress,
    )
    print(status.describe())
    return 0


@command(app, "down", "stop what `up` started, by pid")
def down(common: Common) -> int:
    from infra import services

    stopped = services.down(common.settings(), progress=progress)
    print("stopped: " + ", ".join(stopped) if stopped else "nothing was running")
    return 0


@command(app, "status", "report the local services (exit 3 when the broker is down)")
def status(
    common: Common,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
    watch: Annotated[
        bool,
        typer.Option(
            "--watch",
            help="live view: lag per partition, rows/s, tables, learner, metrics endpoints; Ctrl-C ends",
        ),
    ] = False,
    interval: Annotated[float, typer.Option("--interval", help="seconds between --watch refreshes")] = 2.0,
    iterations: Annotated[
        int | None, typer.Option("--iterations", help="stop --watch after this many refreshes")
    ] = None,
    group: Annotated[
        str, typer.Option("--group", help="the processor's consumer group, for lag")
    ] = StreamDefaults.app_id,
) -> int:
    from infra import services

    settings = common.settings()
    if watch:
        from infra.broker import broker_status
        from infra.watch import take_snapshot
        from infra.watch import watch as watch_view

        def look() -> Any:
            return take_snapshot(
                broker=broker_status(settings),
                bootstrap_servers=settings.bootstrap_servers,
                topics=(settings.raw_topic, settings.ultra_topic),
                lake_dir=settings.lake_uri,
                tracking_uri=settings.tracking_uri,
                group=group,
                storage_options=settings.delta_storage_options(),
                kafka_client=settings.kafka_client,
                state_dir=settings.state_dir,
            )

        watch_view(look, interval_s=interval, iterations=iterations)
        return 0
    found = services.status(settings)
    print(json.dumps(found.as_dict(), default=str) if as_json else found.describe())
    return 0 if found.running else 3


@command(app, "domains", "list the domain registry: each domain's task type, verifier and options")
def domains(
    common: Common,
    task_type: Annotated[str | None, typer.Option("--task-type", help="only this task type")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="one JSON object per line")] = False,
) -> int:
    from schemas.domains import DomainRegistry

    registry = DomainRegistry.load(common.settings().domain_registry or None)
    specs = [spec for _, spec in sorted(registry.items()) if not task_type or spec.task_type == task_type]
    for spec in specs:
        if as_json:
            row = {
                "domain": spec.name,
                "task_type": spec.task_type,
                "verifier": spec.verifier,
                "options": dict(spec.options),
            }
            print(json.dumps(row))
        else:
            own = ", ".join(f"{k}={v}" for k, v in sorted(spec.options.items()))
            print(f"{spec.name:32} {spec.task_type:12} {spec.verifier:12} {own}")
    print(f"{len(specs)} domains ({registry.source})", file=sys.stderr)
    return 0


def _floats(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"{text!r} is not a comma-separated list of numbers, e.g. 0.5,0.9") from None


@command(profile_app, "fit", "fit a profile from a trace of request lengths")
def profile_fit(
    common: Common,
    trace: Annotated[Path, typer.Argument(help="CSV or Parquet with prompt and generated token counts")],
    quantiles: Annotated[
        str | None, typer.Option("--quantiles", help="bucket edges at these quantiles of the total length")
    ] = None,
    edges: Annotated[
        str | None, typer.Option("--edges", help="bucket edges in tokens, e.g. 1024,4096")
    ] = None,
    names: Annotated[
        str | None, typer.Option("--names", help="bucket names, e.g. short,long,ultra_long")
    ] = None,
    source: Annotated[
        str | None, typer.Option("--source", help="where the trace came from (default: its path)")
    ] = None,
    out: Annotated[
        Path | None, typer.Option("--out", help="write the profile here (default: print it)")
    ] = None,
) -> int:
    from infra.profile_view import describe_profile
    from schemas.profile_fit import fit_profile, read_trace

    if quantiles and edges:
        raise UsageError("--quantiles and --edges exclude each other: give one")
    prompt, generated = read_trace(trace)
    profile = fit_profile(
        prompt,
        generated,
        quantiles=_floats(quantiles) if quantiles else None,
        edges=[int(x) for x in _floats(edges)] if edges else None,
        names=names.split(",") if names else None,
        source=source or str(trace),
    )
    print(describe_profile(profile, delivered=profile.mix(prompt + generated)))
    if out:
        print(f"\nwritten to {profile.save(out)} (use it: ROLLSTREAM_PROFILE_PATH={out})")
    else:
        print("\n" + profile.to_toml())
    return 0


@command(profile_app, "show", "print a profile with its histogram")
def profile_show(
    common: Common,
    file: Annotated[
        Path | None, typer.Argument(help="profile file (default: profile_path, else the shipped one)")
    ] = None,
) -> int:
    from infra.profile_view import describe_profile
    from schemas.profile import load_profile

    path = file or common.settings().profile_path or None
    print(describe_profile(load_profile(path)))
    return 0


@command(offsets_app, "reset", "start a recreated topic afresh at offset 0 (keeps the rows)")
def offsets_reset(
    common: Common,
    topic: Annotated[str, typer.Option("--topic", help="the recreated topic")],
    app_id: Annotated[str, typer.Option("--app-id", help="the processor's app id")] = "rollstream-processor",
) -> int:
    from schemas.profile import load_profile
    from stream_processors.offsets import TxnTable
    from stream_processors.preflight import topic_ids, topic_partitions
    from stream_processors.state import reset_topic

    settings = common.settings()
    client = settings.kafka_client
    partitions = topic_partitions(settings.bootstrap_servers, [topic], kafka_client=client)[topic]
    topic_id = topic_ids(settings.bootstrap_servers, [topic], kafka_client=client)[topic]
    options = settings.delta_storage_options()

    def table(name: str, partition_by: list[str] | None = None) -> TxnTable:
        uri = settings.lake_table_uri(name)
        return TxnTable(uri, app_id=app_id, partition_by=partition_by, storage_options=options)

    version = reset_topic(
        table("trajectories", ["bucket"]),
        table("dead_letters"),
        executions=table("executions"),
        topic=topic,
        partitions=partitions,
        topic_id=topic_id,
        profile_id=load_profile(settings.profile_path or None).id,
    )
    print(
        f"{topic} (id {topic_id}, {partitions} partitions) starts afresh at offset 0 for app id "
        f"{app_id!r}: trajectories version {version}; domain statistics kept"
    )
    return 0


@command(
    app,
    "settings",
    "print the effective settings (file, environment and flags folded) as one JSON object",
    sections=("stream", "sandbox", "learner", "replay"),
)
def settings(common: Common) -> int:
    print(json.dumps(common.settings().model_dump(mode="json"), sort_keys=True))
    return 0
