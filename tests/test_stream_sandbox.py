"""Escape attempts against the sandbox: each ends with a verdict and the host unchanged.

Host unchanged means: no new file outside the sandbox's work directory (the code under test
names every file it tries to write with MARKER; /tmp, the home directory and the working
directory are searched for it, since other jobs on this machine write to /tmp meanwhile), the
work directory and the cgroups left empty, no child process left, and nothing reached a
listener this test opened on 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import psutil
import pytest

from stream_processors.sandbox import Execution, Limits, Sandbox, SandboxHostError
from stream_processors.sandbox.pids import PidsCgroup
from stream_processors.sandbox.privileges import IDS_PER_PROCESS, LAST_HOST_ID, PROCESS_WINDOWS, HostIds
from stream_processors.verifiers import CodeTestsVerifier

pytestmark = pytest.mark.timeout(120)

WATCHED = [Path("/tmp"), Path.home(), Path.cwd()]
MARKER = f"rollstream-escape-{os.getpid()}"


def _marked() -> set[Path]:
    return {p for root in WATCHED for p in root.glob(f"*{MARKER}*")}


class Listener:
    """A TCP listener on 127.0.0.1 that records any connection."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.hits = 0
        self._stop = False
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
                self.hits += 1
                conn.close()
            except OSError:
                continue

    def close(self) -> None:
        self._stop = True
        self._thread.join()
        self.sock.close()


@pytest.fixture(name="sandbox", scope="module")
def sandbox_fixture(tmp_path_factory) -> Sandbox:
    sandbox = Sandbox(tmp_path_factory.mktemp("sandbox-work"), limits=Limits(cpu_s=3, wall_s=5.0))
    sandbox.check()
    return sandbox


@pytest.fixture(name="host")
def host_fixture(sandbox, monkeypatch):
    """Yields the listener's port; afterwards asserts the host is unchanged."""
    monkeypatch.setenv("ROLLSTREAM_TEST_SECRET", "hunter2-do-not-leak")
    before = _marked()
    children_before = {p.pid for p in psutil.Process().children(recursive=True)} | sandbox.spare_pids()
    listener = Listener()
    yield listener
    listener.close()
    assert listener.hits == 0, "the sandbox reached a listener on 127.0.0.1"
    new = _marked() - before
    assert not new, f"files appeared outside the sandbox dir: {new}"
    assert list(sandbox.work_root.iterdir()) == [], "an execution left something in the sandbox's work root"
    assert sandbox.execution_cgroups() == [], "a pids cgroup was left"
    # the launchers' waiting children (each alone in a cgroup of its own) are replaced as they are used
    left = {p.pid for p in psutil.Process().children(recursive=True)} - children_before - sandbox.spare_pids()
    assert not left, f"processes left behind: {left}"


def verdict(sandbox: Sandbox, code: str, limits: Limits | None = None):
    verifier = CodeTestsVerifier(sandbox, limits=limits or sandbox.limits)
    return verifier.verify(
        {"trajectory_id": "t", "response_text": code, "unit_tests": "def test_it():\n    assert ok()\n"}
    )


OK = "\ndef ok():\n    return True\n"


def test_an_infinite_loop_times_out(sandbox, host):
    v = verdict(sandbox, "while True:\n    pass\n", Limits(cpu_s=30, wall_s=1.5))
    assert v.status == "timeout" and v.reward == 0.0 and "wall-clock" in v.detail
    assert 1.4 < v.executions[0].wall_s < 5


def test_a_cpu_spin_hits_the_cpu_limit(sandbox, host):
    v = verdict(sandbox, "while True:\n    pass\n", Limits(cpu_s=1, wall_s=10))
    assert v.status == "timeout" and "CPU limit" in v.detail


def test_a_memory_bomb_is_an_error_naming_memory(sandbox, host):
    v = verdict(sandbox, "x = []\nwhile True:\n    x.append(bytearray(50 * 2**20))\n")
    assert v.status == "error" and v.reward == 0.0 and "memory limit" in v.detail


