"""The typer command line: exit codes, one-line errors, and the settings flags every command takes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from infra.cli import main
from infra.cli.common import Common
from infra.metrics_endpoints import registered, registration_path, url_for
from producers.rollout_metrics import RolloutMetrics
from schemas.metrics import serve_metrics

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in list(os.environ):
        if name.startswith("ROLLSTREAM_") and name != "ROLLSTREAM_CACHE":
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["nope"], "rollstream: error: No such command 'nope'; see `rollstream --help`"),
        (["status", "--kafka-port", "x"], "rollstream status: error: Invalid value for '--kafka-port'"),
        (["process", "--band-pass", "0.1"], "rollstream process: error: Option '--band-pass' requires 2"),
        (["produce", "--lane", "fast"], "rollstream produce: error: Invalid value for '--lane'"),
        (
            ["status", "--kafka-client", "nope"],
            "rollstream status: error: --kafka-client 'nope': give KEY=VALUE",
        ),
        (["status", "--lake-uri", "ftp://x"], "rollstream status: error: flag --lake-uri = 'ftp://x': has"),
        (["profile", "fit", "t.csv", "--quantiles", "0.5", "--edges", "9"], "exclude each other"),
    ],
)
def test_usage_and_settings_errors_are_one_line_with_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err
    assert len(err.splitlines()) == 1 and "Traceback" not in err


def test_status_of_a_stopped_stack_exits_3_and_flags_reach_the_settings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["status", "--state-dir", str(tmp_path / "s"), "--kafka-port", "39999"]) == 3
    assert "stopped at 127.0.0.1:39999" in capsys.readouterr().out
    settings = Common(
        state_dir=tmp_path / "s",
        bootstrap_servers="k1:9092,k2:9092",
        lake_uri="s3://bucket/lake",
        storage_option=("AWS_ENDPOINT_URL=http://127.0.0.1:9000", "aws_conditional_put=etag"),
        kafka_client=("security.protocol=SASL_SSL", "sasl.password=a=b"),
    ).settings()
    assert settings.bootstrap_servers == "k1:9092,k2:9092"
    assert settings.lake_table_uri("trajectories") == "s3://bucket/lake/trajectories"
    assert settings.delta_storage_options() == {
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
        "aws_conditional_put": "etag",
    }
    assert dict(settings.kafka_client) == {"security.protocol": "SASL_SSL", "sasl.password": "a=b"}


def test_the_console_script_and_module_share_main(tmp_path: Path) -> None:
    """`python -m infra.cli` runs the same typer app; --help exits 0 and lists every command."""
    done = subprocess.run(
        [sys.executable, "-m", "infra.cli", "--help"], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    for name in ("up", "down", "status", "produce", "process", "profile", "offsets", "domains", "rescore"):
        assert f" {name} " in done.stdout
    for name in ("learn", "sql", "maintain", "report", "demo"):
        assert f" {name} " in done.stdout
    missing = subprocess.run(
        [sys.executable, "-m", "infra.cli", "sql"], capture_output=True, text=True, timeout=60, check=False
    )
    assert missing.returncode == 2 and "Missing argument" in missing.stderr


def test_status_scrapes_each_registered_process_and_drops_the_registrations_of_those_gone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "s"
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()

    def registration(role: str, pid: int, started: float) -> Path:
        path = registration_path(state, role, pid)
        path.parent.mkdir(parents=True, exist_ok=True)
        body = {"role": role, "pid": pid, "url": "http://127.0.0.1:9/metrics", "started": started}
        path.write_text(json.dumps(body))
        return path

    stale = [
        registration("learner", gone.pid, time.time()),  # its process exited
        registration("serve", os.getpid(), 0.0),  # its pid is now another, later process's
    ]
    metrics = RolloutMetrics()
    metrics.tasks.labels("done").inc(2)
    with serve_metrics(metrics.registry) as server:
        url = url_for("127.0.0.1", server.port)
        with registered(state, "rollout", url):
            argv = ["status", "--state-dir", str(state), "--kafka-port", "39999"]
            assert main([*argv, "--json"]) == 3
            (shown,) = json.loads(capsys.readouterr().out)["metrics"]
            assert main(argv) == 3
            text = capsys.readouterr().out
    assert not any(path.exists() for path in stale)
    assert (shown["role"], shown["pid"], shown["url"], shown["error"]) == ("rollout", os.getpid(), url, None)
    assert shown["figures"] == {"tasks_in_flight": 0, "tasks": {"done": 2}}
    assert f"rollout (pid {os.getpid()}) at {url}: in flight 0, tasks (done 2)" in text
    assert not list((state / "metrics").glob("*.json"))
