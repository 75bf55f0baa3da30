"""The broker a bench measures against: ROLLSTREAM_KAFKA__BOOTSTRAP_SERVERS' one, or its own on loopback
(one node, or a cluster of `brokers` nodes as `rollstream up --brokers N` starts it)."""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from infra.settings import Settings


def free_port() -> int:
    """A port free on 127.0.0.1 now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def free_run(count: int, attempts: int = 50) -> int:
    """The first of `count` consecutive ports free on 127.0.0.1 now."""
    for _ in range(attempts):
        base = free_port()
        if base + count > 65_536:
            continue
        probes = [socket.socket() for _ in range(count - 1)]
        try:
            for offset, probe in enumerate(probes, start=1):
                probe.bind(("127.0.0.1", base + offset))
            return base
        except OSError:
            continue
        finally:
            for probe in probes:
                probe.close()
    raise RuntimeError(f"found no {count} consecutive free ports on 127.0.0.1 in {attempts} tries")


@contextlib.contextmanager
def broker(prefix: str, brokers: int = 1) -> Iterator[Settings]:
    """Settings on ROLLSTREAM_KAFKA__BOOTSTRAP_SERVERS' broker (one node only), or on our own on free
    loopback ports (state in a temporary directory named with `prefix`, stopped on the way out).

    A cluster (`brokers` > 1) is always our own: node i listens on base + 2i, its controller on
    base + 2i + 1 (infra/settings_sections.py's `node_ports`).
    """
    if brokers == 1 and os.environ.get("ROLLSTREAM_KAFKA__BOOTSTRAP_SERVERS"):
        yield Settings.load()
        return
    from infra import services

    with tempfile.TemporaryDirectory(prefix=prefix) as state:
        base = free_run(2 * brokers)
        settings = Settings.load(
            state_dir=Path(state),
            kafka_port=base,
            controller_port=base + 1,
            brokers=brokers,
            bootstrap_servers=",".join(f"127.0.0.1:{base + 2 * i}" for i in range(brokers)),
        )
        services.up(settings, progress=lambda m: print(f"[bench] {m}", file=sys.stderr))
        try:
            yield settings
        finally:
            services.down(settings, progress=lambda m: None)