def test_a_fork_bomb_is_an_error_naming_the_process_limit(sandbox, host):
    code = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    v = verdict(sandbox, code, Limits(cpu_s=2, wall_s=3, processes=16))
    assert v.status == "error" and v.reward == 0.0
    assert v.executions[0].outcome == "process_limit" and "process limit of 16" in v.detail


def test_a_connection_to_the_hosts_listener_fails(sandbox, host):
    code = f"import socket\nsocket.create_connection(('127.0.0.1', {host.port}), timeout=2)\n" + OK
    v = verdict(sandbox, code)
    assert v.status == "fail" and v.reward == 0.0
    assert "ConnectionRefusedError" in v.detail or "Network is unreachable" in v.detail, v.detail


def test_writes_to_tmp_and_home_never_reach_the_host(sandbox, host):
    marker = MARKER
    code = (
        f"import os\nopen('/tmp/{marker}', 'w').write('x')\nopen('/work/{marker}', 'w').write('x')\n"
        f"for home in ('/root', os.path.expanduser('~'), '{Path.home()}'):\n"
        f"    try:\n        open(home + '/{marker}', 'w').write('x')\n    except OSError:\n        pass\n"
        + OK
    )
    v = verdict(sandbox, code)
    assert v.status == "ok"
    assert not (Path("/tmp") / marker).exists() and not (Path.home() / marker).exists()


def test_the_code_holds_no_descriptor_but_its_three_streams(sandbox, host):
    """The task's memory files, bwrap's pipes and the launcher's sockets stay outside the sandbox."""
    code = (
        "import os\n"
        "fds = sorted(int(n) for n in os.listdir('/proc/self/fd'))\n"
        "print([(fd, os.readlink(f'/proc/self/fd/{fd}')) for fd in fds if fd > 2 and os.path.exists(f'/proc/self/fd/{fd}')])\n"
    )
    run = sandbox.run(["python3", "-S", "/task/fds.py"], files={"fds.py": code, "other.txt": "x" * 100_000})
    assert run.exit_code == 0, run.stderr
    assert run.stdout.strip() == "[]", f"the code holds descriptors beyond 0-2: {run.stdout}"


def test_the_task_files_arrive_whole_and_read_only_and_never_on_the_hosts_disk(sandbox, host):
    big = os.urandom(300_000)  # past a pipe's buffer and bwrap's reads
    code = (
        "import hashlib, os\n"
        "print(sorted(os.listdir('/task')), hashlib.sha256(open('/task/big.bin', 'rb').read()).hexdigest(),\n"
        "      oct(os.stat('/task/a.py').st_mode & 0o777), open('/task/a.py').read())\n"
        "for attempt in (lambda: open('/task/a.py', 'a'), lambda: open('/task/new', 'w'),\n"
        "                lambda: os.chmod('/task/a.py', 0o666), lambda: os.unlink('/task/a.py')):\n"
        "    try:\n        attempt()\n        print('WROTE')\n    except OSError as exc:\n"
        "        print(exc.errno)\n"
    )
    seen: set[Path] = set()
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(
            sandbox.run, ["python3", "-c", code], files={"a.py": "print('hi')", "big.bin": big}
        )
        while not running.done():  # the work directory stays empty while it runs
            seen |= set(sandbox.work_root.rglob("*"))
            time.sleep(0.005)
        result = running.result()
    assert result.ok, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"['a.py', 'big.bin'] {hashlib.sha256(big).hexdigest()} 0o444 print('hi')"
    refused = {str(errno.EROFS), str(errno.EACCES), str(errno.EPERM)}
    assert len(lines) == 5 and set(lines[1:]) <= refused, lines  # no write, no new file, no chmod
    assert seen == set()
    for bad in ("../escape", "a/b", "", ".."):
        with pytest.raises(ValueError, match="plain name"):
            sandbox.run(["python3", "-c", "pass"], files={bad: "x"})


