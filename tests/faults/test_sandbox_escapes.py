"""Escape attempts beyond tests/test_stream_sandbox.py: each contained, each with a verdict.

Injected (as the response under test): reading the worker's own files (the repo, a lake file, a
state-dir file, all holding a secret), signalling host processes by their pids, exploring and
writing /proc, and starting thousands of threads. Counted: the verdict, the secret never in the
output, the host process alive, and (by the `host` fixture) nothing left behind on the host.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from test_stream_sandbox import (  # noqa: F401 (the fixtures)
    OK,
    host_fixture,
    sandbox_fixture,
    verdict,
)

from stream_processors.sandbox import Limits
from stream_processors.sandbox.bwrap import SANDBOX_UID

pytestmark = pytest.mark.timeout(180)
REPO = Path(__file__).resolve().parents[2]
SECRET = "rollstream-worker-secret-7f3a"


def test_the_workers_files_are_out_of_reach(sandbox, host, tmp_path, monkeypatch):
    lake = tmp_path / "lake" / "trajectories"
    lake.mkdir(parents=True)
    (lake / "part-0.parquet").write_text(SECRET)
    state = tmp_path / "state"
    state.mkdir()
    (state / "kafka.properties").write_text(SECRET)
    targets = [
        str(REPO / "stream_processors" / "stage.py"),
        str(REPO / "pyproject.toml"),
        str(lake / "part-0.parquet"),
        str(state / "kafka.properties"),
        str(Path(sys.executable)),  # the venv (the interpreter inside is the base one, bound read-only)
        "/proc/1/root" + str(lake / "part-0.parquet"),
    ]
    code = (
        "import os\n"
        f"TARGETS = {targets!r}\n"
        "def ok():\n"
        "    seen = []\n"
        "    for t in TARGETS:\n"
        "        try:\n            seen.append(open(t, 'rb').read(64))\n        except OSError:\n            pass\n"
        "    for root in ('/', '/work', '/tmp'):\n"
        "        for d, _, files in os.walk(root if root != '/' else '/etc'):\n"
        "            for f in files:\n"
        "                try:\n                    if b'"
        + SECRET
        + "' in open(os.path.join(d, f), 'rb').read(1 << 16):\n"
        "                        seen.append(d + f)\n"
        "                except OSError:\n                    pass\n"
        "    print(seen)\n"
        "    return not seen\n"
    )
    v = verdict(sandbox, code)
    assert v.status == "ok", v.detail
    assert SECRET not in v.executions[0].stdout + v.executions[0].stderr


def test_host_processes_cannot_be_signalled(sandbox, host):
    sleeper = subprocess.Popen(["sleep", "120"])
    try:
        pids = [sleeper.pid, 1, *range(2, 400)]
        code = (
            "import os, signal\n"
            "def ok():\n"
            "    hit = []\n"
            f"    for pid in {pids!r}:\n"
            "        if pid == os.getpid() or pid == 1:\n            continue\n"
            "        try:\n            os.kill(pid, signal.SIGKILL)\n            hit.append(pid)\n"
            "        except OSError:\n            pass\n"
            "    try:\n        os.kill(-1, signal.SIGTERM)\n    except OSError:\n        pass\n"
            "    print('signalled', hit)\n"
            "    return True\n"
        )
        v = verdict(sandbox, code)
        assert v.status in ("ok", "fail", "error"), v.detail  # a verdict, whatever the code managed
        assert sleeper.poll() is None, "a host process was killed from inside the sandbox"
    finally:
        sleeper.kill()
        sleeper.wait(timeout=10)


def test_proc_shows_nothing_of_the_host_and_takes_no_writes(sandbox, host):
    # Every write puts back the value just read: harmless to the host even if the sandbox failed.
    code = (
        "import os\n"
        "def ok():\n"
        "    assert os.getuid() == os.geteuid() == " + str(SANDBOX_UID) + ", os.getuid()\n"
        "    caps = [l for l in open('/proc/self/status') if l.startswith(('CapEff', 'CapPrm', 'CapBnd'))]\n"
        "    assert all(int(l.split()[1], 16) == 0 for l in caps), caps\n"
        "    pids = [p for p in os.listdir('/proc') if p.isdigit()]\n"
        "    assert len(pids) <= 3, pids\n"
        "    mounts = open('/proc/self/mountinfo').read()\n"
        f"    assert {str(REPO)!r} not in mounts, mounts\n"
        "    written = []\n"
        "    for path in ('/proc/sys/vm/swappiness', '/proc/sys/kernel/pid_max', '/proc/sys/kernel/core_pattern'):\n"
        "        try:\n            value = open(path).read()\n            open(path, 'w').write(value)\n"
        "            written.append(path)\n"
        "        except OSError:\n            pass\n"
        "    assert not written, written\n"
        "    try:\n        os.setuid(0)\n        return False\n    except OSError:  # EINVAL: no uid 0 in the namespace\n        pass\n"
        "    return True\n"
    )
    v = verdict(sandbox, code, Limits(cpu_s=5, wall_s=30))
    assert v.status == "ok", v.detail


def test_thousands_of_threads_hit_the_process_limit(sandbox, host):
    code = (
        "import threading, time\n"
        "ts = []\n"
        "for _ in range(5000):\n"
        "    t = threading.Thread(target=time.sleep, args=(30,), daemon=True)\n"
        "    t.start()\n"
        "    ts.append(t)\n" + OK
    )
    v = verdict(sandbox, code, Limits(cpu_s=5, wall_s=20, processes=32))
    assert v.reward == 0.0 and v.status in ("error", "fail"), v.detail
    if v.status == "error":
        assert v.executions[0].outcome == "process_limit", v.executions[0].outcome
    else:
        assert "can't start new thread" in v.detail or "RuntimeError" in v.detail, v.detail
