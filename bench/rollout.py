"""Tasks to trajectories in Delta through `rollstream serve`, against the server driven directly.

One `rollstream serve` (the loop's small transformer and 7-token tokenizer, random weights)
serves both sides. Ours: tasks submitted to the tasks topic (share group), rollout workers in
this process (`--queues one`, the default: one worker on one task queue of `--concurrency`
slots, as `rollstream rollout` runs; `--queues per-slot`: the loop's `_Rollout`, `--concurrency`
workers on single-slot queues; no staleness limit as no learner publishes) generating through `HttpBackend`, samples to
rollouts.raw, `rollstream process` (math verifier, advantages) into Delta. Baseline: the server's own rate, the floor of
generating the groups at all: `HttpBackend.generate` (one keep-alive client) on the same prompts,
group size, max_tokens and temperature, as many in flight as ours, nothing else on the path.
Sides alternate over `--rounds` on fresh task ids; start-up (server, worker, processor and their
rebalances) is excluded on both by a warm-up wave and warm-up requests.

Windows: ours from the submission of a round's tasks to its last group visible in the table
(polled every 50 ms), the baseline from its first request to its last response. `ratio` = median
over rounds of ours / baseline samples per second (bench/rounds.py: per-round ratios, spread,
load average). `pipeline_p99_latency_s`: per task, submission to its complete group visible.
`pipeline_cpu_s_per_item` outside the server: this process (submitter, worker, table polling)
plus `rollstream process`; the server's own beside it. `pipeline_slot_<phase>_share`: the worker
slots' share of the window in generate, publish (to Kafka's acknowledgement), settle and take;
`pipeline_<phase>_s_per_task` the same in seconds per task.

Needs a broker: ROLLSTREAM_KAFKA__BOOTSTRAP_SERVERS, or one on free loopback ports started here.

    python bench/rollout.py [--json] [--rounds 3] [--tasks 96] [--group-size 8] [--max-tokens 16]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
import uuid
from typing import Any

import numpy as np
import polars as pl
import psutil
from local_broker import broker
from rounds import Sample, alternate, emit, load_average, summary

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


PHASES = ("generate_s", "publish_s", "settle_s", "take_s", "idle_s")
"""RolloutStats' per-phase seconds, summed over the workers."""


def phases(rollout: _Rollout) -> dict[str, float]:
    """Seconds the rollout workers spent in each phase so far."""
    return {name: float(sum(getattr(w.stats, name, 0.0) for w in rollout.workers)) for name in PHASES}


class OneQueueRollout(_Rollout):
    """The loop's rollout thread, but one worker on one queue of `concurrency` slots, as
    `rollstream rollout --concurrency N` runs (the loop runs N workers on single-slot queues)."""

    async def _main(self) -> None:
        from producers.aio import AsyncPublisher
        from producers.rollout import RolloutOptions, RolloutWorker
        from producers.tasks import TaskQueue, TaskTopics

        s = self.settings
        topics = TaskTopics.named(
            s.tasks_topic, dead_letters=s.task_dlq_topic, outcomes=s.task_outcomes_topic
        )
        queue = TaskQueue(
            bootstrap_servers=s.bootstrap_servers,
            topics=topics,
            group=s.task_group,
            worker_id="bench-rollout",
            slots=self.options.concurrency,
            max_attempts=s.task_max_attempts,
            low_every=s.task_low_every,
            extra_config=s.kafka_client,
        )
        backend = HttpBackend(self.url)
        publisher = AsyncPublisher(
            bootstrap_servers=s.bootstrap_servers,
            topic=s.raw_topic,
            ultra_topic=s.ultra_topic,
            extra_config=dict(s.kafka_client),
        )
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        options = RolloutOptions(worker_id="bench-rollout", concurrency=self.options.concurrency)
        self.workers = [RolloutWorker(queue, backend, publisher, options, tokenizer=self.tokenizer)]
        self._ready.set()
        try:
            await self.workers[0].run(self._stop)
        finally:
            await publisher.close()
            await backend.close()
            queue.close()


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
        kind = OneQueueRollout if self.args.queues == "one" else _Rollout
        self.rollout = kind(self.settings, options, self.url, self.tokenizer)
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

    def pipeline(self, tag: str, count: int, timeout_s: float = 300.0) -> Sample:
        """Submit `count` tasks; wait until every group is in the table."""
        assert self.server is not None and self.processor is not None and self.rollout is not None
        tasks = self.tasks(tag, count)
        me = psutil.Process()
        cpu0 = (cpu_of(me), cpu_of(self.processor), cpu_of(self.server))
        phases0 = phases(self.rollout)
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
        spent = {name: value - phases0[name] for name, value in phases(self.rollout).items()}
        slot_s = self.args.concurrency * (end - start)
        extra = {
            "p50_latency_s": float(np.percentile(latencies, 50)),
            "p99_latency_s": float(np.percentile(latencies, 99)),
            "server_cpu_s_per_trajectory": (server - cpu0[2]) / samples,
            # the worker slots' share of the window in each phase, and per task in seconds
            **{f"slot_{name[:-2]}_share": value / slot_s for name, value in spent.items()},
            **{f"{name[:-2]}_s_per_task": value / count for name, value in spent.items()},
        }
        return Sample(samples, end - start, mine - cpu0[0] + processor - cpu0[1], extra)

    def direct(self, count: int) -> Sample:
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
        extra = {"server_cpu_s_per_trajectory": (cpu_of(self.server) - cpu0[1]) / samples}
        return Sample(samples, end - start, cpu_of(me) - cpu0[0], extra)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of both sides")
    parser.add_argument("--tasks", type=int, default=96, help="tasks (groups) per side per round")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=8, help="groups in flight, both sides")
    parser.add_argument(
        "--queues",
        choices=("one", "per-slot"),
        default="one",
        help="one queue of --concurrency slots (rollstream rollout), or one single-slot queue per slot (the loop)",
    )
    parser.add_argument("--json", action="store_true", help="end with one JSON object")
    args = parser.parse_args()
    load_before = load_average()
    with broker("bench-rollout-") as base:
        bench = Bench(loop_settings(base, f"bench-rollout-{uuid.uuid4().hex[:6]}"), args)
        try:
            bench.start()
            bench.pipeline("warmup", max(8, args.concurrency))
            bench.direct(args.concurrency)
            samples = alternate(
                ("pipeline", lambda i: bench.pipeline(f"r{i}", args.tasks)),
                [("direct", lambda i: bench.direct(args.tasks))],
                args.rounds,
            )
        finally:
            bench.stop()
    result = {
        "bench": "rollout",
        **summary(samples, "pipeline", load_before, unit="trajectories"),
        "tasks_per_round": args.tasks,
        "group_size": args.group_size,
        "max_tokens": args.max_tokens,
        "concurrency": args.concurrency,
        "queues": args.queues,
    }
    emit(result, args.json)


if __name__ == "__main__":
    main()
