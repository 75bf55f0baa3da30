"""Run the stream stage as a Faust worker until SIGTERM or SIGINT; `rollstream process` calls it."""

from __future__ import annotations

import faust


def run_worker(app: faust.App, *, loglevel: str = "info") -> None:
    """Run `app` (from `create_app`) until a signal stops it.

    SIGTERM and SIGINT stop it cleanly: the in-flight batch is written and acked first. Returns
    normally after a clean stop; raises SystemExit with a non-zero code if the worker crashed,
    including at startup when the lake holds offsets ahead of a topic (preflight.py).
    """
    worker = faust.Worker(app, loglevel=loglevel, quiet=True, redirect_stdouts=False)
    try:
        worker.execute_from_commandline()
    except SystemExit as exc:
        if exc.code not in (None, 0):
            raise
