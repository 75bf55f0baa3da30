"""The launcher process: it forks bwrap on the worker's behalf (launcher.py is the worker's side).

It is started as a script (``python -I -S launcher_process.py <control fd> <cgroups dir>``) and
imports only built-in and small standard modules, none of the project's packages: every execution
forks it, and a fork copies its page tables and then, page by page, what either side writes. Its
size is what each start pays: about 5 MB of private memory (docs/sandbox.md, The launcher).

It keeps SPARES children forked ahead, each already alone in a fresh pids cgroup of its own
(``spare-<launcher pid>-<n>`` beside the executions' cgroups) and waiting for one request. An
execution takes a spare: once the spare has said it tried to join (JOINED), its cgroup is renamed
to the execution's name and given the execution's ``pids.max``; the spare then finishes the child
set-up (stage the binds, rlimits, drop to the host id) and execs bwrap; a new spare is forked after
the worker has its answer. bwrap and everything under it are in the execution's cgroup from their
first instruction.

Protocol: over a private SOCK_SEQPACKET pair (nothing but the worker holds its other end, so the
messages are the worker's own), the worker sends one message per execution: a marshalled request
``(argv, cgroup name, pids.max, (cpu s, address space, open files, file size), host uid or None,
staged binds or None)`` with its descriptors (bwrap's stdin, stdout, stderr, its status pipe, its
start pipe, a memory file per task file, and last a reply socket of that execution's own). The
launcher hands all but the reply socket to a spare, which puts them at 0, 1, 2 and from 3 on (the
numbers bwrap's argv names), then on the reply socket sends ``("started", pid)`` with a pidfd of
the spare that is becoming bwrap (opened before it can be reaped), or ``("failed", message)``;
once bwrap ends it sends ``("ended", wait status, CPU seconds of bwrap)``. A spare that cannot
finish the set-up or exec bwrap ends with FAILED_IN_CHILD, saying why on the execution's stderr.
bwrap gets only those descriptors. One thread serves it all: the control socket and a pidfd per
running bwrap in one poll.

When the worker goes (the control socket reaches EOF) the launcher ends its spares, removes their
cgroups and exits, and every bwrap it started dies with it (``--die-with-parent``), taking its PID
namespace along. Spares of a launcher that was killed see their socket close and exit; the worker
removes their cgroups when it starts the next launcher.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import gc
import itertools
import marshal
import os
import resource
import select
import signal
import socket
import sys
import time

SPARES = 2
"""Children the launcher keeps waiting in their joined cgroups (the pool's default size)."""
SPARE_PREFIX = "spare-"
"""Name prefix of a waiting spare's cgroup; an execution's cgroup never starts with it."""
MAX_FILES = 32
"""Most files one execution's /task may hold (each is a descriptor bwrap is given)."""
FAILED_IN_CHILD = 126
"""Exit status of a child that could not become the sandbox's user (it never ran bwrap)."""
STAGE = "/tmp"
"""Where, in a spare's own mount namespace only, a tmpfs holds the directories bwrap binds."""
JOINED = b"j"
"""What a spare sends once it has tried to join its cgroup (a rename before that would lose it)."""
MAX_MESSAGE = 1 << 20
_BWRAP_FDS = 5 + MAX_FILES
"""Most descriptors bwrap is given: its three streams, status and start pipes, the task's files."""
FDS = _BWRAP_FDS + 1
"""Most descriptors of a request: bwrap's, then the execution's reply socket."""

_CLONE_NEWNS = 0x00020000
_MS_NOSUID, _MS_NODEV, _MS_BIND, _MS_REC, _MS_SLAVE = 0x2, 0x4, 0x1000, 0x4000, 0x80000
_libc = ctypes.CDLL(None, use_errno=True)  # resolved here, never after a fork
_unshare = _libc.unshare
_unshare.argtypes = [ctypes.c_int]
_mount = _libc.mount
_mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def stage(binds: tuple[tuple[str, str], ...]) -> None:
    """In a spare, as root: a mount namespace of its own with `binds` (source, mount point) in a
    tmpfs on STAGE.

    The sources are opened before STAGE is covered (one may lie under it) and bound through their
    descriptors. The umask becomes 022 so the host id can cross the mount points.
    """
    _check(_unshare(_CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    _check(_mount(None, b"/", None, _MS_REC | _MS_SLAVE, None), "making / a slave mount")
    fds = [os.open(source, os.O_PATH | os.O_DIRECTORY) for source, _ in binds]
    tmpfs = _mount(b"tmpfs", STAGE.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV, b"mode=0755,size=64k")
    _check(tmpfs, f"a tmpfs on {STAGE}")
    os.umask(0o022)
    for fd, (source, target) in zip(fds, binds, strict=True):
        os.makedirs(target)
        fd_path = f"/proc/self/fd/{fd}".encode()
        _check(_mount(fd_path, target.encode(), None, _MS_BIND | _MS_REC, None), f"binding {source}")
        os.close(fd)


def drop_privileges(uid: int) -> None:
    """In a spare, last before the exec: no supplementary group, then gid and uid (real, effective, saved)."""
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    if os.getresuid() != (uid, uid, uid) or os.getresgid() != (uid, uid, uid) or os.getgroups():
        raise PermissionError(f"still {os.getresuid()}, {os.getresgid()}, groups {os.getgroups()}")


def fail_in_child(message: str) -> None:
    """End the child before bwrap runs, saying why on its stderr (read as the execution's stderr)."""
    with contextlib.suppress(OSError):
        os.write(2, f"rollstream sandbox: {message}\n".encode(errors="replace"))
    os._exit(FAILED_IN_CHILD)


def apply_rlimits(cpu_s: int, memory_bytes: int, open_files: int, file_bytes: int) -> None:
    """Set the rlimits in the calling process (a spare before its exec); bwrap inherits them."""
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    resource.setrlimit(resource.RLIMIT_NOFILE, (open_files, open_files))
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_bytes, file_bytes))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def child_setup(
    rlimits: tuple[int, int, int, int], uid: int | None, binds: tuple[tuple[str, str], ...] | None
) -> None:
    """What a spare does once it has its request, after joining its cgroup (no imports, no locks):
    set the rlimits and, given a host `uid` (with its `binds`), first stage the binds and last
    become that id. Ends the process (FAILED_IN_CHILD) rather than go on as root."""
    if uid is None or binds is None:
        apply_rlimits(*rlimits)
        return
    try:
        stage(binds)
        apply_rlimits(*rlimits)
        drop_privileges(uid)
    except Exception as exc:  # never exec bwrap as root: end here, saying why
        fail_in_child(f"cannot run as uid {uid}: {exc}")


def read_small(path: str) -> bytes:
    """A small /proc or cgroup file's bytes (one read of 64 KiB; no buffered file object)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, 1 << 16)
    finally:
        os.close(fd)


def _write(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def destroy_cgroup(path: str, timeout_s: float = 1.0) -> None:
    """SIGKILL whatever is left in the cgroup at `path`, wait for it to go, remove the cgroup.

    An ended sandbox's PID 1 stays in the cgroup until whoever inherited it reaps it, so the
    removal is retried after 0.5 ms, then twice as long each time up to 5 ms. Each pid is
    signalled through a pidfd opened before its membership is checked again (`_kill_member`), so a
    pid that was reaped and reused by a process outside the cgroup is never signalled.

    Raises:
        OSError: the cgroup was still there after `timeout_s`.
    """
    deadline = time.monotonic() + timeout_s
    pause = 0.0005
    while True:
        with contextlib.suppress(OSError):
            os.rmdir(path)
            return
        if time.monotonic() > deadline:
            os.rmdir(path)  # raises what keeps it
        for pid in _members(path):
            _kill_member(path, pid)
        time.sleep(pause)
        pause = min(0.005, pause * 2)


def _members(path: str) -> list[int]:
    """The pids in the cgroup at `path` (none once it is gone)."""
    try:
        return [int(p) for p in read_small(f"{path}/cgroup.procs").split()]
    except OSError:
        return []


def _kill_member(path: str, pid: int) -> None:
    """SIGKILL `pid` if it is still a member of the cgroup at `path`.

    The pidfd pins the process that had `pid` when it was opened; membership is checked after
    that, so the signal reaches a process that was in the cgroup at the check, or nothing (a
    process that ended since fails with ESRCH, and a reused pid outside the cgroup is skipped).
    """
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:  # already reaped
        return
    try:
        if pid in _members(path):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    finally:
        os.close(pidfd)


class _Spare:
    """A forked child alone in its joined pids cgroup (at `cgroup`), waiting on `sock` for one request."""

    def __init__(self, pid: int, sock: socket.socket, cgroup: str) -> None:
        self.pid, self.sock, self.cgroup = pid, sock, cgroup

    @classmethod
    def fork(cls, cgroups: str, name: str) -> _Spare:
        """Fork a spare into a new cgroup `name` under `cgroups`.

        Raises:
            OSError: the cgroup or the process could not be made.
        """
        cgroup = f"{cgroups}/{name}"
        os.mkdir(cgroup)
        try:
            _write(f"{cgroup}/pids.max", b"1")  # the spare alone; its execution's limit comes later
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        except OSError:
            os.rmdir(cgroup)
            raise
        gc.freeze()  # the collector then leaves the launcher's objects alone: fewer pages copied on write
        try:
            pid = os.fork()
        except OSError:
            ours.close()
            theirs.close()
            destroy_cgroup(cgroup)
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
            destroy_cgroup(self.cgroup)


def _spare_main(sock: socket.socket, cgroup: str) -> None:
    """A spare's life: join its cgroup, wait for a request, finish the child set-up, exec bwrap."""
    gc.disable()  # it execs soon: a collection would only copy the launcher's pages
    os.closerange(3, sock.fileno())  # the launcher's sockets and other spares' are not ours
    os.closerange(sock.fileno() + 1, os.sysconf("SC_OPEN_MAX"))
    joined: str | None = None
    try:
        _write(f"{cgroup}/cgroup.procs", b"0")
    except OSError as exc:
        joined = f"cannot join the execution's pids cgroup: {exc}"
    try:
        sock.send(JOINED)  # the launcher renames the cgroup only after this
        data, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE, _BWRAP_FDS)
    except OSError:
        os._exit(0)
    if not data or len(fds) < 5:
        os._exit(0)  # the launcher ended: nothing to run
    sock.close()  # before the descriptors move: its number may be one of their targets
    argv, _, _, rlimits, uid, binds = marshal.loads(data)
    kept = len(fds) - 3  # status pipe, start pipe, the task's files: descriptors 3, 4, 5, ... for bwrap
    moved = [fcntl.fcntl(fd, fcntl.F_DUPFD, 3 + len(fds)) for fd in fds]  # above every target
    for fd in fds:
        os.close(fd)
    for target, fd in enumerate(moved):
        os.dup2(fd, target)  # inheritable: bwrap gets them
        os.close(fd)
    # what subprocess does for a child: Python's ignored SIGPIPE and SIGXFSZ back to their defaults
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
    os.setsid()
    if joined is not None:
        fail_in_child(joined)
    child_setup(rlimits, uid, binds)
    os.closerange(3 + kept, os.sysconf("SC_OPEN_MAX"))
    try:
        # bwrap's own pid 1 keeps its environment, readable in the sandbox's /proc/1: give it none
        os.execve(argv[0], argv, {})
    except OSError as exc:
        fail_in_child(f"cannot start bwrap ({argv[0]}): {exc}")


