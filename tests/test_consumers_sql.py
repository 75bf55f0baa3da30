"""SQL over the lake with time travel, and table upkeep while a writer keeps appending."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta

import polars as pl
import pyarrow as pa
import pytest
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from consumers.exceptions import AnalyticsError
from consumers.sql import query, resolve_versions
from infra.exceptions import InfraError
from infra.maintenance import maintain_table
from schemas.tables import DEAD_LETTERS_SCHEMA


def letters(start: int, count: int, reason: str) -> pa.Table:
    now = datetime.now(UTC)
    return pa.Table.from_pylist(
        [
            {
                "reason": reason,
                "error_type": "DecodeError",
                "raw": b"\x00bad",
                "key": None,
                "topic": "rollouts.raw",
                "partition": 0,
                "offset": start + i,
                "failed_at": now,
            }
            for i in range(count)
        ],
        schema=DEAD_LETTERS_SCHEMA,
    )


@pytest.fixture
def lake(tmp_path):
    uri = str(tmp_path / "dead_letters")
    write_deltalake(uri, letters(0, 3, "garbage"), mode="append")  # version 0
    write_deltalake(uri, letters(3, 2, "truncated"), mode="append")  # version 1
    return tmp_path


def test_sql_reads_latest_and_travels_by_version_and_time(lake):
    sql = "SELECT reason, count(*) AS n FROM dead_letters GROUP BY reason ORDER BY reason"
    assert query(sql, lake_dir=lake).collect().rows() == [("garbage", 3), ("truncated", 2)]
    assert query(sql, lake_dir=lake, versions={"dead_letters": 0}).collect().rows() == [("garbage", 3)]
    assert query(sql, lake_dir=lake, versions=resolve_versions(sql, ["1"])).collect().height == 2
    later = datetime.now(UTC) + timedelta(hours=1)
    assert query(sql, lake_dir=lake, as_of=later).collect().height == 2
    with pytest.raises(AnalyticsError, match="did not exist at"):
        query(sql, lake_dir=lake, as_of=datetime(2020, 1, 1, tzinfo=UTC))


@pytest.mark.parametrize(
    ("sql", "versions", "message"),
    [
        ("SELEC reason FROM dead_letters", None, "query failed: sql parser error"),
        ("SELECT * FROM nope", None, "'nope' was not found"),
        ("SELECT * FROM dead_letters", {"dead_letters": 9}, "has no version at 9 \\(latest is 1\\)"),
        ("SELECT * FROM dead_letters", {"bogus": 1}, "unknown table 'bogus'"),
        ("SELECT * FROM trajectories", None, "'trajectories' was not found"),
    ],
)
def test_bad_queries_are_one_clear_line(lake, sql, versions, message):
    with pytest.raises(AnalyticsError, match=message) as caught:
        query(sql, lake_dir=lake, versions=versions).collect()
    assert "\n" not in str(caught.value)


@pytest.mark.slow(30)
def test_cli_sql_formats_and_errors(lake, tmp_path):
    env_lake = {"ROLLSTREAM_LAKE_URI": str(lake), "ROLLSTREAM_STATE_DIR": str(tmp_path / "state")}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        import os

        return subprocess.run(
            [sys.executable, "-m", "infra.cli", "sql", *args],
            capture_output=True,
            text=True,
            env={**os.environ, **env_lake},
            timeout=120,
        )

    out = run("SELECT count(*) AS n FROM dead_letters", "--format", "json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"n": 5}
    csv = run("SELECT offset FROM dead_letters ORDER BY offset", "--format", "csv", "--version", "0")
    assert csv.stdout.split() == ["offset", "0", "1", "2"]
    parquet = tmp_path / "out.parquet"
    assert run("SELECT * FROM dead_letters", "--format", "parquet", "--out", str(parquet)).returncode == 0
    assert pl.read_parquet(parquet).height == 5
    bad = run("SELECT * FROM dead_letters WHERE", "--format", "csv")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "error: query failed" in bad.stderr


def test_maintain_while_a_txn_writer_appends_keeps_rows_and_offsets(tmp_path):
    uri = str(tmp_path / "dead_letters")
    written = 0
    errors: list[BaseException] = []

    def append(offset: int) -> None:
        txn = Transaction("rollstream-test|rollouts.raw|0", offset, int(time.time() * 1000))
        write_deltalake(
            uri,
            letters(offset, 1, "x"),
            mode="append",
            commit_properties=CommitProperties(app_transactions=[txn]),
        )

    for offset in range(20):  # 20 small files to compact
        append(offset)
    written = 20
    stop = threading.Event()

    def writer() -> None:
        nonlocal written
        try:
            while not stop.is_set() and written < 80:
                append(written)
                written += 1
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        report = maintain_table(uri, delete=True)  # nothing is older than the 7-day retention
        with pytest.raises(InfraError, match="minimum retention"):
            maintain_table(uri, compact=False, checkpoint=False, retention_hours=0, delete=True)
    finally:
        stop.set()
        thread.join()
    assert not errors
    assert report.compaction["numFilesRemoved"] >= 20 and report.checkpointed
    assert report.vacuum_candidates == [] and not report.vacuumed
    table = DeltaTable(uri)
    frame = pl.read_delta(uri)
    assert frame.height == written and frame["offset"].n_unique() == written
    assert table.transaction_version("rollstream-test|rollouts.raw|0") == written - 1
    assert len(table.file_uris()) < written


@pytest.mark.parametrize("version", [0, 1])
@pytest.mark.parametrize("fmt", ["table", "csv", "json", "parquet"])
def test_cli_answers_match_polars_directly(lake, tmp_path, version, fmt):
    import os

    direct = (
        pl.read_delta(str(lake / "dead_letters"), version=version)
        .group_by("reason")
        .agg(pl.len().alias("n"), pl.col("offset").max().alias("last"))
        .sort("reason")
    )
    sql = (
        "SELECT reason, count(*) AS n, max(offset) AS last FROM dead_letters GROUP BY reason ORDER BY reason"
    )
    out_file = tmp_path / f"out.{fmt}"
    args = [sys.executable, "-m", "infra.cli", "sql", sql, "--version", str(version), "--format", fmt]
    if fmt == "parquet":
        args += ["--out", str(out_file)]
    result = subprocess.run(
        args,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "ROLLSTREAM_LAKE_URI": str(lake)},
    )
    assert result.returncode == 0, result.stderr
    if fmt == "csv":
        got = pl.read_csv(result.stdout.encode())
    elif fmt == "json":
        got = pl.read_ndjson(result.stdout.encode())
    elif fmt == "parquet":
        got = pl.read_parquet(out_file)
    else:
        for reason, n, last in direct.iter_rows():
            assert any(
                reason in line and f" {n} " in line and f" {last} " in line
                for line in result.stdout.splitlines()
            )
        return
    assert got.cast(direct.schema).equals(direct)
