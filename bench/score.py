"""Scoring code: sandboxed verdicts per second against the same program run bare, in the same run.

Ours: the fleet's code trajectories (seed 7) judged by `CodeTestsVerifier` on a `SandboxPool`
of `--concurrency` slots: bubblewrap, a pids cgroup, the rlimits and, for a root worker, a host
id of its own per execution. Baseline: the same program with no isolation, the floor of
executing it at all: the same prepared tests (`prepare_tests`, done inside the window as ours
does) and the same harness, run by a plain ``python -S -B`` subprocess from a temporary
directory, `--concurrency` at a time from a thread pool, its report read the same way. Both
judge every trajectory; their rewards must agree. ratio = our verdicts per second / the
baseline's; the sides alternate over `--rounds` rounds (bench/rounds.py). CPU per verdict is
the bench's whole process tree, read from a cgroup of its own (bwrap's pid 1 does not pass its
children's CPU time up to wait4); without one, only what wait4 sees.

Also measured: the start-up of ``Sandbox.run(python -S -c pass)`` against
``subprocess.run([python, -S, -c, pass])``, p50 and p99 over `--starts` alternated runs, and the
stage's scoring path for code tasks (`BatchProcessor.process`: decode, validate, the sandboxed
verdicts, rows) in trajectories per second.

    python bench/score.py [--trajectories 120] [--concurrency 2] [--rounds 3] [--starts 60] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rounds import Sample, alternate, emit, load_average, summary

from producers import SyntheticFleet
from schemas import TrajectoryCodec
from stream_processors.offsets import Coordinates
from stream_processors.processing import BatchProcessor, SourceMessage
from stream_processors.sandbox import Limits, Sandbox, SandboxPool
from stream_processors.verifiers import CodeTestsVerifier, DomainVerifiers
from stream_processors.verifiers.code_tests import parse_report
from stream_processors.verifiers.harness import HARNESS_SOURCE, prepare_tests

_CPUACCT = Path("/sys/fs/cgroup/cpuacct")


class CpuMeter:
    """CPU seconds of this process and everything it starts: a cpuacct cgroup (v1) it moves into,
    else its own v2 cgroup's cpu.stat when it is alone there, else `os.times` (children it waited for)."""

    def __init__(self) -> None:
        self.source = "os.times"
        self._read: Callable[[], float] = self._times
        self._made: Path | None = None
        with contextlib.suppress(OSError):
            if (_CPUACCT / "cgroup.procs").exists():
                path = _CPUACCT / f"rollstream-bench-score-{os.getpid()}"
                path.mkdir()
                self._made = path
                (path / "cgroup.procs").write_text(str(os.getpid()))
                self._read = lambda: int((path / "cpuacct.usage").read_text()) / 1e9
                self.source = "cpuacct cgroup"
                return
        with contextlib.suppress(OSError, ValueError, IndexError):
            own = Path("/proc/self/cgroup").read_text().splitlines()
            v2 = next(line[3:] for line in own if line.startswith("0::"))
            path = Path("/sys/fs/cgroup") / v2.lstrip("/")
            if (path / "cgroup.procs").read_text().split() == [str(os.getpid())]:
                stat = path / "cpu.stat"
                self._read = lambda: int(stat.read_text().split()[1]) / 1e6
                self.source = "cgroup v2 cpu.stat"

    @staticmethod
    def _times() -> float:
        t = os.times()
        return t.user + t.system + t.children_user + t.children_system

    def seconds(self) -> float:
        return self._read()

    def close(self) -> None:
        """Leave the cgroup made for the bench and remove it."""
        if self._made is not None:
            with contextlib.suppress(OSError):
                (_CPUACCT / "cgroup.procs").write_text(str(os.getpid()))
                self._made.rmdir()


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _reward(report: Mapping[str, Any] | None) -> float:
    if report is None:
        return 0.0
    counts = [float(report.get(k, 0)) for k in ("passed", "failed", "errored")]
    return counts[0] / sum(counts) if sum(counts) else 0.0


def bare_verdict(python: str, record: Mapping[str, Any]) -> float:
    """The baseline's judgement: the harness over the same files, in a temporary directory, no isolation."""
    tests, names = prepare_tests(record["unit_tests"])
    work = tempfile.mkdtemp(prefix="rollstream-bench-bare-")
    try:
        files = {
            "solution.py": record.get("response_text") or "",
            "tests.py": tests,
            "tests.names": "\n".join(names),
            "harness.py": HARNESS_SOURCE.replace("/task/", work + "/"),
        }
        for name, content in files.items():
            Path(work, name).write_text(content)
        nonce = secrets.token_hex(16)
        done = subprocess.run(
            [python, "-S", "-B", f"{work}/harness.py"],
            input=(nonce + "\n").encode(),
            capture_output=True,
            cwd=work,
            timeout=60,
        )
        return _reward(parse_report(done.stdout.decode(errors="replace"), nonce))
    finally:
        shutil.rmtree(work, ignore_errors=True)


