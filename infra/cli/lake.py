"""Commands that read or tend the lake: sql, maintain, report."""

import json
import sys
from pathlib import Path
from typing import Annotated, Literal

import typer

from infra.cli.common import Common, UsageError, command, progress

app = typer.Typer()


@command(app, "sql", "run SQL over the lake's tables (trajectories, dead_letters, ...), with time travel")
def sql(
    common: Common,
    query: Annotated[
        str, typer.Argument(help='e.g. "SELECT domain, avg(reward) FROM trajectories GROUP BY domain"')
    ],
    version: Annotated[
        list[str],
        typer.Option(
            "--version",
            metavar="[TABLE=]N",
            help="read a table at version N (repeatable; a bare N applies to the one table the query names)",
        ),
    ] = [],  # noqa: B006 (typer reads the default; it is never mutated)
    as_of: Annotated[
        str | None, typer.Option("--as-of", help="read every table as it was at this ISO timestamp")
    ] = None,
    fmt: Annotated[Literal["table", "csv", "json", "parquet"], typer.Option("--format")] = "table",
    out: Annotated[
        Path | None, typer.Option("--out", help="write csv/json/parquet to this file instead of stdout")
    ] = None,
    max_rows: Annotated[int, typer.Option("--max-rows", help="rows shown by --format table")] = 40,
) -> int:
    from datetime import datetime

    from consumers.sql import query as run_query
    from consumers.sql import resolve_versions

    settings = common.settings()
    when = None
    if as_of:
        try:
            when = datetime.fromisoformat(as_of)
        except ValueError:
            raise UsageError(
                f"--as-of {as_of!r} is not an ISO timestamp, e.g. 2026-11-30T08:00:00+00:00"
            ) from None
    frame = run_query(
        query,
        lake_dir=settings.lake_uri,
        versions=resolve_versions(query, version),
        as_of=when,
        storage_options=settings.delta_storage_options(),
    )
    result = frame.collect()
    if fmt == "table":
        import polars as pl

        with pl.Config(tbl_rows=max_rows, tbl_cols=-1, fmt_str_lengths=60, fmt_table_cell_list_len=4):
            print(result)
    elif fmt == "csv":
        result.write_csv(out or sys.stdout)
    elif fmt == "json":
        result.write_ndjson(out or sys.stdout)
    else:
        if out is None and sys.stdout.isatty():
            raise UsageError("--format parquet writes binary: pass --out FILE or redirect stdout")
        result.write_parquet(out or sys.stdout.buffer)
    return 0


@command(app, "maintain", "compact, checkpoint and vacuum the lake's tables (vacuum: dry run unless --yes)")
def maintain(
    common: Common,
    table: Annotated[
        list[str], typer.Option("--table", help="a table name (repeatable; default every table in the lake)")
    ] = [],  # noqa: B006 (typer reads the default; it is never mutated)
    retention_hours: Annotated[
        int, typer.Option("--retention-hours", help="versions kept readable by vacuum")
    ] = 168,
    yes: Annotated[bool, typer.Option("--yes", help="really delete the files vacuum finds")] = False,
    no_compact: Annotated[bool, typer.Option("--no-compact")] = False,
    no_checkpoint: Annotated[bool, typer.Option("--no-checkpoint")] = False,
    no_vacuum: Annotated[bool, typer.Option("--no-vacuum")] = False,
) -> int:
    from consumers.sql import existing_tables
    from infra.maintenance import maintain_table
    from stream_processors.delta_sink import writer_properties

    settings = common.settings()
    options = settings.delta_storage_options()
    names = table or existing_tables(settings.lake_uri, storage_options=options)
    if not names:
        raise UsageError(f"no Delta tables under {settings.lake_uri}: nothing to maintain")
    for name in names:
        report = maintain_table(
            settings.lake_table_uri(name),
            compact=not no_compact,
            checkpoint=not no_checkpoint,
            vacuum=not no_vacuum,
            delete=yes,
            retention_hours=retention_hours,
            storage_options=options,
            writer_properties=writer_properties() if name == "trajectories" else None,
            progress=progress,
        )
        print(json.dumps({"name": name, **report.as_dict()}))
    if not yes and not no_vacuum:
        progress("vacuum was a dry run: run again with --yes to delete the files counted above")
    return 0


@command(app, "report", "write an HTML report (and a PNG per plot) of the lake's tables")
def report(
    common: Common,
    out: Annotated[Path, typer.Option("--out", help="directory to write into")] = Path("rollstream-report"),
) -> int:
    from consumers.report import build_report

    settings = common.settings()
    built = build_report(
        settings.lake_uri, out, progress=progress, storage_options=settings.delta_storage_options()
    )
    progress(f"open {built.html_path}")
    print(json.dumps(built.as_dict()))
    return 0
