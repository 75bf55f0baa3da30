"""The main job through its real command line: `rollstream demo --json` accounts for every message.

Runs against the broker that `bash infra/run.sh test` started (the demo's own `up` finds it
running through ROLLSTREAM_STATE_DIR), with a lake and tracking store of its own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from mlflow.tracking import MlflowClient


@pytest.mark.slow(56)
def test_demo_accounts_for_every_trajectory(tmp_path: Path, bootstrap_servers: str) -> None:
    tracking_uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = {
        **os.environ,
        "ROLLSTREAM_LAKE_URI": str(tmp_path / "lake"),
        "ROLLSTREAM_TRACKING_URI": tracking_uri,
        "ROLLSTREAM_KAFKA__BOOTSTRAP_SERVERS": bootstrap_servers,
    }
    # The demo's processor writes its log under the state dir; give it one when run by hand.
    env.setdefault("ROLLSTREAM_STATE_DIR", str(tmp_path / "state"))
    done = subprocess.run(
        [sys.executable, "-m", "infra.cli", "demo", "--trajectories", "1500", "--seed", "7",
         "--bad-fraction", "0.02", "--steps", "3", "--timeout", "300", "--json"],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])

    assert summary["published"] == 1500
    assert summary["dead_letters"] == 30
    assert summary["delta_rows"] + summary["dead_letters"] == summary["published"]
    assert summary["duplicates"] == 0 and summary["accounted_for"] is True
    assert "processed" in done.stderr  # progress is shown while it runs

    table = pl.read_delta(summary["table_uri"])
    assert table.height == summary["delta_rows"]
    assert table["trajectory_id"].n_unique() == table.height
    assert pl.read_delta(str(tmp_path / "lake" / "dead_letters")).height == 30

    run = MlflowClient(tracking_uri).get_run(summary["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    assert summary["tracking_uri"] == tracking_uri
