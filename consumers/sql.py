"""SQL and Polars over the lake's Delta tables, with time travel by version or timestamp.

Every table that exists under the lake is registered under its name (trajectories, dead_letters,
executions, rescores) as a lazy polars scan, so a query reads only the columns and files it needs.
Reads go through polars, never an Arrow dataset (HAZARDS.md: those can abort at exit).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import polars as pl
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError

from consumers.exceptions import AnalyticsError
from schemas.history import newest_first

TABLES: tuple[str, ...] = ("trajectories", "dead_letters", "executions", "rescores")
"""The tables the pipeline writes under the lake, in flow order."""

TimeTravel = int | datetime


def table_location(lake_dir: Path | str, name: str) -> str:
    """The URI of table `name` under a lake directory or object-store URI."""
    if isinstance(lake_dir, str) and "://" in lake_dir:
        return f"{lake_dir.rstrip('/')}/{name}"
    return str(Path(lake_dir).expanduser().resolve() / name)


def existing_tables(lake_dir: Path | str, *, storage_options: Mapping[str, str] | None = None) -> list[str]:
    """The names in TABLES that are Delta tables under `lake_dir`."""
    options = dict(storage_options) if storage_options else None
    return [
        name
        for name in TABLES
        if DeltaTable.is_deltatable(table_location(lake_dir, name), storage_options=options)
    ]


def scan_table(
    lake_dir: Path | str,
    name: str,
    *,
    at: TimeTravel | None = None,
    storage_options: Mapping[str, str] | None = None,
) -> pl.LazyFrame:
    """A lazy scan of one table, at a version number or a timestamp (default: the latest)."""
    if name not in TABLES:
        raise AnalyticsError(f"unknown table {name!r}: the lake's tables are {', '.join(TABLES)}")
    uri = table_location(lake_dir, name)
    options = dict(storage_options) if storage_options else None
    if not DeltaTable.is_deltatable(uri, storage_options=options):
        raise AnalyticsError(f"table {name!r} does not exist yet at {uri}: `rollstream process` writes it")
    if isinstance(at, datetime):
        at = version_at(uri, at, storage_options=options)
    try:
        frame = pl.scan_delta(uri, version=at, storage_options=options)
        frame.collect_schema()  # resolves the version now, so a bad one fails here, in one line
    except (DeltaError, pl.exceptions.PolarsError, ValueError, OSError) as exc:
        latest = DeltaTable(uri, storage_options=options).version()
        raise AnalyticsError(
            f"table {name!r} has no version at {at!r} (latest is {latest}): {_first_line(exc)}"
        ) from exc
    return frame


def version_at(uri: str, when: datetime, *, storage_options: Mapping[str, str] | None = None) -> int:
    """The latest version of the table at `uri` committed at or before `when`."""
    if when.tzinfo is None:
        raise AnalyticsError(f"--as-of {when.isoformat()} has no time zone: add one, e.g. +00:00")
    stamp_ms = when.timestamp() * 1000
    table = DeltaTable(uri, storage_options=dict(storage_options) if storage_options else None)
    first: dict[str, Any] = {}
    for first in newest_first(table):  # the newest commit made by then, without reading the whole log
        if first.get("timestamp", 0) <= stamp_ms:
            return int(first["version"])
    raise AnalyticsError(
        f"{uri} did not exist at {when.isoformat()}: its first commit is at "
        f"{datetime.fromtimestamp(first.get('timestamp', 0) / 1000, tz=when.tzinfo).isoformat()}"
    )


def query(
    sql: str,
    *,
    lake_dir: Path | str,
    versions: Mapping[str, int] | None = None,
    as_of: datetime | None = None,
    storage_options: Mapping[str, str] | None = None,
) -> pl.LazyFrame:
    """Run `sql` over the lake's tables and return the result as a lazy frame.

    Args:
        sql: a query naming tables by their names in TABLES (polars SQL dialect).
        lake_dir: the lake directory or object-store URI.
        versions: table name -> version to read (time travel by version).
        as_of: read every table as it was at this time (time travel by timestamp).
        storage_options: deltalake options for object stores.
    """
    if versions and as_of is not None:
        raise AnalyticsError("give table versions or --as-of, not both")
    for name in versions or {}:
        if name not in TABLES:
            raise AnalyticsError(
                f"unknown table {name!r} in --version: the lake's tables are {', '.join(TABLES)}"
            )
    present = existing_tables(lake_dir, storage_options=storage_options)
    wanted = [name for name in present if re.search(rf"\b{name}\b", sql, re.IGNORECASE)]
    frames = {
        name: scan_table(
            lake_dir, name, at=(versions or {}).get(name, as_of), storage_options=storage_options
        )
        for name in wanted
    }
    context = pl.SQLContext(frames)
    try:
        result = context.execute(sql, eager=False)
        result.collect_schema()
    except (pl.exceptions.PolarsError, ValueError) as exc:
        known = ", ".join(present) or "none yet"
        raise AnalyticsError(f"query failed: {_first_line(exc)} (tables present: {known})") from exc
    return result


def resolve_versions(sql: str, specs: list[str]) -> dict[str, int]:
    """Parse --version values, `N` or `TABLE=N`; a bare N applies to the one table the query names."""
    out: dict[str, int] = {}
    for spec in specs:
        name, _, number = spec.rpartition("=")
        if not number.isdigit():
            raise AnalyticsError(f"--version {spec!r}: expected N or TABLE=N with N a version number")
        if not name:
            named = [t for t in TABLES if re.search(rf"\b{t}\b", sql, re.IGNORECASE)]
            if len(named) != 1:
                raise AnalyticsError(
                    f"--version {spec} is ambiguous: the query names {named or 'no table'}; "
                    "write --version TABLE=N for each"
                )
            name = named[0]
        out[name] = int(number)
    return out


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]
