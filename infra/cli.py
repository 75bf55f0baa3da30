"""The `rollstream` command line: one sub-command per job, each a thin shell over the library.

This module is the edge of the system: it folds the config file, environment and flags into one
`Settings` object and passes plain keyword arguments down to the rooms.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from confluent_kafka import KafkaException

from infra.settings import Settings
from schemas.exceptions import RollstreamError


def _progress(message: str) -> None:
    print(f"[rollstream] {message}", file=sys.stderr, flush=True)


def _settings(args: argparse.Namespace) -> Settings:
    return Settings.load(
        args.config,
        state_dir=args.state_dir,
        kafka_port=args.kafka_port,
        controller_port=args.controller_port,
        mlflow_port=args.mlflow_port,
    )


def _up(args: argparse.Namespace) -> int:
    from infra import services

    status = services.up(_settings(args), mlflow_server=args.mlflow_server, progress=_progress)
    print(status.describe())
    return 0


def _down(args: argparse.Namespace) -> int:
    from infra import services

    stopped = services.down(_settings(args), progress=_progress)
    print("stopped: " + ", ".join(stopped) if stopped else "nothing was running")
    return 0


def _status(args: argparse.Namespace) -> int:
    from infra import services

    status = services.status(_settings(args))
    print(json.dumps(status.as_dict(), default=str) if args.json else status.describe())
    return 0 if status.running else 3


def _produce(args: argparse.Namespace) -> int:
    from infra.demo import publish_synthetic

    settings = _settings(args)
    counts = publish_synthetic(
        settings,
        trajectories=args.trajectories,
        seed=args.seed,
        bad_fraction=args.bad_fraction,
        progress=_progress,
    )
    print(json.dumps(counts))
    return 0


def _process(args: argparse.Namespace) -> int:
    from stream_processors import create_app, run_worker

    settings = _settings(args)
    app = create_app(
        bootstrap_servers=settings.bootstrap_servers,
        lake_dir=settings.lake_dir,
        raw_topic=settings.raw_topic,
        ultra_topic=None if args.no_ultra else settings.ultra_topic,
        dlq_topic=settings.dlq_topic,
        app_id=args.app_id,
        group_id=args.group_id,
        batch_size=args.batch_size,
        batch_within_s=args.batch_within,
        write_retries=args.write_retries,
        data_dir=settings.state_dir / "faust",
    )
    run_worker(app, loglevel=args.loglevel)
    return 0


def _learn(args: argparse.Namespace) -> int:
    import signal
    import threading

    from consumers import learn

    settings = _settings(args)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    steps = args.steps if args.steps is not None else (None if args.follow else 20)
    result = learn(
        table_uri=str(settings.lake_dir / "trajectories"),
        tracking_uri=settings.tracking_uri,
        experiment=args.experiment,
        steps=steps,
        lr=args.lr,
        clip_epsilon=args.clip_epsilon,
        kl_coef=args.kl_coef,
        seed=args.seed,
        checkpoint_path=args.checkpoint,
        checkpoint_every=args.checkpoint_every,
        rows_log=args.rows_log,
        progress=_progress,
        stop=stop,
        follow=args.follow,
        start_version=args.start_version,
        end_version=args.end_version,
        token_budget=args.token_budget,
        max_length=args.max_length,
        vocab_size=args.vocab_size or settings.vocab_size,
        profile_path=settings.profile_path or None,
        profile_matched=not args.no_profile_match,
        max_uses=args.max_uses,
        max_lag=args.max_lag,
        half_life=args.half_life,
        priority_alpha=args.priority_alpha,
        samples_per_insert=args.samples_per_insert,
        min_size=args.min_size,
        capacity_rows=args.capacity_rows,
        capacity_tokens=args.capacity_tokens,
        eviction=args.eviction,
    )
    print(json.dumps(result.as_dict()))
    return 0


def _demo(args: argparse.Namespace) -> int:
    from infra.demo import run_demo

    summary = run_demo(
        _settings(args),
        trajectories=args.trajectories,
        seed=args.seed,
        bad_fraction=args.bad_fraction,
        learn_steps=args.steps,
        timeout_s=args.timeout,
        progress=_progress,
    )
    print(summary.describe())
    if args.json:
        print(json.dumps(summary.as_dict()))
    return 0 if summary.accounted_for else 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rollstream", description=__doc__)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", type=Path, help="settings file (default ./rollstream.toml if present)")
    common.add_argument("--state-dir", type=Path, help="where services keep data, logs and pid files")
    common.add_argument("--kafka-port", type=int, help="the broker's client port on 127.0.0.1")
    common.add_argument("--controller-port", type=int, help="the KRaft controller port on 127.0.0.1")
    common.add_argument(
        "--mlflow-port", type=int, help="the MLflow server's port on 127.0.0.1 (up --mlflow-server)"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(
        name: str, handler: Callable[[argparse.Namespace], int], help_: str
    ) -> argparse.ArgumentParser:
        p = sub.add_parser(name, parents=[common], help=help_, description=help_)
        p.set_defaults(handler=handler)
        return p

    p = command("up", _up, "start the local Kafka broker (and MLflow server) and provision topics")
    p.add_argument("--mlflow-server", action="store_true", help="also start `mlflow server` on 127.0.0.1")
    command("down", _down, "stop what `up` started, by pid")
    p = command("status", _status, "report the local services (exit 3 when the broker is down)")
    p.add_argument("--json", action="store_true", help="print one JSON object")

    p = command("produce", _produce, "publish synthetic trajectories (and some malformed ones) to Kafka")
    p.add_argument("--trajectories", type=int, default=10_000)
    p.add_argument("--seed", type=int, default=None, help="fleet seed (default: a fresh one, printed)")
    p.add_argument("--bad-fraction", type=float, default=0.005, help="share of malformed messages")

    p = command("process", _process, "run the Faust stream processor until stopped (SIGTERM / Ctrl-C)")
    p.add_argument(
        "--app-id", default="rollstream-processor", help="names the offsets stored in Delta; keep it stable"
    )
    p.add_argument("--group-id", default=None, help="Kafka consumer group (default: the app id)")
    p.add_argument(
        "--write-retries", type=int, default=5, help="Delta write attempts before the worker stops"
    )
    p.add_argument("--no-ultra", action="store_true", help="do not consume the ultra-long topic")
    p.add_argument("--batch-size", type=int, default=500)
    p.add_argument("--batch-within", type=float, default=1.0, help="seconds to wait to fill a batch")
    p.add_argument("--loglevel", default="info")

    p = command("learn", _learn, "train on the Delta table through the replay buffer, tracked in MLflow")
    _learn_arguments(p)

    p = command("demo", _demo, "up, publish, process, learn, and print where every trajectory went")
    p.add_argument("--trajectories", type=int, default=10_000)
    p.add_argument("--seed", type=int, default=None, help="fleet seed (default: a fresh one, printed)")
    p.add_argument("--bad-fraction", type=float, default=0.005, help="share of malformed messages")
    p.add_argument("--steps", type=int, default=20, help="learner steps")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds to wait for the processor")
    p.add_argument("--json", action="store_true", help="end with the summary as one JSON object")
    return parser


def _learn_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--steps", type=int, default=None, help="optimizer steps (default 20; with --follow: until stopped)"
    )
    p.add_argument(
        "--follow", action="store_true", help="keep training as the table grows, until SIGTERM / Ctrl-C"
    )
    p.add_argument("--experiment", default="rollstream")
    p.add_argument(
        "--checkpoint",
        type=Path,
        default=None,
        help="one file for weights, optimizer, buffer position; resumed if present",
    )
    p.add_argument("--checkpoint-every", type=int, default=10)
    p.add_argument("--rows-log", type=Path, default=None, help="JSON lines naming each step's rows")
    p.add_argument("--start-version", type=int, default=0, help="first table version read (time travel)")
    p.add_argument(
        "--end-version", type=int, default=None, help="last table version read (default: latest at start)"
    )
    p.add_argument("--token-budget", type=int, default=16_384, help="padded slots per batch")
    p.add_argument("--max-length", type=int, default=2048, help="prompt + response tokens kept per row")
    p.add_argument("--vocab-size", type=int, default=None, help="default: the vocab_size setting (32768)")
    p.add_argument(
        "--no-profile-match", action="store_true", help="do not draw buckets in the profile's shares"
    )
    p.add_argument(
        "--max-uses", type=int, default=None, help="each row at most this many times, oldest first"
    )
    p.add_argument("--max-lag", type=int, default=None, help="hard limit on learner version - policy_version")
    p.add_argument("--half-life", type=float, default=None, help="freshness weight halves per this much lag")
    p.add_argument("--priority-alpha", type=float, default=None, help="prioritized by |advantage| ** alpha")
    p.add_argument(
        "--samples-per-insert", type=float, default=None, help="rate limit: rows sampled per row inserted"
    )
    p.add_argument("--min-size", type=int, default=1, help="rows inserted before the first sample")
    p.add_argument("--capacity-rows", type=int, default=None, help="most rows held (default: no row bound)")
    p.add_argument(
        "--capacity-tokens",
        type=int,
        default=8_000_000,
        help="most prompt + response tokens held (about 8 bytes each)",
    )
    p.add_argument("--eviction", choices=["oldest", "stalest"], default="oldest")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--clip-epsilon", type=float, default=0.2)
    p.add_argument("--kl-coef", type=float, default=0.0, help="KL penalty to the initial policy (0: none)")
    p.add_argument("--seed", type=int, default=0)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `rollstream` console script."""
    args = _parser().parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return handler(args)
    except RollstreamError as exc:
        print(f"rollstream {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KafkaException as exc:
        print(
            f"rollstream {args.command}: error: Kafka: {exc.args[0].str() if exc.args else exc}; "
            "is the broker up? `rollstream status` tells, `rollstream up` starts it",
            file=sys.stderr,
        )
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
