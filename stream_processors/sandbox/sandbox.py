"""Run untrusted code in bubblewrap with limits, and report what happened (never run it bare).

One `Sandbox.run` is one execution: the task's files are written to memory files that bwrap
copies into /task of the sandbox's read-only root (nothing reaches the host's disk), bwrap
starts in a new session with the rlimits set, inside its own pids cgroup and, when the worker is
root, as an unprivileged host id (privileges.py); stdout and
stderr are read up to the output cap (past it the whole tree is killed and nothing more is read),
and the whole tree is killed at the wall deadline. The result says
how it ended and how long the sandbox took to start; an ending caused by the host (bwrap did not start, the OOM killer) raises
`SandboxHostError` instead, since it says nothing about the code.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import socket
import tempfile
import time
import uuid
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import psutil

from stream_processors.sandbox.bwrap import (
    ENV_DIR,
    SYSTEM_DIRS,
    TASK_DIR,
    bwrap_argv,
    bwrap_binary,
    interpreter,
)
from stream_processors.sandbox.environments import Environment
from stream_processors.sandbox.exceptions import SandboxHostError, SandboxUnavailableError
from stream_processors.sandbox.launcher import SPARE_PREFIX, Launcher, Request, receive
from stream_processors.sandbox.launcher_process import MAX_FILES, read_small
from stream_processors.sandbox.limits import Limits
from stream_processors.sandbox.pids import PidsCgroup, pids_root
from stream_processors.sandbox.privileges import AS_ROOT_VARIABLE, HostIds, Paths, Staging, host_id

Outcome = Literal[
    "exited",
    "timeout",
    "cpu_limit",
    "memory_limit",
    "process_limit",
    "file_limit",
    "output_limit",
    "signaled",
]


@dataclass(frozen=True, slots=True)
class Execution:
    """What one sandboxed run did.

    Attributes:
        outcome: "exited" (the code ended on its own), "timeout" (wall clock), "cpu_limit",
            "memory_limit", "process_limit", "file_limit", "output_limit" (stdout or stderr went
            past `Limits.output_bytes`: the tree was stopped there), or "signaled" (killed by a
            signal it or its code raised).
        exit_code: the exit status, or None when a signal ended it.
        signal: the signal number that ended it, or None.
        stdout: up to `Limits.output_bytes` of standard output (its first and last halves when
            there was more), decoded leniently.
        stderr: the same for standard error.
        stdout_bytes: how much standard output was read in all (kept or not): at most the cap
            plus one read of 64 KiB.
        stderr_bytes: the same for standard error.
        cpu_s: user + system CPU seconds of the tree (the processes bwrap reaped).
        wall_s: wall-clock seconds from start to exit.
        start_s: wall-clock seconds from start (the worker asking the launcher to start bwrap)
            until bwrap has built the sandbox and is about to start the command: it spans the
            launcher's fork and child set-up (cgroup, rlimits, host id), bwrap's exec, its
            namespaces, mounts and capability drop (and, on a `Sandbox`'s first run, the start of
            its launcher process). The command's own start-up (an interpreter's,
            about 10 ms for ``python -S``) is not in it. bwrap marks that point by closing its
            ``--block-fd`` (bwrap.py); a bwrap that failed or was killed before it closes that
            pipe by ending, so then it is the time bwrap ended. At most `wall_s`.
        peak_memory_bytes: largest resident set of a process of the tree.
        limits: the limits it ran under.
        environment_id: the content id of the environment bound at /env.
    """

    outcome: Outcome
    exit_code: int | None
    signal: int | None
    stdout: str
    stderr: str
    stdout_bytes: int
    stderr_bytes: int
    cpu_s: float
    wall_s: float
    start_s: float
    peak_memory_bytes: int
    limits: Limits
    environment_id: str
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Exited with status 0."""
        return self.outcome == "exited" and self.exit_code == 0


