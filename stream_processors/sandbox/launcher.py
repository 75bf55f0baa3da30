"""A small long-lived process that forks bwrap on the worker's behalf, so a start costs the same
whatever the worker's size, and its pids cgroup is joined before the execution is asked for.

Forking copies the forking process's page tables while it holds the GIL: from a worker of
800 MB that took 18 to 25 ms of its CPU per execution. The child set-up before bwrap's exec
(join the pids cgroup, stage the binds, set the rlimits, drop to the host id) needs a fork, not a
vfork, so the worker leaves it to this launcher: a fresh interpreter that imports only the
sandbox's modules (and, through its errors, the schemas package), started once per `Sandbox`.

Joining a cgroup v1 hierarchy waits for an RCU grace period (the kernel's cgroup_threadgroup_rwsem
is taken for writing): 5 to 10 ms of wall-clock time, almost no CPU, measured here. So the launcher
keeps SPARES children forked ahead, each already alone in a fresh pids cgroup of its own
(``spare-<launcher pid>-<n>`` beside the executions' cgroups) and waiting for one request. An
execution takes a spare: its cgroup is renamed to the execution's name and given the execution's
``pids.max``, then the spare does the rest of the child set-up (stage, rlimits, drop) and execs
bwrap, in the same order as before; a new spare is forked at once. bwrap and everything under it are
in the execution's cgroup from their first instruction, as before.

Protocol: over a private SOCK_SEQPACKET pair (nothing but the worker holds its other end, so the
pickles are the worker's own), the worker sends one message per execution, a
pickled `Request` with its descriptors (bwrap's stdin, stdout, stderr, its status pipe, its start
pipe, a memory file per task file, and last a reply socket of that execution's own). The launcher
hands all but the reply socket to a spare, which puts them at 0, 1, 2, then STATUS_FD, START_FD
and from FIRST_FILE_FD on (the numbers bwrap's argv names), then on the reply socket sends
``("started", pid)`` with a pidfd of the spare that is becoming bwrap (opened before it can be
reaped), or ``("failed", message)``; once bwrap ends it sends ``("ended", wait status, CPU
seconds of bwrap)``. A spare that cannot finish the set-up or exec bwrap ends with
FAILED_IN_CHILD, saying why on the execution's stderr. bwrap gets only those descriptors.
One thread serves it all: the control socket and a pidfd per running bwrap in one poll.
When the worker goes (the control socket reaches EOF) the launcher ends its spares, removes their
cgroups and exits, and every bwrap it started dies with it (``--die-with-parent``), taking its PID
namespace along. Spares of a launcher that was killed see their socket close and exit; the worker
removes their cgroups when it starts the next launcher.
"""

from __future__ import annotations

import contextlib
import fcntl
import gc
import itertools
import os
import pickle
import select
import signal
import socket
import subprocess
import sys
import threading
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from stream_processors.sandbox.bwrap import MAX_FILES
from stream_processors.sandbox.limits import Limits, apply_rlimits
from stream_processors.sandbox.pids import PidsCgroup
from stream_processors.sandbox.privileges import FAILED_IN_CHILD, Staging, drop_privileges, fail_in_child

_MAX_MESSAGE = 1 << 20
_BWRAP_FDS = 5 + MAX_FILES
"""Most descriptors bwrap is given: its three streams, status and start pipes, the task's files."""
_FDS = _BWRAP_FDS + 1
"""Most descriptors of a request: bwrap's, then the execution's reply socket."""
SPARES = 2
"""Children the launcher keeps waiting in their joined cgroups (the pool's default size)."""
_JOINED = b"j"
"""What a spare sends once it has tried to join its cgroup (a rename before that would lose it)."""
SPARE_PREFIX = "spare-"
"""Name prefix of a waiting spare's cgroup; an execution's cgroup never starts with it."""


@dataclass(frozen=True, slots=True)
class Request:
    """One execution's start: bwrap's argv, its cgroup's name, limits, host id and staging."""

    argv: list[str]
    cgroup_name: str
    limits: Limits
    uid: int | None
    staging: Staging | None


def child_setup(limits: Limits, uid: int | None, staging: Staging | None) -> None:
    """What a spare does once it has its request, after joining its cgroup (no imports, no locks):
    set the rlimits and, given a host `uid` (with its `staging`), first stage bwrap's binds and
    last become that id. Ends the process (FAILED_IN_CHILD) rather than go on as root."""
    if uid is None or staging is None:
        apply_rlimits(limits)
        return
    try:
        staging.enter()
        apply_rlimits(limits)
        drop_privileges(uid)
    except Exception as exc:  # never exec bwrap as root: end here, saying why
        fail_in_child(f"cannot run as uid {uid}: {exc}")


