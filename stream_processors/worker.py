"""Run the stream stage as a Faust worker until SIGTERM or SIGINT; `rollstream process` calls it."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import faust

from stream_processors.app import create_app


def run_worker(
    *,
    bootstrap_servers: str,
    lake_dir: Path | str,
    raw_topic: str = "rollouts.raw",
    ultra_topic: str | None = "rollouts.ultra",
    dlq_topic: str = "rollouts.dlq",
    app_id: str = "rollstream-processor",
    group_id: str | None = None,
    batch_size: int = 500,
    ultra_batch_size: int = 4,
    batch_within_s: float = 1.0,
    raw_partitions: int | None = None,
    storage_options: Mapping[str, str] | None = None,
    write_retries: int = 5,
    data_dir: Path | str | None = None,
    loglevel: str = "info",
) -> None:
    """Consume `raw_topic` and `ultra_topic` into the lake until a signal stops the worker.

    SIGTERM and SIGINT stop it cleanly: the in-flight batch is written and acked first. Returns
    normally after a clean stop; raises SystemExit with a non-zero code if the worker crashed,
    including at startup when the lake holds offsets ahead of a topic (preflight.py). See
    `create_app` for the arguments.
    """
    app = create_app(
        bootstrap_servers=bootstrap_servers,
        lake_dir=lake_dir,
        raw_topic=raw_topic,
        ultra_topic=ultra_topic,
        dlq_topic=dlq_topic,
        app_id=app_id,
        group_id=group_id,
        batch_size=batch_size,
        ultra_batch_size=ultra_batch_size,
        batch_within_s=batch_within_s,
        raw_partitions=raw_partitions,
        storage_options=storage_options,
        write_retries=write_retries,
        data_dir=data_dir,
    )
    worker = faust.Worker(app, loglevel=loglevel, quiet=True, redirect_stdouts=False)
    try:
        worker.execute_from_commandline()
    except SystemExit as exc:
        if exc.code not in (None, 0):
            raise
