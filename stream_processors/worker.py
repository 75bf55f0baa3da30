"""Run the stream stage as a Faust worker until SIGTERM or SIGINT; `rollstream process` calls it."""

from __future__ import annotations

import gc

import faust

GC_THRESHOLDS = (50_000, 20, 100)
"""Young-generation collections every 50,000 allocations instead of 700: a worker holds tens of
thousands of records in pending groups and its outbox, and the default thresholds spent about
15% of the stage's time in the collector (profiled on bench/process.py's fleet messages)."""


def run_worker(app: faust.App, *, loglevel: str = "info") -> None:
    """Run `app` (from `create_app`) until a signal stops it.

    SIGTERM and SIGINT stop it cleanly: the in-flight batch is written and acked first. Returns
    normally after a clean stop; raises SystemExit with a non-zero code if the worker crashed,
    including at startup when the lake holds offsets ahead of a topic (preflight.py).
    """
    gc.freeze()  # what was imported and built so far is never garbage: keep it out of collections
    gc.set_threshold(*GC_THRESHOLDS)
    worker = faust.Worker(app, loglevel=loglevel, quiet=True, redirect_stdouts=False)
    try:
        worker.execute_from_commandline()
    except SystemExit as exc:
        if exc.code not in (None, 0):
            raise