class _Spare:
    """A forked child alone in its joined pids cgroup, waiting on `sock` for one request."""

    def __init__(self, pid: int, sock: socket.socket, cgroup: PidsCgroup) -> None:
        self.pid, self.sock, self.cgroup = pid, sock, cgroup

    @classmethod
    def fork(cls, cgroups: Path, name: str) -> _Spare:
        """Fork a spare into a new cgroup `name` under `cgroups`.

        Raises:
            OSError: the cgroup or the process could not be made.
        """
        cgroup = PidsCgroup(cgroups, name, 1)  # the spare alone; its execution's limit comes later
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        gc.freeze()  # the collector then leaves the launcher's objects alone: fewer pages copied on write
        try:
            pid = os.fork()
        except OSError:
            ours.close()
            theirs.close()
            cgroup.destroy(timeout_s=1.0)
            raise
        if pid == 0:  # the spare: never returns into the launcher's code
            try:
                _spare_main(theirs, cgroup)
            finally:
                os._exit(FAILED_IN_CHILD)
        theirs.close()
        return cls(pid, ours, cgroup)

    def retire(self) -> None:
        """End an unused spare (it sees its socket close), reap it and remove its cgroup."""
        self.sock.close()
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)
        with contextlib.suppress(OSError):
            self.cgroup.destroy(timeout_s=1.0)


def _spare_main(sock: socket.socket, cgroup: PidsCgroup) -> NoReturn:
    """A spare's life: join its cgroup, wait for a request, finish the child set-up, exec bwrap."""
    gc.disable()  # it execs soon: a collection would only copy the launcher's pages
    os.closerange(3, sock.fileno())  # the launcher's sockets and other spares' are not ours
    os.closerange(sock.fileno() + 1, os.sysconf("SC_OPEN_MAX"))
    joined: str | None = None
    try:
        cgroup.join()
    except OSError as exc:
        joined = f"cannot join the execution's pids cgroup: {exc}"
    try:
        sock.send(_JOINED)  # the launcher renames the cgroup only after this
        data, fds, _, _ = socket.recv_fds(sock, _MAX_MESSAGE, _BWRAP_FDS)
    except OSError:
        os._exit(0)
    if not data or len(fds) < 5:
        os._exit(0)  # the launcher ended: nothing to run
    sock.close()  # before the descriptors move: its number may be one of their targets
    request: Request = pickle.loads(data)
    kept = len(fds) - 3  # status pipe, start pipe, the task's files: descriptors 3, 4, 5, ... for bwrap
    moved = [fcntl.fcntl(fd, fcntl.F_DUPFD, 3 + len(fds)) for fd in fds]  # above every target
    for fd in fds:
        os.close(fd)
    for target, fd in enumerate(moved):
        os.dup2(fd, target)  # inheritable: bwrap gets them
        os.close(fd)
    # what subprocess does for a child: Python's ignored SIGPIPE and SIGXFSZ back to their defaults
    for name in ("SIGPIPE", "SIGXFSZ", "SIGXFZ"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_DFL)
    os.setsid()
    if joined is not None:
        fail_in_child(joined)
    child_setup(request.limits, request.uid, request.staging)
    os.closerange(3 + kept, os.sysconf("SC_OPEN_MAX"))
    argv = request.argv
    try:
        # bwrap's own pid 1 keeps its environment, readable in the sandbox's /proc/1: give it none
        os.execve(argv[0], argv, {})
    except OSError as exc:
        fail_in_child(f"cannot start bwrap ({argv[0]}): {exc}")
    os._exit(FAILED_IN_CHILD)


def _send(reply: socket.socket, message: tuple[object, ...], fds: list[int] | None = None) -> None:
    with contextlib.suppress(OSError):
        socket.send_fds(reply, [pickle.dumps(message)], fds or [])


def _hand_over(request: Request, fds: list[int], spare: _Spare) -> _Running | None:
    """Hand one execution to `spare` and report it on its reply socket: what to wait for, or None
    when it did not start (reported as failed)."""
    *bwrap_fds, reply_fd = fds
    reply = socket.socket(fileno=reply_fd)
    try:
        try:
            if spare.sock.recv(len(_JOINED)) != _JOINED:  # it has tried to join its cgroup
                raise OSError("the launcher child ended before it joined its cgroup")
            spare.cgroup = spare.cgroup.rename(request.cgroup_name)
            spare.cgroup.limit(request.limits.processes)
            socket.send_fds(spare.sock, [pickle.dumps(request)], bwrap_fds)
        except OSError as exc:
            spare.retire()
            _send(reply, ("failed", f"cannot hand the execution to a launcher child: {exc}"))
            reply.close()
            return None
        finally:
            for fd in bwrap_fds:
                os.close(fd)
            spare.sock.close()
        try:
            pidfd = os.pidfd_open(spare.pid)  # the spare is not reaped before `_Running.end`
        except OSError as exc:
            os.kill(spare.pid, signal.SIGKILL)  # never a bwrap the launcher cannot follow
            os.waitpid(spare.pid, 0)
            _send(reply, ("failed", f"cannot follow the launcher child: {exc}"))
            reply.close()
            return None
    except BaseException:
        reply.close()
        raise
    _send(reply, ("started", spare.pid), [pidfd])
    return _Running(spare.pid, pidfd, reply)


