"""The broker a bench measures against: ROLLSTREAM_KAFKA__BOOTSTRAP_SERVERS' one, or its own on loopback."""

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


@contextlib.contextmanager
def broker(prefix: str) -> Iterator[Settings]:
    """Settings on ROLLSTREAM_KAFKA__BOOTSTRAP_SERVERS' broker, or on our own on free loopback ports
    (state in a temporary directory named with `prefix`, stopped on the way out)."""
    if os.environ.get("ROLLSTREAM_KAFKA__BOOTSTRAP_SERVERS"):
        yield Settings.load()
        return
    from infra import services

    with tempfile.TemporaryDirectory(prefix=prefix) as state:
        settings = Settings.load(state_dir=Path(state), kafka_port=free_port(), controller_port=free_port())
        services.up(settings, progress=lambda m: print(f"[bench] {m}", file=sys.stderr))
        try:
            yield settings
        finally:
            services.down(settings, progress=lambda m: None)
