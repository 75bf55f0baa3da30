"""The worker's /metrics and /health, scraped from a running worker on a real broker and lake.

With N messages waiting before the worker starts, lag reads N while nothing is stored (every
group is incomplete, so nothing is decided until the wall-clock timeout), then 0 once the groups
time out and are stored; rows read N less the dead letters. /health stays 503 while preflight
is held back (the harness gates it on a file) and turns 200 after it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from metrics_support import status_metrics
from prometheus_client.parser import text_string_to_metric_families
from stream_support import REPO, publish, start_worker, stop_worker, table_rows

from producers.fleet import SyntheticFleet
from schemas import TrajectoryCodec
from stream_processors.app import free_port

pytestmark = pytest.mark.timeout(300)

HARNESS = """
import json, os, sys, time
from pathlib import Path
import stream_processors.startup as startup
from infra.metrics_endpoints import register_when_serving
from stream_processors import create_app, run_worker

args = json.loads(sys.argv[1])
gate, state = args.pop("gate"), args.pop("state")
check = startup.Preflight.check_and_load

def gated(self):
    while not os.path.exists(gate):
        time.sleep(0.1)
    check(self)

startup.Preflight.check_and_load = gated
app = create_app(**args)
register_when_serving(app, Path(state))
run_worker(app)
"""
"""A worker whose preflight waits for a file, so the test sees /health before and after it; it
registers its /metrics in a state directory as `rollstream process` does."""


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """(sample name, labels) -> value of every sample on /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def health(port: int) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())
    except (urllib.error.URLError, ConnectionError):
        return 0, {}


def poll(what: str, predicate, proc: subprocess.Popen, log: Path, timeout_s: float = 120.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, (
            f"worker exited ({proc.returncode}) waiting for {what}:\n{log.read_text()[-3000:]}"
        )
        found = predicate()
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}; log:\n{log.read_text()[-3000:]}")


def test_scraped_lag_rows_dead_letters_and_health(bootstrap_servers, make_topic, tmp_path):
    raw, dlq = make_topic("stream-raw", partitions=1), make_topic("stream-dlq", partitions=1)
    codec = TrajectoryCodec()
    records = list(SyntheticFleet(seed=11, group_size=4, num_domains=4).trajectories(80))
    incomplete = [r for r in records if r["sample_index"] != 3]  # every group misses a sample
    values = [codec.encode(r) for r in incomplete] + [b"not avro"] * 5
    publish(bootstrap_servers, raw, [(None, v) for v in values])
    total, letters = len(values), 5
    port, gate, lake, state = free_port(), tmp_path / "gate", tmp_path / "lake", tmp_path / "state"
    args = {
        "bootstrap_servers": bootstrap_servers, "lake_dir": str(lake), "raw_topic": raw, "ultra_topic": None,
        "dlq_topic": dlq, "app_id": "metrics", "raw_partitions": 1, "batch_size": 50,
        "group_event_timeout_s": 1e6, "group_wall_timeout_s": 8.0, "verifier_processes": 0,
        "metrics_port": port, "data_dir": str(tmp_path / "faust"), "gate": str(gate), "state": str(state),
    }  # fmt: skip
    log = tmp_path / "worker.log"
    proc = subprocess.Popen(
        [sys.executable, "-c", HARNESS, json.dumps(args)],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
    )
    try:
        status, body = poll("the web server", lambda: (found := health(port))[0] and found, proc, log)
        assert status == 503 and body["status"] == "starting" and body["preflight"] is False
        time.sleep(1.0)
        assert health(port)[0] == 503, "ready before preflight passed"
        assert not [k for k in scrape(port) if k[0] == "rollstream_stream_lag_messages"]
        gate.touch()
        status, body = poll("ready", lambda: (found := health(port))[0] == 200 and found, proc, log)
        assert body == {"status": "ready", "preflight": True, "raw_assigned": True}

        lag_key = ("rollstream_stream_lag_messages", (("partition", "0"), ("topic", raw)))
        pending = ("rollstream_stream_groups_pending", ())
        metrics = poll(
            "20 pending groups", lambda: (found := scrape(port)).get(pending) == 20 and found, proc, log
        )
        assert metrics.get(lag_key) == total, "nothing is stored yet, so every message lags"
        assert metrics[("rollstream_stream_rows_total", ())] == 0
        assert metrics[("rollstream_stream_dead_letters_total", (("reason", "DecodeError"),))] == letters

        poll("lag 0", lambda: scrape(port).get(lag_key) == 0, proc, log)
        metrics = scrape(port)
        assert (
            metrics[("rollstream_stream_rows_total", ())]
            == total - letters
            == table_rows(lake / "trajectories")
        )
        assert metrics[("rollstream_stream_groups_decided_total", (("status", "timed_out"),))] == 20
        assert metrics[("rollstream_stream_groups_pending", ())] == 0
        assert metrics[("rollstream_stream_messages_total", (("lane", "raw"),))] == total
        verdicts = sum(v for (name, _), v in metrics.items() if name == "rollstream_stream_verdicts_total")
        assert verdicts == total - letters
        assert metrics[("rollstream_stream_commit_rows_sum", ())] == total - letters
        assert metrics[("rollstream_stream_commit_seconds_count", ())] >= 1
        runs = sum(v for (name, _), v in metrics.items() if name == "rollstream_stream_sandbox_runs_total")
        assert runs > 0 and metrics[("rollstream_stream_sandbox_start_seconds_count", ())] == runs
        start_sum = metrics[("rollstream_stream_sandbox_start_seconds_sum", ())]
        assert 0 < start_sum <= metrics[("rollstream_stream_sandbox_run_seconds_sum", ())]

        (shown,) = status_metrics(state)  # `rollstream status` finds the worker and scrapes it
        assert (shown["role"], shown["pid"], shown["error"]) == ("stream", proc.pid, None)
        assert shown["url"] == f"http://127.0.0.1:{port}/metrics"
        assert shown["figures"] == {
            "lag_messages": 0, "rows": total - letters, "dead_letters": letters, "groups_pending": 0,
        }  # fmt: skip
    finally:
        code = stop_worker(proc, log) if proc.poll() is None else proc.returncode
    assert code == 0, log.read_text()[-3000:]
    assert not list((state / "metrics").glob("*.json")), "a clean stop removes the registration"


def test_rollstream_process_serves_metrics_on_the_stream_settings_port(
    bootstrap_servers, make_topic, tmp_path
):
    raw, dlq = make_topic("stream-raw", partitions=1), make_topic("stream-dlq", partitions=1)
    port, log = free_port(), tmp_path / "worker.log"
    extra = ["--metrics-port", str(port), "--metrics-host", "127.0.0.1"]
    proc = start_worker(bootstrap_servers, tmp_path / "lake", raw, dlq, raw, raw, log, extra=extra)
    try:
        poll("ready", lambda: health(port)[0] == 200, proc, log)
        assert ("rollstream_stream_groups_pending", ()) in scrape(port)
        assert f"metrics at http://127.0.0.1:{port}/metrics" in log.read_text()
    finally:
        code = stop_worker(proc, log) if proc.poll() is None else proc.returncode
    assert code == 0, log.read_text()[-3000:]
