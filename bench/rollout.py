"""Tasks to trajectories in Delta through `rollstream serve`, against the server driven directly.

One `rollstream serve` (the loop's small transformer and 7-token tokenizer, random weights)
serves both sides. Ours: tasks submitted to the tasks topic (share group), rollout workers in
this process (the loop's `_Rollout`: `--concurrency` workers on single-slot task queues, no
staleness limit as no learner publishes) generating through `HttpBackend`, samples to
rollouts.raw, `rollstream process` (math verifier, advantages) into Delta. Baseline: the server's own rate, the floor of
generating the groups at all: `HttpBackend.generate` (one keep-alive client) on the same prompts,
group size, max_tokens and temperature, as many in flight as ours, nothing else on the path.
Sides alternate over `--rounds` on fresh task ids; start-up (server, worker, processor and their
rebalances) is excluded on both by a warm-up wave and warm-up requests.

Windows: ours from the submission of a round's tasks to its last group visible in the table
(polled every 50 ms), the baseline from its first request to its last response. `ratio` = median
over rounds of ours / baseline samples per second. `p99_latency_s`: per task, submission to its
complete group visible. `cpu_s_per_trajectory` outside the server: this process (submitter,
worker, table polling) plus `rollstream process`; the server's own beside it.
`worker_generate_share`: the worker slots' share of the window spent inside `generate`.

Needs a broker: ROLLSTREAM_BOOTSTRAP_SERVERS, or one on free loopback ports started here.

    python bench/rollout.py [--json] [--rounds 3] [--tasks 96] [--group-size 8] [--max-tokens 16]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
import uuid
from typing import Any

import numpy as np
import polars as pl
import psutil
from local_broker import broker

from infra.loop import (
    LOOP_DOMAIN,
    POLICY,
    LoopOptions,
    _Children,
    _listening_url,
    _Rollout,
    loop_settings,
    loop_tokenizer,
    prompts,
)
from infra.settings import Settings
from producers.backends import HttpBackend, SamplingParams


def cpu_of(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


def generating(rollout: _Rollout) -> float:
    """Seconds the rollout workers spent in `generate` so far (stats keep a total or one per group)."""
    spent = [w.stats.generate_s for w in rollout.workers]
    return float(sum(sum(x) if isinstance(x, list) else x for x in spent))


class Bench:
    """The shared server, worker and processor, and one measurement of each side."""

    def __init__(self, settings: Settings, args: argparse.Namespace) -> None:
        self.settings, self.args = settings, args
        self.tokenizer = loop_tokenizer()
        self.pairs = prompts()
        self.children = _Children(settings)
        self.rollout: _Rollout | None = None
        self.submitter: Any = None
        self.server: psutil.Process | None = None
        self.processor: psutil.Process | None = None
        self.url = ""

    def start(self) -> None:
        from infra import services
        from producers.tasks import TaskSubmitter, TaskTopics

        services.up(self.settings, progress=lambda m: print(f"[bench] {m}", file=sys.stderr))
        token_file = self.settings.state_dir / "mod5-tokenizer.json"
        self.tokenizer.save(token_file)
        serve = self.children.start(
            "serve", ["serve", "--policy", POLICY, "--tokenizer", str(token_file), "--port", "0"]
        )
        self.url = _listening_url(serve, self.children)
        processor = self.children.start("process", ["process", "--group-wall-timeout", "30"])
        self.server, self.processor = psutil.Process(serve.pid), psutil.Process(processor.pid)
        # No learner publishes here, so no staleness limit: the worker's default (max_lag None).
        options = LoopOptions(concurrency=self.args.concurrency, max_lag=None)  # type: ignore[arg-type]
        self.rollout = _Rollout(self.settings, options, self.url, self.tokenizer)
        self.rollout.start()
        s = self.settings
        topics = TaskTopics.named(
            s.tasks_topic, dead_letters=s.task_dlq_topic, outcomes=s.task_outcomes_topic
        )
        self.submitter = TaskSubmitter(
            bootstrap_servers=s.bootstrap_servers,
            topics=topics,
            lock_ms=s.task_lock_ms,
            default_deadline_ms=min(s.task_deadline_ms, s.task_lock_ms),
            extra_config=s.kafka_client,
        )

    def stop(self) -> None:
        if self.submitter is not None:
            self.submitter.close()
        if self.rollout is not None:
            self.rollout.stop()
        self.children.stop()

    def tasks(self, tag: str, count: int) -> list[dict[str, Any]]:
        from schemas import pack_int32

        return [
            {
                "task_id": f"{tag}-{i:05d}",
                "domain": LOOP_DOMAIN,
                "task_type": "math",
                "prompt_tokens": pack_int32(self.tokenizer.encode(self.pairs[i % len(self.pairs)][0])),
                "expected_answer": self.pairs[i % len(self.pairs)][1],
                "group_size": self.args.group_size,
                "max_tokens": self.args.max_tokens,
                "temperature": 1.0,
                "priority": 1,
            }
            for i in range(count)
        ]

    def params(self) -> SamplingParams:
        return SamplingParams(temperature=1.0, max_tokens=self.args.max_tokens, n=self.args.group_size)

    def visible_groups(self, tag: str) -> dict[str, int]:
        """Rows in the table per task id of this round."""
        table = self.settings.lake_table_uri("trajectories")
        if not os.path.exists(os.path.join(table, "_delta_log")):
            return {}
        frame = pl.read_delta(
            table, columns=["task_id"], storage_options=self.settings.delta_storage_options()
        )
        counts = frame.filter(pl.col("task_id").str.starts_with(f"{tag}-")).group_by("task_id").len()
        return dict(zip(counts["task_id"].to_list(), counts["len"].to_list(), strict=True))

    def pipeline(self, tag: str, count: int, timeout_s: float = 300.0) -> dict[str, Any]:
        """Submit `count` tasks; wait until every group is in the table."""
        assert self.server is not None and self.processor is not None and self.rollout is not None
        tasks = self.tasks(tag, count)
        me = psutil.Process()
        cpu0 = (cpu_of(me), cpu_of(self.processor), cpu_of(self.server))
        generating0 = generating(self.rollout)
        start = time.time()
        report = self.submitter.submit(tasks)
        if report.refused:
            raise SystemExit(f"tasks refused: {report.refused[0].reason}")
        seen: dict[str, float] = {}
        deadline = time.monotonic() + timeout_s
        while len(seen) < count:
            self.children.check()
            self.rollout.check()
            now = time.time()
            for task_id, rows in self.visible_groups(tag).items():
                if rows >= self.args.group_size and task_id not in seen:
                    seen[task_id] = now
            if time.monotonic() > deadline:
                raise SystemExit(f"{tag}: {len(seen)} of {count} groups visible after {timeout_s:.0f} s")
            time.sleep(0.05)
        end = max(seen.values())
        mine, processor, server = (cpu_of(me), cpu_of(self.processor), cpu_of(self.server))
        samples = count * self.args.group_size
        latencies = [t - start for t in seen.values()]
        return {
            "samples_per_s": samples / (end - start),
            "groups_per_s": count / (end - start),
            "seconds": round(end - start, 3),
            "p50_latency_s": round(float(np.percentile(latencies, 50)), 3),
            "p99_latency_s": round(float(np.percentile(latencies, 99)), 3),
            # the worker's slots' share of the window spent in backend.generate
            "worker_generate_share": round(
                (generating(self.rollout) - generating0) / (self.args.concurrency * (end - start)),
                3,
            ),
            "cpu_s_per_trajectory": (mine - cpu0[0] + processor - cpu0[1]) / samples,
            "server_cpu_s_per_trajectory": (server - cpu0[2]) / samples,
        }

    def direct(self, count: int) -> dict[str, Any]:
        """The same prompts straight to the server, `--concurrency` groups in flight."""
        assert self.server is not None
        prompts_ids = [self.tokenizer.encode(self.pairs[i % len(self.pairs)][0]) for i in range(count)]
        params = self.params()

        async def run() -> tuple[float, float, int]:
            backend = HttpBackend(self.url)
            gate = asyncio.Semaphore(self.args.concurrency)

            async def one(prompt: list[int]) -> int:
                async with gate:
                    return len(await backend.generate(prompt, params))

            try:
                start = time.time()
                made = await asyncio.gather(*(one(p) for p in prompts_ids))
                return start, time.time(), sum(made)
            finally:
                await backend.close()

        me = psutil.Process()
        cpu0 = (cpu_of(me), cpu_of(self.server))
        start, end, samples = asyncio.run(run())
        if samples != count * self.args.group_size:
            raise SystemExit(f"direct: {samples} samples of {count * self.args.group_size}")
        return {
            "samples_per_s": samples / (end - start),
            "groups_per_s": count / (end - start),
            "seconds": round(end - start, 3),
            "cpu_s_per_trajectory": (cpu_of(me) - cpu0[0]) / samples,
            "server_cpu_s_per_trajectory": (cpu_of(self.server) - cpu0[1]) / samples,
        }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of both sides")
    parser.add_argument("--tasks", type=int, default=96, help="tasks (groups) per side per round")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=8, help="groups in flight, both sides")
    parser.add_argument("--json", action="store_true", help="end with one JSON object")
    args = parser.parse_args()
    load_before = os.getloadavg()
    rounds: list[dict[str, Any]] = []
    with broker("bench-rollout-") as base:
        bench = Bench(loop_settings(base, f"bench-rollout-{uuid.uuid4().hex[:6]}"), args)
        try:
            bench.start()
            bench.pipeline("warmup", max(8, args.concurrency))
            bench.direct(args.concurrency)
            for i in range(args.rounds):
                result: dict[str, Any] = {}
                for side in ("pipeline", "direct") if i % 2 == 0 else ("direct", "pipeline"):
                    if side == "pipeline":
                        result[side] = bench.pipeline(f"r{i}", args.tasks)
                    else:
                        result[side] = bench.direct(args.tasks)
                result["ratio"] = result["pipeline"]["samples_per_s"] / result["direct"]["samples_per_s"]
                rounds.append(result)
                print(
                    f"round {i + 1}: pipeline {result['pipeline']['samples_per_s']:.0f} samples/s "
                    f"(p99 {result['pipeline']['p99_latency_s']} s), direct "
                    f"{result['direct']['samples_per_s']:.0f}/s, ratio {result['ratio']:.3f}",
                    file=sys.stderr,
                )
        finally:
            bench.stop()
    ratios = [r["ratio"] for r in rounds]

    def median(side: str, key: str) -> float:
        return round(statistics.median(r[side][key] for r in rounds), 6)

    out = {
        "bench": "rollout",
        "ratio": round(statistics.median(ratios), 3),
        "ratio_min": round(min(ratios), 3),
        "ratio_max": round(max(ratios), 3),
        "rounds": len(rounds),
        "tasks_per_round": args.tasks,
        "group_size": args.group_size,
        "max_tokens": args.max_tokens,
        "concurrency": args.concurrency,
        "pipeline_samples_per_s": median("pipeline", "samples_per_s"),
        "direct_samples_per_s": median("direct", "samples_per_s"),
        "pipeline_groups_per_s": median("pipeline", "groups_per_s"),
        "direct_groups_per_s": median("direct", "groups_per_s"),
        "p99_latency_s": median("pipeline", "p99_latency_s"),
        "p50_latency_s": median("pipeline", "p50_latency_s"),
        "worker_generate_share": median("pipeline", "worker_generate_share"),
        "cpu_s_per_trajectory": median("pipeline", "cpu_s_per_trajectory"),
        "direct_cpu_s_per_trajectory": median("direct", "cpu_s_per_trajectory"),
        "server_cpu_s_per_trajectory": median("pipeline", "server_cpu_s_per_trajectory"),
        "direct_server_cpu_s_per_trajectory": median("direct", "server_cpu_s_per_trajectory"),
        "per_round": [
            {"ratio": round(r["ratio"], 3), "pipeline": r["pipeline"], "direct": r["direct"]} for r in rounds
        ],
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
    }
    print(json.dumps(out) if args.json else json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
