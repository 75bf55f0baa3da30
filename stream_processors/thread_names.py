"""OS-level names for the worker's threads and processes.

CPython 3.11 names a thread only for Python, so `top -H`, `ps -L`, py-spy and
/proc/<pid>/task/*/comm show every worker thread as "python". The worker's own threads set their
kernel name (`prctl(PR_SET_NAME)`) as they start: rs-raw-intake and rs-raw-judge (a lane's two
threads, likewise for ultra), rs-sink, rs-commit, rs-sandbox (`named_executor`), and rs-verifier
for the verifier processes. bench/process.py reads them to report CPU per thread. Linux keeps 15 bytes of a name;
elsewhere naming does nothing.
"""

from __future__ import annotations

import ctypes
import sys
from concurrent.futures import ThreadPoolExecutor

NAME_BYTES = 15
"""The longest name Linux keeps (TASK_COMM_LEN is 16, its NUL included)."""
_PR_SET_NAME = 15


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    return libc


_LIBC = _libc()


def name_os_thread(name: str) -> None:
    """Set the calling thread's OS name to `name`, cut to NAME_BYTES bytes.

    Never raises: the name only helps tools, so where the call is missing or refused the thread
    keeps the name it had. A ThreadPoolExecutor initializer, so its threads are named as they start.
    """
    if _LIBC is None:
        return
    _LIBC.prctl(_PR_SET_NAME, name.encode()[:NAME_BYTES], 0, 0, 0)


def named_executor(name: str, max_workers: int = 1) -> ThreadPoolExecutor:
    """A thread pool whose threads are `rollstream-<name>_N` in Python and `rs-<name>` to the OS."""
    return ThreadPoolExecutor(
        max_workers=max_workers,
        thread_name_prefix=f"rollstream-{name}",
        initializer=name_os_thread,
        initargs=(f"rs-{name}",),
    )