def _send(reply: socket.socket, message: tuple[str | int | float, ...], fds: list[int] | None = None) -> None:
    with contextlib.suppress(OSError):
        socket.send_fds(reply, [marshal.dumps(message)], fds or [])


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


def _hand_over(data: bytes, fds: list[int], spare: _Spare) -> _Running | None:
    """Hand one execution to `spare` and report it on its reply socket: what to wait for, or None
    when it did not start (reported as failed)."""
    *bwrap_fds, reply_fd = fds
    reply = socket.socket(fileno=reply_fd)
    try:
        try:
            if spare.sock.recv(len(JOINED)) != JOINED:  # it has tried to join its cgroup
                raise OSError("the launcher child ended before it joined its cgroup")
            _, name, pids_max, _, _, _ = marshal.loads(data)
            renamed = f"{os.path.dirname(spare.cgroup)}/{name}"
            os.rename(spare.cgroup, renamed)  # the spare stays in it
            spare.cgroup = renamed
            _write(f"{renamed}/pids.max", str(pids_max).encode())
            socket.send_fds(spare.sock, [data], bwrap_fds)
        except (OSError, ValueError, EOFError, TypeError) as exc:
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


def _request(data: bytes, fds: list[int], spares: list[_Spare], cgroups: str, name: str) -> _Running | None:
    """Start the request `data` on a waiting spare (forked now when none waits); None when it did
    not start."""
    if len(fds) < 6:
        for fd in fds:
            os.close(fd)
        return None
    try:
        spare = spares.pop(0) if spares else _Spare.fork(cgroups, name)
    except OSError as exc:
        for fd in fds[:-1]:
            os.close(fd)
        reply = socket.socket(fileno=fds[-1])
        _send(reply, ("failed", f"cannot create the pids cgroup or process of an execution: {exc}"))
        reply.close()
        return None
    return _hand_over(data, fds, spare)


