"""`rollstream process --workers N`: N stream workers of one consumer group, as child processes.

Each child is the same `rollstream process` command with its own ``--worker-index`` (its own Faust
data directory and, with ``--instance-id``, its own static group member id). Kafka splits the
partitions among them; a child that dies leaves its partitions to the others after the session
timeout. SIGTERM and SIGINT are passed on to every child; the supervisor returns once all exited.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Sequence
from types import FrameType


def worker_argv(argv: Sequence[str]) -> list[str]:
    """`argv` of `rollstream process ...` without its ``--workers`` option."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--workers":
            skip = True
        elif not arg.startswith("--workers="):
            out.append(arg)
    return out


def run_workers(argv: Sequence[str], count: int) -> int:
    """Run `count` workers (`argv`: the command line without ``--workers``) until all exit.

    Returns 0 when every worker stopped cleanly, else the first non-zero exit code.
    """
    if count < 1:
        raise ValueError(f"workers must be at least 1, got {count}")
    children = [
        subprocess.Popen([sys.executable, "-m", "infra.cli", *argv, "--worker-index", str(i)])
        for i in range(count)
    ]

    def forward(signum: int, _frame: FrameType | None) -> None:
        for child in children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        codes = [child.wait() for child in children]
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    failed = [c for c in codes if c != 0]
    return failed[0] if failed else 0