class _Running:
    """An execution whose bwrap runs: its pid, a pidfd that turns readable when it ends, and the
    reply socket its end is reported on."""

    def __init__(self, pid: int, pidfd: int, reply: socket.socket) -> None:
        self.pid, self.pidfd, self.reply = pid, pidfd, reply

    def end(self) -> None:
        """Reap bwrap (it has ended: its pidfd is readable) and report its wait status and CPU."""
        try:
            _, wait_status, rusage = os.wait4(self.pid, 0)
            _send(self.reply, ("ended", wait_status, rusage.ru_utime + rusage.ru_stime))
        except ChildProcessError:
            pass  # not ours to reap: the worker reads the closed reply as the launcher's failure
        finally:
            os.close(self.pidfd)
            self.reply.close()


def serve(control: socket.socket, cgroups: Path) -> None:
    """Start an execution per message on `control` until the worker closes it, on spares whose
    cgroups are made under `cgroups`; report each one's end when its pidfd turns readable.

    One thread does it all: a request is handed to a waiting spare and answered before a new
    spare is forked, and no thread is started per execution.
    """
    names = (f"{SPARE_PREFIX}{os.getpid()}-{n}" for n in itertools.count())
    spares: deque[_Spare] = deque()
    running: dict[int, _Running] = {}
    poller = select.poll()
    poller.register(control, select.POLLIN)

    def refill() -> None:
        with contextlib.suppress(OSError):  # tried again after the next event
            while len(spares) < SPARES:
                spares.append(_Spare.fork(cgroups, next(names)))

    try:
        while True:
            refill()
            for fd, _ in poller.poll():
                if fd != control.fileno():
                    poller.unregister(fd)
                    running.pop(fd).end()
                    continue
                try:
                    data, fds, _, _ = socket.recv_fds(control, _MAX_MESSAGE, _FDS)
                except InterruptedError:
                    continue
                if not data:
                    return
                started = _request(pickle.loads(data), fds, spares, cgroups, next(names))
                if started is not None:
                    running[started.pidfd] = started
                    poller.register(started.pidfd, select.POLLIN)
    finally:
        for spare in spares:
            spare.retire()


def _request(
    request: Request, fds: list[int], spares: deque[_Spare], cgroups: Path, name: str
) -> _Running | None:
    """Start `request` on a waiting spare (forked now when none waits); None when it did not start."""
    if len(fds) < 6:
        for fd in fds:
            os.close(fd)
        return None
    try:
        spare = spares.popleft() if spares else _Spare.fork(cgroups, name)
    except OSError as exc:
        for fd in fds[:-1]:
            os.close(fd)
        reply = socket.socket(fileno=fds[-1])
        _send(reply, ("failed", f"cannot create the pids cgroup or process of an execution: {exc}"))
        reply.close()
        return None
    return _hand_over(request, fds, spare)


def main() -> None:
    """Entry point of the launcher process: the control socket is descriptor ``argv[1]``, the
    directory of the executions' cgroups ``argv[2]``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the worker's own shutdown ends it (EOF)
    serve(socket.socket(fileno=int(sys.argv[1])), Path(sys.argv[2]))
    os._exit(0)  # every bwrap still running dies with this process (--die-with-parent)


def remove_spares(cgroups: Path, launcher_pid: int) -> None:
    """Empty and remove the spares' cgroups the launcher `launcher_pid` left (it was killed)."""
    for path in cgroups.glob(f"{SPARE_PREFIX}{launcher_pid}-*"):
        with contextlib.suppress(OSError):
            PidsCgroup.existing(path).destroy(timeout_s=1.0)


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
            package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
            code = (
                f"import sys; sys.path.insert(0, {package_root!r}); "
                "from stream_processors.sandbox.launcher import main; main()"
            )
            try:
                self._process = subprocess.Popen(
                    [sys.executable, "-I", "-S", "-c", code, str(theirs.fileno()), str(self.cgroups)],
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
            data = pickle.dumps(request)
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
    data, fds, _, _ = socket.recv_fds(reply, _MAX_MESSAGE, 1)
    if not data:
        return ("lost",), fds
    return pickle.loads(data), fds
