"""Tokens trained per second by the asynchronous closed loop against a synchronous one.

Both sides are `infra.loop.run_loop` on one broker with the same tasks (addition mod 5, groups of
8, B = `--wave` groups a version), seed, learner and `rollstream serve`. Ours: `max_lag` k
(default 2), waves up to k versions ahead, generation overlapping training. Baseline:
`LoopOptions(synchronous=True)`: B groups generated on version v, the learner samples once all
are in the table, trains on them alone (buffer max_lag 0; the same steps per version) and
publishes v+1; the next wave goes out as soon as the server serves v+1. Made fast: the learner's gate polls the table every 50 ms, the
driver every 0.25 s on both sides. Each side runs in a fresh loop, alternating, over `--rounds`.

Window, both sides: first task started (outcome log; the worker's share-group join, a few
seconds of start-up, excluded) -> version `--versions` published (MLflow timestamps);
tokens = the learner's `tokens` summed over the steps before that publication. Rounds alternate
the order (bench/rounds.py); `ratio` = median over rounds of async/sync tokens/s, with the spread
(`ratio_min`, `ratio_max`, `ratios`) and the load average before and after. `trainer_idle_ratio` (the asynchronous side's; `sync_trainer_idle_ratio` the baseline's): the learner's `sample_wait_s` (blocked
for rows; plus the baseline's `sync_wait_s`) over the window; `generator_idle_ratio`: the share of
the window with no task in flight at the worker (task outcome log, started -> done). CPU seconds
per token: this process and its children (server, processor), start-up included.

Needs a broker: ROLLSTREAM_KAFKA__BOOTSTRAP_SERVERS, or one on free loopback ports started here.

    python bench/loop.py [--json] [--rounds 3] [--versions 4] [--max-lag 2] [--wave 64] [--concurrency 8]
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import uuid

import psutil
from local_broker import broker
from rounds import Sample, alternate, emit, load_average, summary

from infra.loop import LoopOptions, loop_settings, run_loop
from infra.settings import Settings


def cpu_seconds() -> float:
    """CPU seconds of this process and all its children (live and reaped)."""
    me = psutil.Process()
    times = me.cpu_times()
    total = times.user + times.system + times.children_user + times.children_system
    for child in me.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            t = child.cpu_times()
            total += t.user + t.system
    return total


def busy_intervals(settings: Settings) -> list[tuple[float, float]]:
    """(started, done) seconds of every task, from the run's task outcome log."""
    from confluent_kafka import Consumer, TopicPartition

    from producers.tasks.outcomes import Outcome

    topic = settings.task_outcomes_topic
    consumer = Consumer(
        {
            "bootstrap.servers": settings.bootstrap_servers,
            "group.id": f"bench-loop-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    try:
        partitions = consumer.list_topics(topic, timeout=30).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        open_ends, started, spans = set(partitions), {}, []
        while open_ends:
            message = consumer.poll(5.0)
            if message is None:
                break
            if message.error():
                open_ends.discard(message.partition())
                continue
            outcome = Outcome.decode(message.value() or b"")
            key = (outcome.task_id, outcome.attempt)
            if outcome.event == "started":
                started[key] = outcome.time_ms / 1000
            elif outcome.event in ("done", "released", "dead") and key in started:
                spans.append((started.pop(key), outcome.time_ms / 1000))
        return spans
    finally:
        consumer.close()


def covered(spans: list[tuple[float, float]], start: float, end: float) -> float:
    """Seconds of [start, end] covered by the union of `spans`."""
    total, reach = 0.0, start
    for a, b in sorted(spans):
        a, b = max(a, reach), min(b, end)
        if b > a:
            total += b - a
            reach = b
    return total


def one_side(settings: Settings, options: LoopOptions, versions: int, label: str) -> Sample:
    """One loop run; its tokens/s over first submission -> `versions` published, and idle shares."""
    import mlflow

    run = f"bench-{label}-{uuid.uuid4().hex[:6]}"

    def progress(message: str) -> None:
        print(f"[{label}] {message}", file=sys.stderr)

    cpu0 = cpu_seconds()
    outcome = run_loop(settings, options, progress=progress, run=run)
    cpu = cpu_seconds() - cpu0
    client = mlflow.MlflowClient(settings.tracking_uri)
    published = [
        m for m in client.get_metric_history(outcome.run_id, "policy_version") if m.value >= versions
    ]
    spans = busy_intervals(loop_settings(settings, run))
    if not published or not spans:
        raise SystemExit(
            f"{label}: the loop did not publish version {versions} (summary {outcome.as_dict()})"
        )
    last_step = min(m.step for m in published)
    end = min(m.timestamp for m in published if m.step == last_step) / 1000
    # A step's metrics are logged under its index (0-based), `policy_version` under the step count.
    tokens = sum(m.value for m in client.get_metric_history(outcome.run_id, "tokens") if m.step < last_step)
    waits = sum(
        m.value
        for name in ("sample_wait_s", "sync_wait_s")  # the synchronous gate's wait, after publishing
        for m in client.get_metric_history(outcome.run_id, name)
        if 0 < m.step < last_step
    )
    start = min(a for a, _ in spans)  # the first task started (the worker's share-group join excluded)
    window = end - start
    # The first step's wait began before the window: count the part after `start`.
    first = {
        name: next(m for m in client.get_metric_history(outcome.run_id, name) if m.step == 0)
        for name in ("sample_wait_s", "tokens", "tokens_per_s")
    }
    first_train_s = first["tokens"].value / first["tokens_per_s"].value
    in_window = first["sample_wait_s"].timestamp / 1000 - first_train_s - start
    waits += min(max(in_window, 0.0), first["sample_wait_s"].value)
    return Sample(
        items=tokens,
        seconds=window,
        cpu_s=cpu,
        extra={
            "trainer_idle_ratio": round(waits / window, 3),
            "generator_idle_ratio": round(1 - covered(spans, start, end) / window, 3),
            "steps": float(last_step),
            "max_staleness_trained": float(outcome.max_staleness_trained),
            "reward_last": outcome.rewards[-1].mean if outcome.rewards else 0.0,
        },
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of both sides")
    parser.add_argument(
        "--versions", type=int, default=4, help="each run ends once this version is published"
    )
    parser.add_argument("--max-lag", type=int, default=2, help="the asynchronous side's max_lag")
    parser.add_argument("--wave", type=int, default=64, help="tasks (groups) per wave, B")
    parser.add_argument("--concurrency", type=int, default=8, help="groups generated at once, both sides")
    parser.add_argument("--json", action="store_true", help="end with one JSON object")
    args = parser.parse_args()
    common = {
        "versions": args.versions,
        "time_limit_s": 240.0,
        "wave": args.wave,
        "concurrency": args.concurrency,
        "seed": 0,
    }
    ours_options = LoopOptions(max_lag=args.max_lag, **common)
    sync_options = LoopOptions(max_lag=1, synchronous=True, **common)
    load_before = load_average()
    with broker("bench-loop-") as settings:
        samples = alternate(
            ("async", lambda _i: one_side(settings, ours_options, args.versions, "async")),
            [("sync", lambda _i: one_side(settings, sync_options, args.versions, "sync"))],
            args.rounds,
        )
    result = {
        "bench": "loop",
        **summary(samples, "async", load_before, unit="tokens"),
        "versions": args.versions,
        "max_lag": args.max_lag,
        "wave_groups": args.wave,
        "concurrency": args.concurrency,
    }
    result["trainer_idle_ratio"] = result["async_trainer_idle_ratio"]
    result["generator_idle_ratio"] = result["async_generator_idle_ratio"]
    emit(result, args.json)


if __name__ == "__main__":
    main()
