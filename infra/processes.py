"""Detached service processes tracked by pid files, and the port checks done before starting one.

A pid file alone never justifies a signal: a process counts as ours only while it is alive and its
command line carries markers (main class, config path) that only our launch produces, so a reused
pid is never touched. Nothing here finds or kills processes by name.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import psutil
import tenacity

from infra.exceptions import PortInUseError

T = TypeVar("T")


def stderr_progress(message: str) -> None:
    """Default progress sink: one line per step on stderr, so stdout stays machine-readable."""
    print(f"rollstream: {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class ProcessStatus:
    """One local service process as seen from its pid file.

    Attributes:
        name: Human name of the service, e.g. ``kafka broker``.
        running: Whether the pid file names a live process that is ours.
        pid: That process id, or None when not running.
        log_file: Where the service writes its log.
        url: Where clients reach it (``host:port`` or an http URL).
    """

    name: str
    running: bool
    pid: int | None
    log_file: Path
    url: str


def port_is_free(host: str, port: int) -> bool:
    """Whether a listening socket could bind ``host:port`` now (TIME_WAIT leftovers do not count)."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError:
            return False
    return True


def require_free_port(host: str, port: int, *, flag: str, env: str) -> None:
    """Raise a clear error when another process holds ``host:port``.

    Raises:
        PortInUseError: the port cannot be bound; the message names the flag and variable to change it.
    """
    if not port_is_free(host, port):
        raise PortInUseError(
            f"port {port} on {host} is taken by another process; pick another with {flag} or {env}"
        )


def can_connect(host: str, port: int, timeout: float = 1.0) -> bool:
    """Whether something accepts TCP connections on ``host:port``."""
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError:
        return False
    return True


def read_pid(pid_file: Path) -> int | None:
    """The pid recorded in ``pid_file``, or None when the file is missing or garbled."""
    try:
        return int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return None


def is_alive(pid: int) -> bool:
    """Whether ``pid`` runs; reaps it when it is an exited child of this interpreter.

    A zombie leader with live threads counts as alive: a JVM's main thread can be a zombie while
    its other threads are still shutting the broker down.
    """
    if _reap(pid):
        return False
    try:
        process = psutil.Process(pid)
        if process.status() != psutil.STATUS_ZOMBIE:
            return True
        return process.num_threads() > 1
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False


def _reap(pid: int) -> bool:
    """Collect ``pid``'s exit status if it is our exited child; True when it was."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return False
    return done == pid


def command_line(pid: int) -> list[str]:
    """The argv of ``pid``, empty when it is gone."""
    try:
        return psutil.Process(pid).cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return []


def owned_pid(pid_file: Path, markers: Sequence[str]) -> int | None:
    """The live pid in ``pid_file`` whose argv contains every marker, else None."""
    pid = read_pid(pid_file)
    if pid is None or not is_alive(pid):
        return None
    argv = command_line(pid)
    return pid if all(marker in argv for marker in markers) else None


def spawn_detached(
    argv: Sequence[str],
    *,
    pid_file: Path,
    log_file: Path,
    cwd: Path,
    env: Mapping[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``argv`` in its own session with output to ``log_file``, and record its pid."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "ab") as log:
        process = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=None if env is None else dict(env),
            start_new_session=True,
        )
    staging = pid_file.with_suffix(".tmp")
    staging.write_text(f"{process.pid}\n")
    staging.replace(pid_file)
    return process


def start_service(
    argv: Sequence[str],
    *,
    pid_file: Path,
    log_file: Path,
    cwd: Path,
    wait_ready: Callable[[subprocess.Popen[bytes]], None],
    env: Mapping[str, str] | None = None,
    group: bool = False,
) -> subprocess.Popen[bytes]:
    """Spawn a detached service and wait until `wait_ready` returns.

    If waiting fails (or is interrupted), whatever started is stopped and its pid file removed
    before the error propagates, so a failed start leaves nothing behind.
    """
    process = spawn_detached(argv, pid_file=pid_file, log_file=log_file, cwd=cwd, env=env)
    try:
        wait_ready(process)
    except BaseException:
        if process.poll() is None:
            terminate(process.pid, timeout=15.0, group=group)
        pid_file.unlink(missing_ok=True)
        raise
    return process


def stop_service(pid: int | None, pid_file: Path, *, timeout: float, group: bool = False) -> int | None:
    """Stop a service found running by its pid file (None: nothing ran); returns that pid."""
    if pid is not None:
        terminate(pid, timeout=timeout, group=group)
    pid_file.unlink(missing_ok=True)
    return pid


def terminate(pid: int, *, timeout: float, group: bool = False) -> bool:
    """SIGTERM ``pid`` (or its process group), wait up to ``timeout`` s, then SIGKILL.

    Args:
        pid: A process this package started and verified with ``owned_pid``.
        timeout: Seconds to wait for a graceful exit.
        group: Signal, and wait for, the whole process group led by ``pid`` (services that fork
            workers); only honoured when ``pid`` really leads its group, as our detached launches do.

    Returns:
        True when everything exited on SIGTERM, False when something had to be killed.
    """
    use_group = group and _leads_group(pid)

    def send(sig: signal.Signals) -> None:
        try:
            if use_group:
                os.killpg(pid, sig)
            else:
                os.kill(pid, sig)
        except ProcessLookupError:
            pass

    def gone() -> bool:
        leader_gone = not is_alive(pid)
        return leader_gone and not (use_group and group_members(pid))

    send(signal.SIGTERM)
    if _wait(gone, timeout):
        return True
    send(signal.SIGKILL)
    _wait(gone, 10.0)
    return False


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) pids in process group ``pgid``."""
    members = []
    for process in psutil.process_iter(["status"]):
        try:
            if os.getpgid(process.pid) == pgid and process.info["status"] != psutil.STATUS_ZOMBIE:
                members.append(process.pid)
        except (ProcessLookupError, psutil.NoSuchProcess):
            continue
    return members


def poll_until(check: Callable[[], T | None], *, timeout: float, interval: float = 0.1) -> T | None:
    """Call `check` every `interval` s until it returns something other than None, or `timeout` passes.

    Exceptions from `check` propagate at once (they are not retried); returns None on timeout.
    """
    retrying = tenacity.Retrying(
        stop=tenacity.stop_after_delay(timeout),
        wait=tenacity.wait_fixed(interval),
        retry=tenacity.retry_if_result(lambda result: result is None),
        retry_error_callback=lambda _: None,
    )
    return retrying(check)


def _wait(done: Callable[[], bool], timeout: float) -> bool:
    return poll_until(lambda: True if done() else None, timeout=timeout) is not None


def _leads_group(pid: int) -> bool:
    try:
        return os.getpgid(pid) == pid
    except ProcessLookupError:
        return False


def tail(path: Path, lines: int = 25) -> str:
    """The last ``lines`` lines of a log file, or a note that it is missing."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - 64 * 1024))
            text = handle.read().decode(errors="replace")
    except OSError:
        return f"({path} does not exist)"
    return "\n".join(text.splitlines()[-lines:])
