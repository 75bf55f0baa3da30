"""Helpers for tests that start a stack of their own (a cluster, a secure broker) beside the suite's."""

from __future__ import annotations

import socket


def free_port_block(size: int, start: int = 39600, stop: int = 40000) -> int:
    """A base port whose next `size` loopback ports are all free now."""
    for base in range(start, stop, size):
        try:
            for port in range(base, base + size):
                with socket.socket() as probe:
                    probe.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
    raise RuntimeError(f"no block of {size} free loopback ports in {start}-{stop - 1}")
