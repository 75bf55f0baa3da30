"""Scoring code in the sandbox: verdicts per second with the pool against one sandbox at a time,
and the sandbox's start cost against a bare `python -c pass` subprocess, in the same run.

Ours: the fleet's code trajectories judged by `CodeTestsVerifier` on a `SandboxPool` of
`--pool` workers. Baseline: the same verifier and trajectories, one at a time. ratio = our
verdicts per second / the baseline's (higher is better). Start cost: `Sandbox.run(python -c pass)`
against `subprocess.run([python, -c, pass])`, p50 and p99 milliseconds over `--starts` runs each.

    python bench/score.py [--trajectories 120] [--pool N] [--starts 60] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time

from producers import SyntheticFleet
from stream_processors.sandbox import Limits, Sandbox, SandboxPool
from stream_processors.sandbox.bwrap import interpreter
from stream_processors.verifiers import CodeTestsVerifier


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trajectories", type=int, default=120, help="code trajectories judged per mode")
    parser.add_argument("--pool", type=int, default=os.cpu_count() or 2, help="concurrent sandboxes")
    parser.add_argument("--starts", type=int, default=60, help="start-cost samples per kind")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    records = [
        r for r in SyntheticFleet(seed=7).trajectories(args.trajectories * 5) if r["task_type"] == "code"
    ]
    records = records[: args.trajectories]
    with tempfile.TemporaryDirectory(prefix="rollstream-bench-score-") as work:
        sandbox = Sandbox(work, limits=Limits())
        sandbox.check()
        verifier = CodeTestsVerifier(sandbox, limits=sandbox.limits)

        start = time.perf_counter()
        serial = [verifier.verify(r) for r in records]
        serial_s = time.perf_counter() - start

        pool = SandboxPool(args.pool)
        start = time.perf_counter()
        pooled = pool.map(verifier.verify, records)
        pooled_s = time.perf_counter() - start
        pool.close()
        assert [v.reward for v in serial] == [v.reward for v in pooled], "pool and serial verdicts differ"

        python, _ = interpreter()
        bare: list[float] = []
        boxed: list[float] = []
        for _ in range(args.starts):
            t = time.perf_counter()
            subprocess.run([python, "-S", "-c", "pass"], check=True)
            bare.append((time.perf_counter() - t) * 1000)
            t = time.perf_counter()
            sandbox.run(["python3", "-S", "-c", "pass"])
            boxed.append((time.perf_counter() - t) * 1000)

    ours = len(records) / pooled_s
    baseline = len(records) / serial_s
    result = {
        "ratio": round(ours / baseline, 3),
        "verdicts": len(records),
        "pool_size": args.pool,
        "pool_verdicts_per_s": round(ours, 2),
        "serial_verdicts_per_s": round(baseline, 2),
        "sandbox_start_p50_ms": round(statistics.median(boxed), 1),
        "sandbox_start_p99_ms": round(_percentile(boxed, 0.99), 1),
        "bare_start_p50_ms": round(statistics.median(bare), 1),
        "bare_start_p99_ms": round(_percentile(bare, 0.99), 1),
        "passed": sum(v.status == "ok" for v in pooled),
        "failed": sum(v.status == "fail" for v in pooled),
        "cpu_count": os.cpu_count(),
    }
    print(
        f"{len(records)} code verdicts: pool of {args.pool} {ours:.1f}/s, one at a time {baseline:.1f}/s "
        f"(ratio {result['ratio']}); start p50/p99: sandbox {result['sandbox_start_p50_ms']}/"
        f"{result['sandbox_start_p99_ms']} ms, bare python {result['bare_start_p50_ms']}/{result['bare_start_p99_ms']} ms"
    )
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
