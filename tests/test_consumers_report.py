"""The HTML report: every plot as a PNG file and inline, built from real Delta tables."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from consumers.exceptions import AnalyticsError
from consumers.report import build_report
from infra.exceptions import missing_tool
from schemas.profile import load_profile
from schemas.tables import DEAD_LETTERS_SCHEMA, TRAJECTORIES_SCHEMA

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def trajectory_rows(count: int) -> pa.Table:
    profile = load_profile()
    start = datetime(2026, 11, 30, 8, tzinfo=UTC)
    rows = []
    for i in range(count):
        length = 100 + (i * 97) % 5000
        task_type = ("math", "code", "extraction")[i % 3]
        rows.append(
            {
                "trajectory_id": f"t{i}",
                "group_id": f"g{i // 4}",
                "sample_index": i % 4,
                "group_size": 4,
                "domain": f"{task_type}/d{i % 7}",
                "task_type": task_type,
                "policy_version": i // 50,
                "prompt_tokens": [1] * 3,
                "response_tokens": [2] * 2,
                "response_logprobs": [-0.5] * 2,
                "response_text": "x",
                "finish_reason": "stop",
                "worker_id": "w",
                "created_at": start + timedelta(seconds=i),
                "metadata": [],
                "reward": float(i % 2),
                "reward_components": [("passed", float(i % 2))],
                "verifier": "v",
                "verifier_version": "1",
                "verifier_status": "ok" if i % 2 else "fail",
                "domain_reward": 0.0,
                "advantage": 0.0,
                "group_status": "complete",
                "length": length,
                "bucket": profile.bucket_of(length),
                "profile_id": profile.id,
                "ingested_at": start + timedelta(seconds=i + 2),
                "topic": "rollouts.raw",
                "partition": 0,
                "offset": i,
            }
        )
    return pa.Table.from_pylist(rows, schema=TRAJECTORIES_SCHEMA)


def test_report_writes_each_plot_as_png_and_inline(tmp_path):
    lake = tmp_path / "lake"
    write_deltalake(str(lake / "trajectories"), trajectory_rows(300), partition_by=["bucket"])
    letters = pa.Table.from_pylist(
        [
            {
                "reason": "bad",
                "error_type": "DecodeError",
                "raw": b"x",
                "key": None,
                "topic": "t",
                "partition": 0,
                "offset": 1,
                "failed_at": datetime.now(UTC),
            }
        ],
        schema=DEAD_LETTERS_SCHEMA,
    )
    write_deltalake(str(lake / "dead_letters"), letters)
    report = build_report(lake, tmp_path / "out")
    assert report.rows == 300 and report.dead_letters == 1 and len(report.images) == 8
    page = report.html_path.read_text()
    for image in report.images:
        data = image.read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 5_000
        assert base64.b64encode(data).decode() in page  # self-contained: the page carries the pixels
    assert "<td>code</td>" in page and "DecodeError" in page


def test_report_without_a_table_is_one_clear_error(tmp_path):
    with pytest.raises(AnalyticsError, match="no trajectories table"):
        build_report(tmp_path / "empty", tmp_path / "out")
    out = subprocess.run(
        [sys.executable, "-m", "infra.cli", "report", "--out", str(tmp_path / "o")],
        capture_output=True,
        text=True,
        env={**os.environ, "ROLLSTREAM_LAKE_URI": str(tmp_path / "empty")},
        timeout=120,
    )
    assert out.returncode == 2 and out.stderr.strip().count("\n") == 0, out.stderr
    assert json.dumps("no trajectories table")[1:-1] in out.stderr


def test_report_renders_in_headless_chromium_with_plots_drawn(tmp_path):
    import shutil

    import matplotlib.image
    import numpy as np

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, missing_tool("Debian's chromium", "chromium")
    lake = tmp_path / "lake"
    write_deltalake(str(lake / "trajectories"), trajectory_rows(200), partition_by=["bucket"])
    report = build_report(lake, tmp_path / "out")
    shot = tmp_path / "shot.png"
    result = subprocess.run(
        [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--enable-logging=stderr",
            "--v=0",
            "--window-size=1100,6000",
            f"--screenshot={shot}",
            report.html_path.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shot.exists(), result.stderr[-2000:]
    console = [line for line in result.stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]
    assert console == [], console
    pixels = matplotlib.image.imread(shot)[..., :3]
    ink = pixels.mean(axis=2) < 0.9  # anything not (near) white
    colour = np.ptp(pixels, axis=2) > 0.3  # saturated pixels: the plotted bars and lines
    assert ink.mean() > 0.02 and colour.sum() > 20_000
    # Every plot is drawn: each horizontal band holding an image has coloured pixels.
    rows_with_colour = np.flatnonzero(colour.any(axis=1))
    assert rows_with_colour.size > 1_000
