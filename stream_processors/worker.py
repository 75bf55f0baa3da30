"""Run the stream stage as a Faust worker until SIGTERM or SIGINT (`rollstream process`).

Also runnable directly: ``python -m stream_processors --lake-dir DIR [options]``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
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


def main(argv: Sequence[str] | None = None) -> None:
    """Command-line entry: parse options and call `run_worker`."""
    parser = argparse.ArgumentParser(prog="python -m stream_processors", description=__doc__)
    parser.add_argument("--bootstrap-servers", default="127.0.0.1:9092")
    parser.add_argument("--lake-dir", required=True)
    parser.add_argument("--raw-topic", default="rollouts.raw")
    parser.add_argument(
        "--ultra-topic", default="rollouts.ultra", help="topic of ultra-long trajectories; '' for none"
    )
    parser.add_argument("--dlq-topic", default="rollouts.dlq")
    parser.add_argument("--app-id", default="rollstream-processor")
    parser.add_argument("--group-id", default=None, help="Kafka consumer group (default: the app id)")
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument("--ultra-batch-size", type=int, default=4)
    parser.add_argument("--batch-within-s", type=float, default=1.0)
    parser.add_argument("--raw-partitions", type=int, default=None)
    parser.add_argument("--storage-options", type=json.loads, default=None, help="JSON object for deltalake")
    parser.add_argument(
        "--write-retries", type=int, default=5, help="retries of a failing write before stopping"
    )
    parser.add_argument("--loglevel", default="info")
    args = parser.parse_args(argv)
    run_worker(
        bootstrap_servers=args.bootstrap_servers,
        lake_dir=args.lake_dir,
        raw_topic=args.raw_topic,
        ultra_topic=args.ultra_topic or None,
        dlq_topic=args.dlq_topic,
        app_id=args.app_id,
        group_id=args.group_id,
        batch_size=args.batch_size,
        ultra_batch_size=args.ultra_batch_size,
        batch_within_s=args.batch_within_s,
        raw_partitions=args.raw_partitions,
        storage_options=args.storage_options,
        write_retries=args.write_retries,
        loglevel=args.loglevel,
    )
