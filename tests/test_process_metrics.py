"""`/metrics` of `rollstream serve` and `rollstream rollout`, scraped from real subprocesses."""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from confluent_kafka.admin import AdminClient
from metrics_support import scrape, status_metrics, total, value
from rollout_support import (
    MAX_LENGTH,
    RolloutEnv,
    Served,
    prompt_of,
    start_rollout,
    start_server,
    stop_process,
    task_row,
)

TEST = 21  # prompt_of's first letter: this module's prompts differ from other modules'


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    server = start_server(tmp_path_factory.mktemp("serve"))
    try:
        yield server
    finally:
        code = stop_process(server.process)
    assert code == 0, f"rollstream serve exited {code} on SIGTERM"
    assert server.state_dir is not None and not list((server.state_dir / "metrics").glob("*.json"))


def test_serve_counts_requests_by_endpoint_and_status_and_shows_the_version(served: Served) -> None:
    before = scrape(f"{served.url}/metrics")
    with httpx.Client(base_url=served.url, timeout=60) as client:
        for i in range(3):
            body = {"prompt": prompt_of(TEST, i), "n": 2, "max_tokens": 3, "seed": i}
            assert client.post("/v1/completions", json=body).status_code == 200
        assert client.post("/v1/completions", json={"prompt": "text", "n": 1}).status_code == 400
        bad = {"path": "/nonexistent.safetensors", "sha256": "ab" * 32, "version": 99}
        assert client.post("/update_weights_from_disk", json=bad).status_code == 400
        assert client.get("/no-such-path").status_code == 404
        version = client.get("/health").json()["weight_version"]
    after = scrape(f"{served.url}/metrics")

    def grew(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    requests = "rollstream_serve_requests_total"
    assert grew(requests, endpoint="/v1/completions", status="200") == 3
    assert grew(requests, endpoint="/v1/completions", status="400") == 1
    assert grew(requests, endpoint="/update_weights_from_disk", status="400") == 1
    assert grew(requests, endpoint="unmatched", status="404") == 1
    assert grew("rollstream_serve_generate_seconds_count") == 3
    assert grew("rollstream_serve_request_samples_sum") == 6
    assert 6 <= grew("rollstream_serve_tokens_generated_total") <= 18  # 2 samples of 1..3 tokens, 3 times
    assert grew("rollstream_serve_weight_reloads_total", outcome="refused") == 1
    assert value(after, "rollstream_serve_policy_version") == version

    assert served.state_dir is not None
    (shown,) = status_metrics(served.state_dir)  # `rollstream status` finds the server and scrapes it
    assert (shown["role"], shown["pid"], shown["error"]) == ("serve", served.process.pid, None)
    assert shown["url"] == f"{served.url}/metrics" and shown["figures"]["policy_version"] == version
    assert shown["figures"]["requests"] >= total(after, requests)  # its scrapes are requests too


def test_a_rollout_worker_counts_its_tasks_by_outcome_and_its_dead_letter_by_reason(
    admin: AdminClient,
    bootstrap_servers: str,
    served: Served,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ROLLSTREAM_ROLLOUT__TASK_MAX_ATTEMPTS", "2")
    env = RolloutEnv(admin, bootstrap_servers)
    try:
        good = [task_row(f"m-{i}", prompt_of(TEST, 10 + i)) for i in range(3)]
        env.submit([*good, task_row("too-long", [1] * (MAX_LENGTH - 1), max_tokens=3)])
        state = tmp_path / "state"
        worker = start_rollout(env, served.url, state, "--metrics-port", "0", "--concurrency", "2")
        try:
            url = _metrics_url(state, worker.pid)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                samples = scrape(url)
                if total(samples, "rollstream_rollout_tasks_total") >= 5:  # 3 done, 1 released, 1 dead
                    break
                time.sleep(0.2)
            health = httpx.get(url.replace("/metrics", "/health"), timeout=30)
            (shown,) = status_metrics(state)
        finally:
            code = stop_process(worker, signal.SIGTERM)
        assert code == 0, "".join(err.read_text()[-2000:] for err in state.glob("rollout-*.err"))
    finally:
        env.close()
    assert (shown["role"], shown["pid"], shown["url"], shown["error"]) == ("rollout", worker.pid, url, None)
    assert shown["figures"] == {"tasks_in_flight": 0, "tasks": {"dead": 1, "done": 3, "released": 1}}
    assert not list((state / "metrics").glob("*.json")), "a clean exit removes the registration"
    tasks = "rollstream_rollout_tasks_total"
    assert value(samples, tasks, outcome="done") == 3, samples
    assert value(samples, tasks, outcome="released") == 1  # task_max_attempts 2: one retry, then dead
    assert value(samples, tasks, outcome="dead") == 1
    assert value(samples, "rollstream_rollout_retries_total") == 1
    assert total(samples, "rollstream_rollout_dead_letters_total") == 1
    assert value(samples, "rollstream_rollout_tasks_in_flight") == 0
    assert value(samples, "rollstream_rollout_samples_total") == 6  # 3 groups of 2
    assert value(samples, "rollstream_rollout_generate_seconds_count") == 3
    assert health.status_code == 200 and health.json()["task_queue"] is True


def _metrics_url(state: Path, pid: int, timeout_s: float = 90.0) -> str:
    """The metrics URL the worker logged at start, read from its stderr file."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for err in state.glob("rollout-*.err"):
            if found := re.search(r"metrics at (http://\S+/metrics)", err.read_text()):
                return found.group(1)
        time.sleep(0.1)
    logs = "".join(err.read_text()[-2000:] for err in state.glob("rollout-*.err"))
    raise AssertionError(f"rollout worker {pid} logged no metrics URL within {timeout_s} s: {logs}")