def test_secrets_shadow_and_other_processes_are_invisible(sandbox, host):
    code = (
        "import os\n"
        "def ok():\n"
        "    assert 'ROLLSTREAM_TEST_SECRET' not in os.environ, 'env'\n"
        "    try:\n        open('/etc/shadow').read()\n        return False\n    except OSError:\n        pass\n"
        "    pids = [p for p in os.listdir('/proc') if p.isdigit()]\n"
        "    assert len(pids) <= 3, pids\n"
        "    for p in pids:\n        assert b'hunter2' not in open(f'/proc/{p}/environ', 'rb').read(), p\n"
        f"    assert not os.path.exists('/proc/{os.getpid()}/environ') or {os.getpid()} < 4\n"
        "    return True\n"
    )
    v = verdict(sandbox, code)
    assert v.status == "ok", v.detail


def test_killing_the_workers_pid_does_nothing(sandbox, host):
    code = (
        f"import os, signal\ntry:\n    os.kill({os.getpid()}, signal.SIGKILL)\nexcept OSError:\n    pass\n"
        + OK
    )
    v = verdict(sandbox, code)
    assert v.status == "ok"  # and we are still alive to check it


def test_200_mb_of_output_is_stopped_at_the_cap_and_read_no_further(sandbox, host):
    code = (
        "import sys\nfor _ in range(200):\n    sys.stdout.write('x' * 2**20)\n    sys.stdout.flush()\n" + OK
    )
    v = verdict(sandbox, code)
    execution = v.executions[0]
    cap = execution.limits.output_bytes
    assert execution.outcome == "output_limit", execution
    assert v.status == "output_limit" and v.reward == 0.0 and f"output limit of {cap} bytes" in v.detail
    assert cap < execution.stdout_bytes <= cap + 64 * 1024  # the cap plus one pipe buffer's read
    assert len(execution.stdout) <= cap + 64  # head, tail, "[... omitted ...]"


def test_output_past_the_cap_on_stderr_is_stopped_too(sandbox, host):
    code = "import sys\nwhile True:\n    sys.stderr.write('y' * 4096)\n" + OK
    v = verdict(sandbox, code, Limits(cpu_s=3, wall_s=5.0, output_bytes=10_000))
    execution = v.executions[0]
    assert execution.outcome == "output_limit" and v.status == "output_limit", execution
    assert 10_000 < execution.stderr_bytes <= 10_000 + 64 * 1024


def test_output_under_the_cap_is_kept_whole(sandbox, host):
    code = "print('z' * 30_000)\n" + OK
    v = verdict(sandbox, code)
    assert v.status == "ok", v.detail
    assert v.executions[0].stdout.count("z") == 30_000


def test_the_start_ends_before_the_command_runs(sandbox, host):
    execution = sandbox.run(["python3", "-S", "-c", "import time; time.sleep(0.5)"])
    assert execution.ok, execution
    assert 0 < execution.start_s <= execution.wall_s - 0.5  # the sleep is the command's, after the start


def test_the_sandbox_start_failure_is_a_host_error_never_a_verdict(tmp_path, host):
    broken = Sandbox(tmp_path / "work")
    broken.binary = "/bin/false"
    try:
        with pytest.raises(SandboxHostError, match="bwrap did not start"):
            broken.run(["python3", "-c", "pass"])
    finally:
        broken.close()  # its launcher process ends with it


def _host_ids(pid: int) -> dict[str, list[int]]:
    """Uid, Gid and Groups of a process as the host sees them (/proc/<pid>/status)."""
    fields: dict[str, list[int]] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("Uid", "Gid", "Groups"):
            fields[key] = [int(v) for v in value.split()]
    return fields