def _proc_counter(path: str, key: bytes) -> int | None:
    """The number after `key` in a /proc file of ``name value`` lines (one read, no line split:
    each execution reads two of them, and splitting /proc/vmstat cost 0.7 ms)."""
    try:
        text = b"\n" + read_small(path)
        at = text.index(b"\n" + key) + len(key) + 1
        return int(text[at : text.index(b"\n", at)].split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _oom_kills() -> int:
    """How often the kernel's OOM killer ran since boot (/proc/vmstat)."""
    return _proc_counter("/proc/vmstat", b"oom_kill ") or 0


def _available_memory() -> int:
    """The host's available memory in bytes (/proc/meminfo MemAvailable; psutil's when absent)."""
    kib = _proc_counter("/proc/meminfo", b"MemAvailable:")
    return kib * 1024 if kib is not None else psutil.virtual_memory().available


_SAMPLE_MS = 20
_CHUNK = 1 << 16
"""Bytes read from a stream at once: a stream is read at most this far past the output cap."""


_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


class _Usage:
    """CPU and peak memory of a process tree, sampled from /proc/<pid>/stat (wait4 cannot see
    through bwrap's pid 1)."""

    def __init__(self) -> None:
        self.cpu: dict[int, float] = {}
        self.peak_rss = 0

    @property
    def cpu_s(self) -> float:
        return sum(self.cpu.values())

    def sample(self, pids: list[int]) -> None:
        total_rss = 0
        for pid in pids:
            try:
                fields = read_small(f"/proc/{pid}/stat").rpartition(b")")[2].split()
            except OSError:
                continue
            if len(fields) < 22:
                continue
            # after the command's ")": state is field 0, utime 11, stime 12, rss (pages) 21
            self.cpu[pid] = (int(fields[11]) + int(fields[12])) * _TICK_S
            total_rss += int(fields[21]) * _PAGE
        self.peak_rss = max(self.peak_rss, total_rss)


class _TaskFiles:
    """An execution's files as memory files (memfd), one per name, read from their start by bwrap,
    which copies them into the sandbox's /task (bwrap.py); nothing is written to the host's disk.

    Raises:
        ValueError: a name is not a plain file name, or there are more than MAX_FILES.
    """

    def __init__(self, files: Mapping[str, str | bytes]) -> None:
        if len(files) > MAX_FILES:
            raise ValueError(f"{len(files)} task files; an execution takes at most {MAX_FILES}")
        self.names: list[str] = []
        self.fds: list[int] = []
        try:
            for name, content in files.items():
                if not name or "/" in name or name in (".", "..") or "\0" in name:
                    raise ValueError(f"file name {name!r} must be a plain name")
                fd = os.memfd_create(name, os.MFD_CLOEXEC)
                self.fds.append(fd)
                self.names.append(name)
                view = memoryview(content.encode() if isinstance(content, str) else content)
                while view:
                    view = view[os.write(fd, view) :]
                os.lseek(fd, 0, os.SEEK_SET)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds.clear()


class _Capped:
    """Keeps the first and the last `cap` / 2 bytes of a stream and counts all of it."""

    def __init__(self, cap: int) -> None:
        self.half = max(1, cap // 2)
        self.head, self.tail, self.total = bytearray(), bytearray(), 0

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.half - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail += chunk[-self.half :]
            del self.tail[: -self.half]

    def text(self) -> str:
        omitted = self.total - len(self.head) - len(self.tail)
        middle = f"\n[... {omitted} bytes omitted ...]\n".encode() if omitted else b""
        return bytes(self.head + middle + self.tail).decode("utf-8", errors="replace")


_REPLY_TIMEOUT_S = 30.0
"""How long the launcher may take to report bwrap's end once bwrap is gone (it reaps at once)."""


class _Child:
    """bwrap as the launcher started it: its pid and pidfd, the worker's ends of its streams, and
    the reply socket on which the launcher reports how it ended."""

    def __init__(
        self, pid: int, pidfd: int, reply: socket.socket, stdin: int, stdout: int, stderr: int
    ) -> None:
        self.pid, self.pidfd, self.reply = pid, pidfd, reply
        self.stdin, self.stdout, self.stderr = stdin, stdout, stderr
        self.returncode: int | None = None
        self.cpu_s = 0.0
        self._open = [stdin, stdout, stderr]

    def write_stdin(self, data: bytes) -> None:
        """Write `data` to bwrap's stdin and close it (what the code does not read is dropped)."""
        with contextlib.suppress(OSError):
            view = memoryview(data)
            while view:
                view = view[os.write(self.stdin, view) :]
        self._close(self.stdin)

    def _close(self, fd: int) -> None:
        if fd in self._open:
            self._open.remove(fd)
            os.close(fd)

    def close_streams(self) -> None:
        for fd in list(self._open):
            self._close(fd)

    def kill(self) -> None:
        """SIGKILL bwrap through its pidfd (never another process that took its pid)."""
        if self.returncode is None:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)

    def wait(self) -> int:
        """bwrap's exit code (negative: the signal), as the launcher reaped it."""
        if self.returncode is None:
            self.reply.settimeout(_REPLY_TIMEOUT_S)
            try:
                message, fds = receive(self.reply)
            except OSError as exc:
                raise SandboxHostError(f"the sandbox launcher did not report bwrap's end: {exc}") from exc
            for fd in fds:
                os.close(fd)
            if message[0] != "ended":
                raise SandboxHostError("the sandbox launcher ended while bwrap ran; retry")
            status, cpu = message[1], message[2]
            assert isinstance(status, int) and isinstance(cpu, float)
            self.returncode = os.waitstatus_to_exitcode(status)
            self.cpu_s = cpu
        return self.returncode

    def close(self) -> None:
        self.close_streams()
        os.close(self.pidfd)
        self.reply.close()


class Sandbox:
    """Runs commands under bubblewrap; thread-safe, one process tree per `run`.

    Args:
        work_root: a host directory of the sandbox's own (made if missing; what workers that died
            left in it is removed). Executions write nothing there: their files go to bwrap as
            memory files.
        limits: default limits; `run` may pass others.
        min_free_memory_bytes: below this much available host memory an execution does not
            start (SandboxHostError), so a short host never turns into a failed verdict.

    Attributes:
        host_id: when the worker is root, the first of the host ids (uid and gid) bwrap and the
            code run as (`privileges.host_id()`); None when they run as the worker itself.
        host_ids: the ids this process leases, one per execution running at once; None likewise.
    """

    def __init__(
        self,
        work_root: Path | str | None = None,
        *,
        limits: Limits | None = None,
        min_free_memory_bytes: int = 256 * 1024 * 1024,
    ) -> None:
        self.work_root = Path(work_root or Path(tempfile.gettempdir()) / "rollstream-sandbox")
        self.work_root.mkdir(parents=True, exist_ok=True)
        self.limits = limits or Limits()
        self.min_free_memory_bytes = min_free_memory_bytes
        self.binary = bwrap_binary()
        self.python, self.python_prefix = interpreter()
        self.host_id = host_id()
        self.host_ids = HostIds(self.host_id) if self.host_id is not None else None
        shared = pids_root()
        _remove_stale(shared, self.work_root)
        self.cgroups = shared / f"worker-{os.getpid()}"
        self.cgroups.mkdir(exist_ok=True)
        self.launcher = Launcher(self.cgroups)
        self._stagings: dict[Paths, Staging] = {}
        weakref.finalize(self, self.launcher.close)

    def check(self) -> Execution:
        """Run ``python -c pass`` in the sandbox once; raises SandboxUnavailableError naming the cause."""
        try:
            result = self.run(["python3", "-c", "pass"])
        except SandboxHostError as exc:
            raise SandboxUnavailableError(
                f"the sandbox cannot start on this host: {exc}. Check that user namespaces are "
                "enabled (sysctl user.max_user_namespaces > 0; kernel.unprivileged_userns_clone=1 "
                f"on Debian) and that the worker may create cgroups{self._start_up_hint()}; see "
                "docs/sandbox.md"
            ) from exc
        if not result.ok:
            raise SandboxUnavailableError(
                f"the sandbox started but `python -c pass` ended {result.outcome} with exit "
                f"{result.exit_code}: {result.stderr[-500:]!r}; see docs/sandbox.md"
            )
        return result

    def _start_up_hint(self) -> str:
        """What the start-up error adds when bwrap runs as another uid than the worker's."""
        if self.host_id is None:
            return ""
        return (
            f". bwrap runs as uids from {self.host_id} here (the worker is root): unprivileged user "
            "namespaces must be allowed for it, and the worker needs CAP_SYS_ADMIN to give it a "
            f"mount namespace of its own; {AS_ROOT_VARIABLE}=1 opts out (the code then runs as "
            "root outside its namespace)"
        )

    def run(
        self,
        command: list[str],
        *,
        files: Mapping[str, str | bytes] | None = None,
        environment: Environment | None = None,
        limits: Limits | None = None,
        stdin: bytes = b"",
    ) -> Execution:
        """Run `command` (``python3`` means the sandbox's interpreter) with `files` under /task.

        Raises:
            SandboxHostError: the run ended for the host's reasons; retry it.
        """
        limits = limits or self.limits
        available = _available_memory()
        if available < self.min_free_memory_bytes:
            raise SandboxHostError(
                f"host has {available >> 20} MiB available, below the {self.min_free_memory_bytes >> 20} "
                "MiB an execution needs to start; retry when memory is free"
            )
        run_id = f"{os.getpid()}-{uuid.uuid4().hex}"
        task = _TaskFiles(files or {})
        try:
            with self._host_id() as uid:
                return self._run(command, task, run_id, environment, limits, stdin, uid)
        finally:
            task.close()

    @contextlib.contextmanager
    def _host_id(self) -> Iterator[int | None]:
        """The execution's own host id while it runs (None: it runs as the worker)."""
        if self.host_ids is None:
            yield None
            return
        with self.host_ids.lease() as uid:
            yield uid

    def _run(
        self,
        command: list[str],
        task: _TaskFiles,
        run_id: str,
        environment: Environment | None,
        limits: Limits,
        stdin: bytes,
        uid: int | None,
    ) -> Execution:
        argv_command = [self.python if c == "python3" and i == 0 else c for i, c in enumerate(command)]
        env = {"PATH": "/usr/bin:/bin", "HOME": "/work", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
        if environment is not None:
            env["PYTHONPATH"] = ENV_DIR
        env["TASK_DIR"] = TASK_DIR
        status_read, status_write = os.pipe()
        start_read, start_write = os.pipe()
        os.write(start_write, b"\0")  # what bwrap's --block-fd reads: it never waits
        paths = Paths(
            binary=self.binary,
            python=self.python_prefix,
            env=str(environment.path) if environment is not None else None,
        )
        staging = None if uid is None else self._staging(paths)
        if staging is not None:
            paths = staging.paths
        argv = bwrap_argv(
            paths.binary,
            task_files=task.names,
            env_dir=Path(paths.env) if paths.env is not None else None,
            limits=limits,
            python_prefix=self.python_prefix,
            python_source=paths.python,
            command=argv_command,
            env=env,
        )
        oom_before = _oom_kills()
        start = time.monotonic()
        try:
            child = self._spawn(
                Request(argv, run_id, limits, uid, staging), [status_write, start_read, *task.fds]
            )
        except SandboxHostError:
            os.close(status_read)
            os.close(start_write)
            raise
        finally:
            os.close(status_write)
            os.close(start_read)
        cgroup = PidsCgroup(self.cgroups / run_id)  # the launcher's child is in it
        try:
            return self._watch(
                child, cgroup, limits, _Pipes(status_read, start_write), start, oom_before, stdin, environment
            )
        finally:
            child.kill()
            child.close_streams()
            os.close(status_read)
            os.close(start_write)
            try:
                child.wait()
            finally:
                child.close()
                cgroup.destroy()

    def _staging(self, paths: Paths) -> Staging:
        """What a root worker's child stages for bwrap (the same for every execution with these paths)."""
        staging = self._stagings.get(paths)
        if staging is None:
            staging = self._stagings[paths] = Staging.of(paths, SYSTEM_DIRS)
        return staging

    def _spawn(self, request: Request, passed: list[int]) -> _Child:
        """Have the launcher start bwrap on fresh pipes (and the `passed` descriptors: bwrap's
        status and start pipes, the task's files); the started child, or SandboxHostError."""
        stdin_r, stdin_w = os.pipe()
        stdout_r, stdout_w = os.pipe()
        stderr_r, stderr_w = os.pipe()
        ours, theirs = (stdin_w, stdout_r, stderr_r), (stdin_r, stdout_w, stderr_w)
        reply = None
        try:
            reply = self.launcher.spawn(request, [stdin_r, stdout_w, stderr_w, *passed])
            message, fds = receive(reply)
        except OSError as exc:
            message, fds = ("failed", f"the launcher could not be reached: {exc}"), []
        finally:
            for fd in theirs:
                os.close(fd)
        if message[0] != "started" or len(fds) != 1:
            for fd in (*ours, *fds):
                os.close(fd)
            if reply is not None:
                reply.close()
            detail = message[1] if message[0] == "failed" else "the launcher ended"
            raise SandboxHostError(f"cannot start bwrap ({self.binary}): {detail}")
        assert reply is not None and isinstance(message[1], int)
        return _Child(message[1], fds[0], reply, *ours)

    def execution_cgroups(self) -> list[Path]:
        """The pids cgroups of the executions under way (not those of the launcher's spares)."""
        return [c for c in self.cgroups.iterdir() if c.is_dir() and not c.name.startswith(SPARE_PREFIX)]

    def spare_pids(self) -> set[int]:
        """The launcher's waiting children (launcher_process.py), each alone in a cgroup of its own."""
        return {pid for c in self.cgroups.glob(f"{SPARE_PREFIX}*") for pid in PidsCgroup(c).pids()}

    def close(self) -> None:
        """End the launcher process and its spares (started again on the next run)."""
        self.launcher.close()

    def _watch(
        self,
        child: _Child,
        cgroup: PidsCgroup,
        limits: Limits,
        pipes: _Pipes,
        start: float,
        oom_before: int,
        stdin: bytes,
        environment: Environment | None,
    ) -> Execution:
        child.write_stdin(stdin)
        watched = _Watched(limits.output_bytes)
        _pump(child, cgroup, limits, pipes, start, watched)
        returncode = child.wait()
        wall = time.monotonic() - start
        with contextlib.suppress(OSError):
            while chunk := os.read(pipes.status, 1 << 16):
                watched.status += chunk
        out, err = watched.out, watched.err
        stopped = watched.timed_out or watched.over_output
        reports = _status_objects(bytes(watched.status))
        if not any("child-pid" in r for r in reports) and not stopped:
            raise SandboxHostError(
                f"bwrap did not start the sandbox (exit {returncode}): {err.text()[-500:].strip()!r}"
            )
        exit_status = next((r["exit-code"] for r in reports if "exit-code" in r), returncode)
        code: int | None = exit_status
        sig: int | None = None
        if exit_status is not None and exit_status > 128:
            sig, code = exit_status - 128, None
        cpu = max(watched.usage.cpu_s, child.cpu_s)
        if stopped:
            sig, code = None, None
        elif sig == signal.SIGKILL and cpu < limits.cpu_s and _oom_kills() > oom_before:
            raise SandboxHostError(
                "the kernel's OOM killer ended an execution (host short of memory); retry later"
            )
        return Execution(
            outcome=_outcome(watched, cgroup, limits, code, sig, cpu),
            exit_code=code,
            signal=sig,
            stdout=out.text(),
            stderr=err.text(),
            stdout_bytes=out.total,
            stderr_bytes=err.total,
            cpu_s=cpu,
            wall_s=wall,
            start_s=wall if watched.started_s is None else watched.started_s,
            peak_memory_bytes=watched.usage.peak_rss,
            limits=limits,
            environment_id=environment.id if environment is not None else "",
        )


@dataclass
class _Watched:
    """What watching one execution collected: its capped streams, bwrap's status, its usage."""

    output_bytes: int
    out: _Capped = field(init=False)
    err: _Capped = field(init=False)
    status: bytearray = field(default_factory=bytearray)
    usage: _Usage = field(default_factory=_Usage)
    timed_out: bool = False
    over_output: bool = False
    started_s: float | None = None
    """Seconds from the start until bwrap closed its start pipe (None: not seen yet)."""

    def __post_init__(self) -> None:
        self.out, self.err = _Capped(self.output_bytes), _Capped(self.output_bytes)


@dataclass(frozen=True, slots=True)
class _Pipes:
    """The worker's ends of bwrap's status pipe (read) and start pipe (write)."""

    status: int
    start: int


def _pump(
    child: _Child, cgroup: PidsCgroup, limits: Limits, pipes: _Pipes, start: float, watched: _Watched
) -> None:
    """Read the child's streams until it exits and its streams close, sampling its usage and
    noting when bwrap closed its start pipe; past the wall-clock limit or the output cap, kill its
    tree and stop reading. bwrap's status (a few hundred bytes) waits in its pipe until bwrap ended."""
    streams = {child.stdout: watched.out, child.stderr: watched.err}
    pidfd = child.pidfd
    poller = select.poll()
    for fd in (*streams, pidfd):
        poller.register(fd, select.POLLIN)
    poller.register(pipes.start, 0)  # a pipe's writer gets POLLERR once its last reader closed
    deadline = start + limits.wall_s
    next_sample = start + _SAMPLE_MS / 1000
    exited = False

    def kill_tree() -> None:
        child.kill()
        for pid in cgroup.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    while not exited or streams:
        now = time.monotonic()
        remaining = deadline - now
        if remaining <= 0 and not watched.timed_out:
            watched.timed_out = True
            kill_tree()
        if not exited and not watched.timed_out and now >= next_sample:
            watched.usage.sample(cgroup.pids())
            next_sample = now + _SAMPLE_MS / 1000
        wait_ms = 50 if watched.timed_out else max(1, min(_SAMPLE_MS, int(remaining * 1000) + 1))
        for fd, _ in poller.poll(wait_ms):
            if fd == pidfd:
                exited = True
                poller.unregister(pidfd)
                continue
            if fd == pipes.start:
                watched.started_s = time.monotonic() - start
                poller.unregister(fd)
                continue
            if fd not in streams:
                continue  # a stream dropped earlier in this batch of events
            chunk = os.read(fd, _CHUNK)
            if chunk:
                streams[fd].feed(chunk)
                if streams[fd].total > limits.output_bytes and not watched.over_output:
                    # past the cap: stop the tree and read no more of either stream
                    watched.over_output = True
                    kill_tree()
                    for open_fd in streams:
                        poller.unregister(open_fd)
                    streams.clear()
            else:
                poller.unregister(fd)
                del streams[fd]
        if exited and (watched.timed_out or watched.over_output):
            break


def _outcome(
    watched: _Watched, cgroup: PidsCgroup, limits: Limits, code: int | None, sig: int | None, cpu: float
) -> Outcome:
    """Which limit, if any, ended the execution."""
    if cgroup.limit_hits() > 0:  # a fork bomb, named even when it then ran out the clock
        return "process_limit"
    if watched.over_output:
        return "output_limit"
    if watched.timed_out:
        return "timeout"
    if sig == signal.SIGXCPU or (sig == signal.SIGKILL and cpu >= limits.cpu_s):
        return "cpu_limit"
    if sig == signal.SIGXFSZ:
        return "file_limit"
    if code not in (0, None) and "MemoryError" in watched.err.text()[-2000:]:
        return "memory_limit"
    return "exited" if sig is None else "signaled"


def _alive(pid: str) -> bool:
    return pid.isdigit() and psutil.pid_exists(int(pid))


def _remove_stale(cgroups: Path, work_root: Path) -> None:
    """Remove what workers that died (SIGKILL) left: their empty cgroups and task directories."""
    for worker in cgroups.glob("worker-*"):
        if _alive(worker.name.removeprefix("worker-")):
            continue
        for run in worker.iterdir():
            if run.is_dir():
                with contextlib.suppress(OSError):
                    PidsCgroup(run).destroy(timeout_s=1.0)
        with contextlib.suppress(OSError):
            worker.rmdir()
    for task_dir in work_root.iterdir():
        if not _alive(task_dir.name.partition("-")[0]):
            shutil.rmtree(task_dir, ignore_errors=True)


def _status_objects(raw: bytes) -> list[dict[str, int]]:
    """bwrap's --json-status-fd output: JSON objects, one after another."""
    decoder, text, out, i = json.JSONDecoder(), raw.decode(errors="replace"), [], 0
    while i < len(text):
        while i < len(text) and text[i].isspace():
            i += 1
        if i >= len(text):
            break
        try:
            obj, i = decoder.raw_decode(text, i)
        except ValueError:
            break
        if isinstance(obj, dict):
            out.append(obj)
    return out