@contextlib.contextmanager
def _threads(size: int) -> Iterator[ThreadPoolExecutor]:
    executor = ThreadPoolExecutor(max_workers=size)
    try:
        yield executor
    finally:
        executor.shutdown(wait=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--trajectories", type=int, default=120, help="code trajectories judged per side and round"
    )
    parser.add_argument("--concurrency", type=int, default=2, help="verdicts at once on both sides")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--starts", type=int, default=60, help="start-up samples per kind")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    load_before = load_average()
    fleet = SyntheticFleet(seed=7).trajectories(args.trajectories * 6)
    records = [r for r in fleet if r["task_type"] == "code"][: args.trajectories]
    meter = CpuMeter()
    rewards: dict[str, list[float]] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="rollstream-bench-score-") as work:
            sandbox = Sandbox(work, limits=Limits())
            sandbox.check()
            verifier = CodeTestsVerifier(sandbox, limits=sandbox.limits)
            pool = SandboxPool(args.concurrency)

            def measure(name: str, judge: Callable[[], list[float]]) -> Sample:
                cpu0, wall0 = meter.seconds(), time.perf_counter()
                got = judge()
                sample = Sample(len(got), time.perf_counter() - wall0, meter.seconds() - cpu0)
                rewards.setdefault(name, got)
                return sample

            def sandboxed(_: int) -> Sample:
                return measure("sandboxed", lambda: [v.reward for v in pool.map(verifier.verify, records)])

            def unsandboxed(_: int) -> Sample:
                with _threads(args.concurrency) as executor:
                    return measure(
                        "unsandboxed",
                        lambda: list(executor.map(lambda r: bare_verdict(sandbox.python, r), records)),
                    )

            samples = alternate(
                ("sandboxed", sandboxed), [("unsandboxed_python_S", unsandboxed)], args.rounds
            )
            pool.close()
            disagree = sum(a != b for a, b in zip(rewards["sandboxed"], rewards["unsandboxed"], strict=True))

            bare: list[float] = []
            boxed: list[float] = []
            for _ in range(args.starts):
                t = time.perf_counter()
                subprocess.run([sandbox.python, "-S", "-c", "pass"], check=True)
                bare.append((time.perf_counter() - t) * 1000)
                t = time.perf_counter()
                sandbox.run(["python3", "-S", "-c", "pass"])
                boxed.append((time.perf_counter() - t) * 1000)

            codec = TrajectoryCodec()
            messages = [
                SourceMessage(Coordinates("t", 0, i), None, codec.encode(r)) for i, r in enumerate(records)
            ]
            processor = BatchProcessor(verifiers=DomainVerifiers(sandbox=sandbox), pool_size=args.concurrency)
            cpu0, wall0 = meter.seconds(), time.perf_counter()
            out = processor.process(messages)
            stage_s, stage_cpu = time.perf_counter() - wall0, meter.seconds() - cpu0
    finally:
        meter.close()

    result = summary(samples, "sandboxed", load_before, unit="verdicts")
    result.update(
        {
            "verdicts": len(records),
            "concurrency": args.concurrency,
            "reward_disagreements": disagree,
            "passed": sum(r == 1.0 for r in rewards["sandboxed"]),
            "cpu_source": meter.source,
            "sandbox_start_p50_ms": round(statistics.median(boxed), 1),
            "sandbox_start_p99_ms": round(_percentile(boxed, 0.99), 1),
            "bare_start_p50_ms": round(statistics.median(bare), 1),
            "bare_start_p99_ms": round(_percentile(bare, 0.99), 1),
            "stage_code_trajectories_per_s": round(len(out.rows) / stage_s, 1),
            "stage_code_cpu_s_per_trajectory": round(stage_cpu / max(1, len(out.rows)), 5),
            "stage_dead_letters": len(out.dead_letters),
        }
    )

    def human(r: Mapping[str, Any]) -> str:
        return (
            f"{r['verdicts']} code verdicts at concurrency {r['concurrency']}, {r['rounds']} rounds: sandboxed "
            f"{r['sandboxed_per_s']}/s ({r['sandboxed_cpu_s_per_item'] * 1000:.1f} ms CPU each), unsandboxed "
            f"python -S {r['unsandboxed_python_S_per_s']}/s ({r['unsandboxed_python_S_cpu_s_per_item'] * 1000:.1f} ms); "
            f"ratio {r['ratio']} ({r['ratio_min']}-{r['ratio_max']}); start p50/p99: sandbox "
            f"{r['sandbox_start_p50_ms']}/{r['sandbox_start_p99_ms']} ms, bare {r['bare_start_p50_ms']}/"
            f"{r['bare_start_p99_ms']} ms; stage scoring path {r['stage_code_trajectories_per_s']} code "
            f"trajectories/s; load {r['load_before']} -> {r['load_after']}"
        )

    emit(result, args.json, human)
    if disagree:
        raise SystemExit(f"{disagree} rewards differ between the sandboxed and the bare runs")


if __name__ == "__main__":
    main()
