"""Removing an execution's pids cgroup: what is left in it is killed, and nothing outside it is."""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import pytest

from stream_processors.sandbox.launcher_process import _kill_member, destroy_cgroup
from stream_processors.sandbox.pids import PidsCgroup, pids_root

pytestmark = pytest.mark.timeout(60)


def test_removal_kills_the_members_and_spares_a_pid_outside_the_cgroup() -> None:
    cgroup = pids_root() / f"test-removal-{uuid.uuid4().hex[:8]}"
    cgroup.mkdir()
    inside = subprocess.Popen(["sleep", "60"])
    outside = subprocess.Popen(["sleep", "60"])
    try:
        (cgroup / "cgroup.procs").write_text(str(inside.pid))
        assert PidsCgroup(cgroup).pids() == [inside.pid]

        _kill_member(str(cgroup), outside.pid)  # a pid read from the cgroup, since reused outside it
        assert outside.poll() is None

        destroy_cgroup(str(cgroup))
        assert inside.wait(timeout=10) == -9
        assert not Path(cgroup).exists()
        assert outside.poll() is None
    finally:
        for proc in (inside, outside):
            proc.kill()
            proc.wait()
        if cgroup.exists():
            cgroup.rmdir()