def serve(control: socket.socket, cgroups: str) -> None:
    """Start an execution per message on `control` until the worker closes it, on spares whose
    cgroups are made under `cgroups`; report each one's end when its pidfd turns readable.

    A request is handed to a waiting spare and answered before a new spare is forked, and no
    thread is started per execution.
    """
    names = (f"{SPARE_PREFIX}{os.getpid()}-{n}" for n in itertools.count())
    spares: list[_Spare] = []
    running: dict[int, _Running] = {}
    poller = select.poll()
    poller.register(control, select.POLLIN)
    try:
        while True:
            try:  # tried again after the next event
                while len(spares) < SPARES:
                    spares.append(_Spare.fork(cgroups, next(names)))
            except OSError:
                pass
            for fd, _ in poller.poll():
                if fd != control.fileno():
                    poller.unregister(fd)
                    running.pop(fd).end()
                    continue
                try:
                    data, fds, _, _ = socket.recv_fds(control, MAX_MESSAGE, FDS)
                except InterruptedError:
                    continue
                if not data:
                    return
                started = _request(data, fds, spares, cgroups, next(names))
                if started is not None:
                    running[started.pidfd] = started
                    poller.register(started.pidfd, select.POLLIN)
    finally:
        for spare in spares:
            spare.retire()


def main() -> None:
    """Entry point of the launcher process: the control socket is descriptor ``argv[1]``, the
    directory of the executions' cgroups ``argv[2]``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the worker's own shutdown ends it (EOF)
    serve(socket.socket(fileno=int(sys.argv[1])), sys.argv[2])
    os._exit(0)  # every bwrap still running dies with this process (--die-with-parent)


if __name__ == "__main__":
    main()
