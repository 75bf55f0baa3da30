"""The broker unreachable for a while under a running worker: it waits, then nothing is lost.

Injected: a private single-node broker (own state dir, free ports) is SIGKILLed once the worker
wrote some rows, stays down for OUTAGE_S seconds (connections refused), and is started again on
the same data; more trajectories are published after it is back. Counted: the worker is still
running, its log names the unreachable broker, and every trajectory is one row.
"""

from __future__ import annotations

import os
import signal
import time

import polars as pl
import pytest
from stream_support import publish, start_worker, stop_worker, table_rows, wait_for
from test_infra_lifecycle import private_settings
from test_stream_groups_e2e import without_code

from infra import services
from infra.exceptions import BrokerError
from producers.fleet import SyntheticFleet
from schemas import TrajectoryCodec

pytestmark = pytest.mark.timeout(900)
TRAJECTORIES = 2_400
OUTAGE_S = 20


@pytest.mark.slow(78)
def test_the_worker_rides_out_a_broker_outage(tmp_path):
    settings = private_settings(tmp_path / "state")
    services.up(settings, mlflow_server=False, progress=lambda _: None)
    proc = None
    log = tmp_path / "worker.log"
    try:
        bootstrap = f"127.0.0.1:{settings.kafka_port}"
        codec = TrajectoryCodec()
        records = list(without_code(SyntheticFleet(seed=51, group_size=8).trajectories(TRAJECTORIES)))
        messages = [(r["group_id"].encode(), codec.encode(r)) for r in records]
        half = len(messages) // 2
        publish(bootstrap, "rollouts.raw", messages[:half])
        lake = tmp_path / "lake"
        proc = start_worker(
            bootstrap, lake, "rollouts.raw", "rollouts.dlq", "outage", "outage", log,
            extra=["--session-timeout", "10"],
        )  # fmt: skip
        wait_for(lambda: table_rows(lake / "trajectories") >= 200, 300, proc, log, "200 rows")
        pid = services.status(settings).pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        down_at = table_rows(lake / "trajectories")
        time.sleep(OUTAGE_S)
        assert proc.poll() is None, f"the worker stopped during the outage:\n{log.read_text()[-3000:]}"
        try:
            services.up(settings, mlflow_server=False, progress=lambda _: None)
        except BrokerError:  # a restart under heavy load may miss the 90 s readiness wait once
            services.up(settings, mlflow_server=False, progress=lambda _: None)
        publish(bootstrap, "rollouts.raw", messages[half:])
        wait_for(lambda: table_rows(lake / "trajectories") >= TRAJECTORIES, 400, proc, log, "every row")
    finally:
        code = stop_worker(proc, log) if proc is not None else 0
        services.down(settings, progress=lambda _: None)
    text = log.read_text()
    assert code == 0, text[-3000:]
    port = str(settings.kafka_port)
    # Python's log lines (WARNING/ERROR) and librdkafka's (syslog levels: %3 error, %4 warning).
    levels = ("WARN", "ERROR", "%3|", "%4|")
    complaints = [line for line in text.splitlines() if port in line and any(lv in line for lv in levels)]
    print(
        f"\nbroker down at {down_at} rows for {OUTAGE_S}s; {len(complaints)} log lines name it, first: "
        f"{complaints[0][:300] if complaints else None}"
    )
    rows = pl.read_delta(str(lake / "trajectories"))
    assert rows.height == TRAJECTORIES and rows["trajectory_id"].n_unique() == TRAJECTORIES
    assert complaints, "the log never said the broker was unreachable"
