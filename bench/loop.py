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
tokens = the learner's `tokens` summed over the steps before that publication. `ratio` = median
over rounds of async/sync tokens/s. `trainer_idle_ratio`: the learner's `sample_wait_s` (blocked
for rows; plus the baseline's `sync_wait_s`) over the window; `generator_idle_ratio`: the share of
the window with no task in flight at the worker (task outcome log, started -> done). CPU seconds
per token: this process and its children (server, processor), start-up included.

Needs a broker: ROLLSTREAM_BOOTSTRAP_SERVERS, or one on free loopback ports started here.

    python bench/loop.py [--json] [--rounds 3] [--versions 4] [--max-lag 2] [--wave 64] [--concurrency 8]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import uuid
from typing import Any

import psutil
from local_broker import broker

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
            outcome = Outcome.decode(message.value())
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


def one_side(settings: Settings, options: LoopOptions, versions: int, label: str) -> dict[str, Any]:
    """One loop run; its tokens/s over first submission -> `versions` published, and idle shares."""
    import mlflow

    run = f"bench-{label}-{uuid.uuid4().hex[:6]}"

    def progress(message: str) -> None:
        print(f"[{label}] {message}", file=sys.stderr)

    cpu0 = cpu_seconds()
    summary = run_loop(settings, options, progress=progress, run=run)
    cpu = cpu_seconds() - cpu0
    client = mlflow.MlflowClient(settings.tracking_uri)
    published = [
        m for m in client.get_metric_history(summary.run_id, "policy_version") if m.value >= versions
    ]
    spans = busy_intervals(loop_settings(settings, run))
    if not published or not spans:
        raise SystemExit(
            f"{label}: the loop did not publish version {versions} (summary {summary.as_dict()})"
        )
    last_step = min(m.step for m in published)
    end = min(m.timestamp for m in published if m.step == last_step) / 1000
    # A step's metrics are logged under its index (0-based), `policy_version` under the step count.
    tokens = sum(m.value for m in client.get_metric_history(summary.run_id, "tokens") if m.step < last_step)
    waits = sum(
        m.value
        for name in ("sample_wait_s", "sync_wait_s")  # the synchronous gate's wait, after publishing
        for m in client.get_metric_history(summary.run_id, name)
        if 0 < m.step < last_step
    )
    start = min(a for a, _ in spans)  # the first task started (the worker's share-group join excluded)
    window = end - start
    # The first step's wait began before the window: count the part after `start`.
    first = {
        name: next(m for m in client.get_metric_history(summary.run_id, name) if m.step == 0)
        for name in ("sample_wait_s", "tokens", "tokens_per_s")
    }
    first_train_s = first["tokens"].value / first["tokens_per_s"].value
    in_window = first["sample_wait_s"].timestamp / 1000 - first_train_s - start
    waits += min(max(in_window, 0.0), first["sample_wait_s"].value)
    return {
        "tokens_per_s": tokens / window,
        "tokens": tokens,
        "steps": last_step,
        "window_s": round(window, 2),
        "trainer_idle_ratio": round(waits / window, 3),
        "generator_idle_ratio": round(1 - covered(spans, start, end) / window, 3),
        "cpu_s_per_token": cpu / max(tokens, 1),
        "reward_last": summary.rewards[-1].mean if summary.rewards else None,
        "max_staleness_trained": summary.max_staleness_trained,
    }


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
    ours_options = LoopOptions(max_lag=args.max_lag, **common)  # type: ignore[arg-type]
    sync_options = LoopOptions(max_lag=1, synchronous=True, **common)  # type: ignore[arg-type]
    load_before = os.getloadavg()
    rounds: list[dict[str, Any]] = []
    with broker("bench-loop-") as settings:
        for i in range(args.rounds):
            order = [("async", ours_options), ("sync", sync_options)]
            if i % 2:
                order.reverse()
            result = {label: one_side(settings, options, args.versions, label) for label, options in order}
            result["ratio"] = result["async"]["tokens_per_s"] / result["sync"]["tokens_per_s"]
            rounds.append(result)
            print(
                f"round {i + 1}: async {result['async']['tokens_per_s']:.0f} tokens/s, "
                f"sync {result['sync']['tokens_per_s']:.0f} tokens/s, ratio {result['ratio']:.3f}",
                file=sys.stderr,
            )
    ratios = [r["ratio"] for r in rounds]

    def median(side: str, key: str) -> float:
        return round(statistics.median(r[side][key] for r in rounds), 4)

    out = {
        "bench": "loop",
        "ratio": round(statistics.median(ratios), 3),
        "ratio_min": round(min(ratios), 3),
        "ratio_max": round(max(ratios), 3),
        "rounds": len(rounds),
        "versions": args.versions,
        "max_lag": args.max_lag,
        "wave_groups": args.wave,
        "concurrency": args.concurrency,
        "async_tokens_per_s": median("async", "tokens_per_s"),
        "sync_tokens_per_s": median("sync", "tokens_per_s"),
        "trainer_idle_ratio": median("async", "trainer_idle_ratio"),
        "generator_idle_ratio": median("async", "generator_idle_ratio"),
        "sync_trainer_idle_ratio": median("sync", "trainer_idle_ratio"),
        "sync_generator_idle_ratio": median("sync", "generator_idle_ratio"),
        "async_cpu_s_per_token": median("async", "cpu_s_per_token"),
        "sync_cpu_s_per_token": median("sync", "cpu_s_per_token"),
        "per_round": [
            {"ratio": round(r["ratio"], 3), **{side: r[side] for side in ("async", "sync")}} for r in rounds
        ],
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
    }
    if args.json:
        print(json.dumps(out))
    else:
        print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
