"""`rollstream status --watch` in a pseudo terminal: the view is drawn, then redrawn in place."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from infra.metrics_endpoints import register


def run_in_pty(
    argv: list[str], timeout_s: float = 120.0, env: dict[str, str] | None = None
) -> tuple[int, str]:
    """Run `argv` with a pseudo terminal as stdout/stderr, `env` added to ours; returns (exit code, everything it drew)."""
    master, slave = os.openpty()
    process = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=slave,
        stderr=slave,
        env={**os.environ, "COLUMNS": "120", "TERM": "xterm", "PYTHONFAULTHANDLER": "1", **(env or {})},
    )
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.5)
        if ready:
            try:
                data = os.read(master, 65536)
            except OSError:  # the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        elif process.poll() is not None:
            break
    os.close(master)
    try:
        code = process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        code = process.wait()
    return code, b"".join(chunks).decode(errors="replace")


def test_status_watch_redraws_in_place(bootstrap_servers):
    code, screen = run_in_pty(
        [sys.executable, "-m", "infra.cli", "status", "--watch", "--iterations", "3", "--interval", "0.3"]
    )
    assert code == 0, screen[-2000:]
    assert "consumer lag" in screen and "kafka broker" in screen and "delta tables" in screen
    assert "rollouts.raw" in screen  # the lag table lists the raw topic's partitions
    assert screen.count("services") >= 3  # drawn three times
    assert "\x1b[1A" in screen or "\x1b[2K" in screen  # ...each redraw moves the cursor back up


def test_status_watch_ends_cleanly_on_ctrl_c(bootstrap_servers):
    """Unbounded, the view refreshes until SIGINT (Ctrl-C), then exits 0 with no traceback."""
    master, slave = os.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "infra.cli", "status", "--watch", "--interval", "0.3"],
        stdin=subprocess.DEVNULL,
        stdout=slave,
        stderr=slave,
        env={**os.environ, "COLUMNS": "120", "TERM": "xterm"},
    )
    os.close(slave)
    screen = b""
    deadline = time.monotonic() + 120
    interrupted = False
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:
                    break
                if not data:
                    break
                screen += data
            if not interrupted and screen.count(b"services") >= 2:  # two refreshes seen
                process.send_signal(signal.SIGINT)
                interrupted = True
            if process.poll() is not None and not ready:
                break
        code = process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        os.close(master)
    text = screen.decode(errors="replace")
    assert interrupted, text[-2000:]
    assert code == 0, text[-2000:]
    assert "Traceback" not in text
    assert "\x1b[1A" in text or "\x1b[2K" in text  # redrawn in place


def test_status_watch_shows_the_figures_scraped_from_registered_endpoints(tmp_path):
    """A process registered as serving metrics appears in the view with its role's figures."""
    registry = CollectorRegistry()
    Counter("rollstream_stream_rows", "rows written", registry=registry).inc(1234)
    Gauge("rollstream_stream_groups_pending", "groups waiting", registry=registry).set(7)
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    try:
        url = f"http://127.0.0.1:{server.server_port}/metrics"
        register(tmp_path, "stream", url)
        code, screen = run_in_pty(
            [sys.executable, "-m", "infra.cli", "status", "--watch", "--iterations", "1"],
            env={"ROLLSTREAM_STATE_DIR": str(tmp_path), "COLUMNS": "250"},
        )
    finally:
        server.shutdown()
        thread.join(timeout=10)
    assert code == 0, screen[-2000:]
    assert "metrics endpoints" in screen and url in screen
    assert "rows 1234" in screen and "pending groups 7" in screen, screen[-2000:]
