"""A pids cgroup per execution: the process-count limit that also binds root, and a sure kill.

RLIMIT_NPROC counts per real user: it does not bind uid 0 (a worker that runs the sandbox as
root, ROLLSTREAM_SANDBOX_AS_ROOT=1), and for any other id it counts every execution of that id at
once, not one execution. So the process limit is a cgroup's ``pids.max``. Both cgroup v1 (a
``pids`` hierarchy) and v2 (the unified hierarchy with the pids controller enabled) are
supported. Every process of an execution lives in its cgroup, so killing what it lists leaves
nothing behind.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from stream_processors.sandbox.exceptions import SandboxUnavailableError
from stream_processors.sandbox.launcher_process import destroy_cgroup, read_small

_V1 = Path("/sys/fs/cgroup/pids")
_V2_CANDIDATES = (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified"))


def _own_v2_cgroup(root: Path) -> Path | None:
    """The v2 cgroup this process is in, if its parent delegates the pids controller to children."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        if line.startswith("0::"):
            here = root / line[3:].lstrip("/")
            controllers = here / "cgroup.controllers"
            if controllers.exists() and "pids" in controllers.read_text().split():
                return here
    return None


def pids_root(prefix: str = "rollstream-sandbox") -> Path:
    """The directory under which executions' pids cgroups are made; created if missing.

    Raises:
        SandboxUnavailableError: neither a writable v1 pids hierarchy nor a v2 cgroup with the
            pids controller is available.
    """
    tried: list[str] = []
    if (_V1 / "cgroup.procs").exists():
        root = _V1 / prefix
        try:
            root.mkdir(exist_ok=True)
            return root
        except OSError as exc:
            tried.append(f"{root}: {exc}")
    for base in _V2_CANDIDATES:
        if (base / "cgroup.controllers").exists():
            own = _own_v2_cgroup(base)
            if own is None:
                tried.append(f"{base}: the pids controller is not enabled for this process's cgroup")
                continue
            root = own / prefix
            try:
                root.mkdir(exist_ok=True)
                (root / "cgroup.subtree_control").write_text("+pids")
                return root
            except OSError as exc:
                tried.append(f"{root}: {exc}")
    raise SandboxUnavailableError(
        "no pids cgroup to cap a sandbox's process count ("
        + ("; ".join(tried) or "no cgroup filesystem under /sys/fs/cgroup")
        + "). Give the worker a delegated cgroup with the pids controller (systemd: Delegate=yes), "
        "or mount the v1 pids hierarchy; code tasks do not run without a process limit"
    )


class PidsCgroup:
    """One execution's pids cgroup (the launcher makes it and its child joins it): read, emptied, removed."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._dir = str(path)

    def limit_hits(self) -> int:
        """How often a fork was refused by pids.max."""
        with contextlib.suppress(OSError, ValueError):
            for line in read_small(f"{self._dir}/pids.events").splitlines():
                key, _, value = line.partition(b" ")
                if key == b"max":
                    return int(value)
        return 0

    def pids(self) -> list[int]:
        """The processes still in the cgroup."""
        try:
            return [int(p) for p in read_small(f"{self._dir}/cgroup.procs").split()]
        except OSError:
            return []

    def destroy(self, timeout_s: float = 5.0) -> None:
        """SIGKILL whatever is left, wait for it to go, remove the cgroup (`destroy_cgroup`)."""
        destroy_cgroup(self._dir, timeout_s)
