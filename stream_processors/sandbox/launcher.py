"""The worker's side of its launcher: a small long-lived process (launcher_process.py) that forks
bwrap on the worker's behalf, so a start costs the same whatever the worker's size, and its pids
cgroup is joined before the execution is asked for.

Forking copies the forking process's page tables while it holds the GIL: from a worker of
800 MB that took 18 to 25 ms of its CPU per execution. The child set-up before bwrap's exec
(join the pids cgroup, stage the binds, set the rlimits, drop to the host id) needs a fork, not a
vfork, so the worker leaves it to the launcher, a fresh interpreter started once per `Sandbox`
(launcher_process.py says what it does and how the two talk). `Launcher` starts it, sends it each
execution's `Request` with its descriptors, and starts it again when it died.
"""

from __future__ import annotations

import contextlib
import marshal
import os
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from stream_processors.sandbox import launcher_process
from stream_processors.sandbox.launcher_process import MAX_MESSAGE, SPARE_PREFIX
from stream_processors.sandbox.pids import PidsCgroup

if TYPE_CHECKING:
    from stream_processors.sandbox.limits import Limits
    from stream_processors.sandbox.privileges import Staging

__all__ = ["SPARE_PREFIX", "Launcher", "Request", "receive", "remove_spares"]


@dataclass(frozen=True, slots=True)
class Request:
    """One execution's start: bwrap's argv, its cgroup's name, limits, host id and staging."""

    argv: list[str]
    cgroup_name: str
    limits: Limits
    uid: int | None
    staging: Staging | None

    def encode(self) -> bytes:
        """The request as the launcher process reads it (plain values, marshalled)."""
        limits = self.limits
        rlimits = (int(limits.cpu_s), limits.memory_bytes, limits.open_files, limits.file_bytes)
        binds = None if self.staging is None else self.staging.binds
        return marshal.dumps((self.argv, self.cgroup_name, limits.processes, rlimits, self.uid, binds))


def remove_spares(cgroups: Path, launcher_pid: int) -> None:
    """Empty and remove the spares' cgroups the launcher `launcher_pid` left (it was killed)."""
    for path in cgroups.glob(f"{SPARE_PREFIX}{launcher_pid}-*"):
        with contextlib.suppress(OSError):
            PidsCgroup(path).destroy(timeout_s=1.0)


class Launcher:
    """The worker's handle on its launcher process; thread-safe, started on first use.

    Args:
        cgroups: the directory where the executions' pids cgroups (and the spares') are made.
    """

    def __init__(self, cgroups: Path) -> None:
        self.cgroups = cgroups
        self._lock = threading.Lock()
        self._control: socket.socket | None = None
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        """The launcher process's pid, or None before the first execution."""
        return None if self._process is None else self._process.pid

    def _ensure(self) -> socket.socket:
        with self._lock:
            if self._control is not None and self._process is not None and self._process.poll() is None:
                return self._control
            if self._process is not None:
                remove_spares(self.cgroups, self._process.pid)  # left if it was killed
            self.close_locked()
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            script = os.path.abspath(launcher_process.__file__)
            try:
                self._process = subprocess.Popen(
                    [sys.executable, "-I", "-S", script, str(theirs.fileno()), str(self.cgroups)],
                    pass_fds=(theirs.fileno(),),
                )
            finally:
                theirs.close()
            self._control = ours
            return ours

    def spawn(self, request: Request, fds: list[int]) -> socket.socket:
        """Ask the launcher to start `request` on `fds` (bwrap's stdin, stdout, stderr, status and
        start pipes, the task's files); returns the reply socket.

        Raises:
            OSError: the launcher could not be reached.
        """
        reply, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            data = request.encode()
            fds = [*fds, theirs.fileno()]
            try:
                socket.send_fds(self._ensure(), [data], fds)
            except OSError:  # the launcher ended: start another once
                with self._lock:
                    self.close_locked()
                socket.send_fds(self._ensure(), [data], fds)
        except BaseException:
            reply.close()
            raise
        finally:
            theirs.close()
        return reply

    def close_locked(self) -> None:
        if self._control is not None:
            self._control.close()
            self._control = None
        if self._process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._process.wait(timeout=5)
            self._process = None

    def close(self) -> None:
        """End the launcher (every execution it still runs dies with it)."""
        with self._lock:
            self.close_locked()


def receive(reply: socket.socket) -> tuple[tuple[object, ...], list[int]]:
    """One message from the launcher on an execution's reply socket, with its descriptors."""
    data, fds, _, _ = socket.recv_fds(reply, MAX_MESSAGE, 1)
    if not data:
        return ("lost",), fds
    message = marshal.loads(data)
    assert isinstance(message, tuple)
    return message, fds
