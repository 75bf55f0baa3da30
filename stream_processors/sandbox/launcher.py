"""A small long-lived process that forks bwrap on the worker's behalf, so a start costs the same
whatever the worker's size.

Forking copies the forking process's page tables while it holds the GIL: from a worker of
800 MB that took 18 to 25 ms of its CPU per execution. The child set-up before bwrap's exec
(join the pids cgroup, stage the binds, set the rlimits, drop to the host id) needs a fork, not a
vfork, so the worker leaves it to this launcher: a fresh interpreter that imports only the
sandbox's modules (and, through its errors, the schemas package), started once per `Sandbox`.

Protocol: over a private SOCK_SEQPACKET pair (nothing but the worker holds its other end, so the
pickles are the worker's own), the worker sends one message per execution, a
pickled `Request` with six descriptors (bwrap's stdin, stdout, stderr, its status pipe, its start
pipe, and a reply socket of that execution's own). The launcher starts bwrap with exactly the
same child set-up the worker would, then on the reply socket sends ``("started", pid)`` with a
pidfd of bwrap (opened before bwrap can be reaped), or ``("failed", message)``; once bwrap ends it
sends ``("ended", wait status, CPU seconds of bwrap)``. The descriptors are closed in the launcher
once bwrap has them; bwrap gets only its three streams and the status and start pipes
(``close_fds``).
When the worker goes (the control socket reaches EOF) the launcher exits, and every bwrap it
started dies with it (``--die-with-parent``), taking its PID namespace along.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass

from stream_processors.sandbox.limits import Limits, apply_rlimits
from stream_processors.sandbox.pids import PidsCgroup
from stream_processors.sandbox.privileges import Staging, drop_privileges, fail_in_child

_MAX_MESSAGE = 1 << 20
_FDS = 6


@dataclass(frozen=True, slots=True)
class Request:
    """One execution's start: bwrap's argv, its cgroup, limits, host id and staging."""

    argv: list[str]
    cgroup: PidsCgroup
    limits: Limits
    uid: int | None
    staging: Staging | None


def child_setup(
    cgroup: PidsCgroup, limits: Limits, uid: int | None, staging: Staging | None
) -> Callable[[], None]:
    """What the child does between fork and exec (no imports, no locks): join the cgroup, set the
    rlimits and, given a host `uid` (with its `staging`), first stage bwrap's binds and last become
    that id."""

    def setup() -> None:
        cgroup.join()
        if uid is None or staging is None:
            apply_rlimits(limits)
            return
        try:
            staging.enter()
            apply_rlimits(limits)
            drop_privileges(uid)
        except Exception as exc:  # never exec bwrap as root: end here, saying why
            fail_in_child(f"cannot run as uid {uid}: {exc}")

    return setup


def _send(reply: socket.socket, message: tuple[object, ...], fds: list[int] | None = None) -> None:
    with contextlib.suppress(OSError):
        socket.send_fds(reply, [pickle.dumps(message)], fds or [])


def _start(request: Request, fds: list[int]) -> None:
    """Start one bwrap, report it on its reply socket, wait for it, report its end."""
    stdin, stdout, stderr, status, start, reply_fd = fds
    reply = socket.socket(fileno=reply_fd)
    argv = list(request.argv)
    for option, fd in (("--json-status-fd", status), ("--block-fd", start)):
        argv[argv.index(option) + 1] = str(fd)  # bwrap's options: the first of each, before "--"
    try:
        try:
            proc = subprocess.Popen(
                argv,
                stdin=stdin,
                stdout=stdout,
                stderr=stderr,
                pass_fds=(status, start),
                env={},  # bwrap's own pid 1 keeps its environment, readable in the sandbox's /proc/1
                start_new_session=True,
                preexec_fn=child_setup(request.cgroup, request.limits, request.uid, request.staging),
                close_fds=True,
            )
        except (OSError, subprocess.SubprocessError) as exc:  # the latter: the child setup raised
            _send(reply, ("failed", str(exc)))
            return
        finally:
            for fd in (stdin, stdout, stderr, status, start):
                os.close(fd)
        pidfd = os.pidfd_open(proc.pid)  # bwrap is not reaped before the wait4 below
        try:
            _send(reply, ("started", proc.pid), [pidfd])
        finally:
            os.close(pidfd)
        _, wait_status, rusage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(wait_status)
        _send(reply, ("ended", wait_status, rusage.ru_utime + rusage.ru_stime))
    finally:
        reply.close()


def serve(control: socket.socket) -> None:
    """Start an execution per message on `control` until the worker closes it."""
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(control, _MAX_MESSAGE, _FDS)
        except InterruptedError:
            continue
        if not data:
            return
        if len(fds) != _FDS:
            for fd in fds:
                os.close(fd)
            continue
        threading.Thread(target=_start, args=(pickle.loads(data), fds), daemon=True).start()


def main() -> None:
    """Entry point of the launcher process: the control socket is descriptor ``argv[1]``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the worker's own shutdown ends it (EOF)
    serve(socket.socket(fileno=int(sys.argv[1])))
    os._exit(0)  # every bwrap still running dies with this process (--die-with-parent)


class Launcher:
    """The worker's handle on its launcher process; thread-safe, started on first use."""

    def __init__(self) -> None:
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
            self.close_locked()
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
            code = (
                f"import sys; sys.path.insert(0, {package_root!r}); "
                "from stream_processors.sandbox.launcher import main; main()"
            )
            try:
                self._process = subprocess.Popen(
                    [sys.executable, "-c", code, str(theirs.fileno())], pass_fds=(theirs.fileno(),)
                )
            finally:
                theirs.close()
            self._control = ours
            return ours

    def spawn(
        self, request: Request, stdin: int, stdout: int, stderr: int, status: int, start: int
    ) -> socket.socket:
        """Ask the launcher to start `request` on those descriptors; returns the reply socket.

        Raises:
            OSError: the launcher could not be reached.
        """
        reply, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            data = pickle.dumps(request)
            fds = [stdin, stdout, stderr, status, start, theirs.fileno()]
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
    data, fds, _, _ = socket.recv_fds(reply, _MAX_MESSAGE, 1)
    if not data:
        return ("lost",), fds
    return pickle.loads(data), fds