def _execution_processes(sandbox: Sandbox, timeout_s: float) -> dict[int, dict[str, list[int]]]:
    """The host ids of every process in the sandbox's cgroups, once the code's interpreter runs.

    (bwrap's own command line holds the code too: the interpreter is known by its argv[0].)
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pids = [pid for c in sandbox.execution_cgroups() for pid in PidsCgroup(c).pids()]
        seen = {}
        for pid in pids:
            with contextlib.suppress(OSError):
                seen[pid] = (Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0], _host_ids(pid))
        if any(argv0 == sandbox.python.encode() for argv0, _ in seen.values()):
            return {pid: ids for pid, (_, ids) in seen.items()}
        time.sleep(0.02)
    raise AssertionError(f"no sandboxed {sandbox.python} within {timeout_s} s")


def test_sandboxed_processes_are_an_unprivileged_user_on_the_host(sandbox, host):
    """Seen from the host, every process of an execution is one of the sandbox's host ids, with no group."""
    if os.geteuid() == 0:
        assert sandbox.host_ids is not None, "a root worker must run the sandbox as another uid"
        allowed = sandbox.host_ids.ids
        assert allowed.start > 0
    else:
        allowed = range(os.geteuid(), os.geteuid() + 1)
    code = "import time\nprint(open('/proc/self/uid_map').read(), flush=True)\ntime.sleep(3)\n"
    results: list[Execution] = []
    runner = threading.Thread(target=lambda: results.append(sandbox.run(["python3", "-c", code])))
    runner.start()
    try:
        processes = _execution_processes(sandbox, timeout_s=10)
    finally:
        runner.join()
    assert results and results[0].ok and "65534" in results[0].stdout, results
    assert len(processes) >= 3, processes  # bwrap outside, bwrap as the sandbox's pid 1, the code
    expected = next(iter(processes.values()))["Uid"][0]
    assert expected in allowed and expected != 0, (processes, allowed)
    for pid, ids in processes.items():
        assert ids["Uid"] == [expected] * 4, (pid, ids)
        assert ids["Gid"] == [expected] * 4 and ids["Groups"] == [], (pid, ids)


def test_executions_at_once_run_as_different_host_ids(sandbox):
    """Code out of one execution's namespaces must not be the uid of another's processes."""
    code = "import time\ntime.sleep(3)\n"
    results: list[Execution] = []
    runners = [
        threading.Thread(target=lambda: results.append(sandbox.run(["python3", "-c", code])))
        for _ in range(2)
    ]
    for runner in runners:
        runner.start()
    uids: dict[str, int] = {}
    try:
        deadline = time.monotonic() + 10
        while len(uids) < 2 and time.monotonic() < deadline:
            for cgroup in sandbox.execution_cgroups():
                for pid in PidsCgroup(cgroup).pids():
                    with contextlib.suppress(OSError):
                        if (
                            Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
                            == sandbox.python.encode()
                        ):
                            uids[cgroup.name] = _host_ids(pid)["Uid"][0]
            time.sleep(0.02)
    finally:
        for runner in runners:
            runner.join()
    assert len(results) == 2 and all(r.ok for r in results), results
    assert len(uids) == 2, uids
    if os.geteuid() == 0:
        assert sandbox.host_ids is not None
        assert len(set(uids.values())) == 2 and all(u in sandbox.host_ids.ids for u in uids.values()), uids
    else:
        assert set(uids.values()) == {os.geteuid()}, uids


def test_the_highest_window_of_host_ids_runs(sandbox, monkeypatch):
    """The ids of the last process window (the top of the range) can run code too."""
    if sandbox.host_ids is not None:
        monkeypatch.setattr(sandbox, "host_ids", HostIds(sandbox.host_id, pid=PROCESS_WINDOWS - 1))
        assert sandbox.host_ids.ids[-1] <= LAST_HOST_ID
    result = sandbox.run(["python3", "-c", "print('ran')"])
    assert result.ok and result.stdout.strip() == "ran", result


def test_host_ids_are_leased_one_per_execution_and_reused_last():
    ids = HostIds(1_000_000, pid=4097)  # window 4097 % 4096 = 1
    assert ids.ids == range(1_000_000 + IDS_PER_PROCESS, 1_000_000 + 2 * IDS_PER_PROCESS)
    with ExitStack() as stack:
        held = [stack.enter_context(ids.lease()) for _ in range(IDS_PER_PROCESS)]
        assert sorted(held) == list(ids.ids)
        with pytest.raises(SandboxHostError, match="lower the sandbox pool size"), ids.lease():
            pass
    with ids.lease() as first:
        pass
    with ids.lease() as second:
        assert second != first
