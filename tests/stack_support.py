"""Helpers for tests that start a stack of their own (a cluster, a secure broker) beside the suite's."""

from __future__ import annotations

import os
import socket


def free_port_block(size: int, start: int = 39600, stop: int = 40000) -> int:
    """A base port whose next `size` loopback ports are all free now.

    Under pytest-xdist each test worker searches its own share of [start, stop), so two workers
    never pick the same block between the check and their broker's bind.
    """
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    index = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))
    share = (stop - start) // workers
    start, stop = start + index * share, start + (index + 1) * share
    for base in range(start, stop - size + 1, size):
        try:
            for port in range(base, base + size):
                with socket.socket() as probe:
                    probe.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
    raise RuntimeError(f"no block of {size} free loopback ports in {start}-{stop - 1}")
