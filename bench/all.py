"""Every bench under bench/, one after another, into docs/benchmarks.md and docs/benchmarks.json.

Each bench runs as `python bench/NAME.py --json [arguments]` in a subprocess of its own (with a
time limit); its last stdout line is its JSON. A bench that fails, times out or prints no JSON is
recorded with its error and the rest still run. The page holds one table (each figure, its
baseline, rounds, spread), the targets (`TARGETS`: each with its measured figure, met or not, and
the page that works out the gap), the commit and the machine; the JSON holds every bench's full
output and the targets, and the last stdout line every bench's ratios and the targets.

Benches that need a broker (process, scale, lanes) use ROLLSTREAM_KAFKA__BOOTSTRAP_SERVERS, or this
script starts one on free loopback ports for the whole run (bench/local_broker.py).
`scale-3-brokers` runs scale.py on a 3-node cluster (replication 3, min.insync 2) that this
script starts for it alone and stops after it. score runs 5 rounds and replay 15 instead of their
3: a round of either lasts about a second, and their per-round ratios spread widely on a shared
machine (replay's 0.68 to 1.63 over 9 rounds at c93170d, its figure against TorchRL 1.65 in one
run and 1.44 in the next). process runs its default 30,000 trajectories over 9 rounds: at 15,000,
ours' window was about 2 s and its rate spread 6,041 to 9,476/s over 3 rounds at dc551f3, and
over 5 rounds at c93170d the ratio still spread from 0.48 to 0.72. The default sizes keep the
whole run within 40 minutes on a 2-core machine (18 minutes here at 309bdfb);
`--quick` is a check that every bench runs, `--args NAME="..."` replaces one bench's arguments.

    python bench/all.py [--quick] [--only process,codec] [--args process="--rounds 2"] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from local_broker import broker
from rounds import commit, load_average

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


@dataclass(frozen=True)
class Bench:
    """A bench script, what its figure compares, and its arguments by default and in `--quick`.

    `ours_key` names our side's figures in its JSON (`<ours_key>_per_s`); `script` is bench/<script>.py
    (default: the name); `brokers` > 1 runs it on a cluster of its own."""

    name: str
    ours: str
    baseline: str
    unit: str
    ours_key: str = "ours"
    default: Sequence[str] = ()
    quick: Sequence[str] = ()
    timeout_s: float = 900.0
    script: str = ""
    brokers: int = 1


BENCHES = (
    Bench("codec", "packed decode", "Avro arrays decode", "decodes", quick=("--repeats", "300")),
    Bench(
        "sink",
        "BatchProcessor + DeltaSink (code tasks precomputed)",
        "write_deltalake",
        "rows",
        default=("--trajectories", "10000"),
        quick=("--trajectories", "2000", "--rounds", "2", "--code-trajectories", "50"),
    ),
    Bench(
        "process",
        "rollstream process",
        "consumer + write_deltalake (serial, threaded)",
        "trajectories",
        default=("--trajectories", "30000", "--rounds", "9", "--backlog", "20000", "--latency-seconds", "15"),
        quick=(
            "--trajectories",
            "5000",
            "--rounds",
            "2",
            "--backlog",
            "5000",
            "--latency-seconds",
            "5",
            "--code-messages",
            "200",
        ),
        timeout_s=1200,
    ),
    Bench(
        "scale",
        "2 workers",
        "1 worker",
        "trajectories",
        default=("--trajectories", "6000"),
        quick=("--trajectories", "3000", "--rounds", "1"),
    ),
    Bench(
        "scale-3-brokers",
        "2 workers",
        "1 worker",
        "trajectories",
        default=("--trajectories", "6000"),
        quick=("--trajectories", "3000", "--rounds", "1"),
        script="scale",
        brokers=3,
    ),
    Bench("lanes", "throughput lane", "latency lane", "MB", quick=("--flat-out", "3000", "--rounds", "2")),
    Bench(
        "score",
        "sandboxed verdicts",
        "unsandboxed python -S",
        "verdicts",
        ours_key="sandboxed",
        default=("--rounds", "5"),
        quick=("--trajectories", "40"),
    ),
    Bench(
        "replay",
        "ReplayBuffer",
        "TorchRL, DataLoader",
        "tokens",
        default=("--rounds", "15"),
        quick=("--rows", "1000"),
    ),
    Bench("publish", "Publisher", "Kafka Java producer", "MB", quick=("--mb", "30", "--repeats", "1")),
    Bench("loop", "the training loop", "its baseline", "tasks", ours_key="async", quick=("--rounds", "1")),
    Bench(
        "rollout",
        "rollout workers",
        "their baseline",
        "tasks",
        ours_key="pipeline",
        quick=("--rounds", "1", "--tasks", "32"),
    ),
)


@dataclass(frozen=True)
class Target:
    """A figure a bench must reach: `result[key] >= bound` (or `<=` when `at_most`), and the page
    where what stands between the figure and its bound is worked out."""

    bench: str
    key: str
    bound: float
    what: str
    why: str
    at_most: bool = False

    def measured(self, results: Mapping[str, Mapping[str, Any]]) -> float | None:
        value = results.get(self.bench, {}).get(self.key)
        return float(value) if isinstance(value, (int, float)) else None

    def met(self, value: float | None) -> bool | None:
        if value is None:
            return None
        return value <= self.bound if self.at_most else value >= self.bound


TARGETS = (
    Target("process", "ratio", 0.8, "stream stage / the better bare consumer", "stream.md#lanes-and-threads"),
    Target(
        "process",
        "p99_latency_s",
        1.0,
        "p99 publish-to-visible at half rate (s)",
        "stream.md#lanes-and-threads",
        at_most=True,
    ),
    Target(
        "process",
        "peak_rss_mb",
        1024,
        "worker peak RSS over the backlog (MiB)",
        "stream.md#lanes-and-threads",
        at_most=True,
    ),
    Target("replay", "ratio_vs_torchrl", 1.5, "replay buffer / TorchRL at its best", "replay.md#benchmark"),
    Target("replay", "padding_waste", 0.05, "padding waste", "replay.md#batches", at_most=True),
    Target(
        "score",
        "ratio",
        0.5,
        "sandboxed / unsandboxed `python -S` verdicts",
        "sandbox.md#what-a-verdict-costs",
    ),
    Target("publish", "ratio_1024", 0.8, "Publisher / Java KafkaProducer, 1 KB", "producers.md#benchmarks"),
    Target("publish", "ratio_8192", 1.0, "Publisher / Java KafkaProducer, 8 KB", "producers.md#benchmarks"),
    Target(
        "publish", "ratio_262144", 1.0, "Publisher / Java KafkaProducer, 256 KB", "producers.md#benchmarks"
    ),
)
"""What the benches must show (medians of one run); an unmet one stays on the page with its figure."""


def _checked(results: Mapping[str, Mapping[str, Any]]) -> list[tuple[Target, float | None, bool | None]]:
    """Each target of a bench that ran, with its measured figure and whether it holds."""
    out = []
    for t in TARGETS:
        if t.bench in results:
            value = t.measured(results)
            out.append((t, value, t.met(value)))
    return out


def targets(results: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The targets of `_checked` as JSON records."""
    return [
        {
            "bench": t.bench,
            "key": t.key,
            "target": f"{'<=' if t.at_most else '>='} {t.bound:g}",
            "measured": value,
            "met": met,
            "why": t.why,
        }
        for t, value, met in _checked(results)
    ]


def run_bench(bench: Bench, arguments: Sequence[str], env: Mapping[str, str]) -> dict[str, Any]:
    """One bench's JSON, or {"error": ...} naming what went wrong; with its wall seconds."""
    command = [sys.executable, str(HERE / f"{bench.script or bench.name}.py"), "--json", *arguments]
    started = time.monotonic()
    try:
        done = subprocess.run(
            command, cwd=REPO, env=dict(env), capture_output=True, text=True, timeout=bench.timeout_s
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {bench.timeout_s:.0f} s", "wall_s": bench.timeout_s}
    wall = round(time.monotonic() - started, 1)
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"exit {done.returncode}: {tail}", "wall_s": wall}
    try:
        result = json.loads(lines[-1])
    except json.JSONDecodeError:
        return {"error": f"last line is not JSON: {lines[-1][:200]}", "wall_s": wall}
    return {**result, "wall_s": wall, "arguments": list(arguments)}


def on_cluster(bench: Bench, arguments: Sequence[str], env: Mapping[str, str]) -> dict[str, Any]:
    """`run_bench` on a cluster of `bench.brokers` nodes started for it (and stopped after)."""
    started = time.monotonic()
    try:
        with broker(f"bench-{bench.name}-", brokers=bench.brokers) as cluster:
            return run_bench(
                bench,
                arguments,
                {
                    **env,
                    "ROLLSTREAM_KAFKA__BOOTSTRAP_SERVERS": cluster.bootstrap_servers,
                    "ROLLSTREAM_STATE_DIR": str(cluster.state_dir),
                    "ROLLSTREAM_KAFKA__PORT": str(cluster.kafka_port),
                    "ROLLSTREAM_KAFKA__CONTROLLER_PORT": str(cluster.controller_port),
                    "ROLLSTREAM_KAFKA__BROKERS": str(bench.brokers),
                },
            )
    except Exception as exc:  # a cluster that did not start is this bench's failure, not the run's
        return {"error": f"cluster of {bench.brokers}: {exc}", "wall_s": round(time.monotonic() - started, 1)}


def machine() -> dict[str, Any]:
    """The machine the figures come from."""
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory_gb = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    return {
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "memory_gib": memory_gb,
        "python": platform.python_version(),
        "system": f"{platform.system()} {platform.release()}",
    }


def _figure(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.3g}" if abs(value) < 100 else f"{value:,.0f}"
    return "" if value is None else str(value)


def _throughputs(result: Mapping[str, Any], ours_key: str) -> tuple[str, str]:
    """Ours' and the best baseline's median throughput, as written by bench/rounds.py."""
    rates = {
        k[: -len("_per_s")]: v
        for k, v in result.items()
        if k.endswith("_per_s") and isinstance(v, (int, float))
    }
    ours = rates.pop(ours_key, None)
    best = result.get("baseline_per_round") or []
    name = max(set(best), key=best.count).replace("-", "_") if best else None
    base = rates.get(name) if name else None
    return _figure(ours), (f"{_figure(base)} ({name})" if base is not None else "")


def _row(label: str, bench: Bench, result: Mapping[str, Any]) -> str:
    spread = ""
    if "ratio_min" in result and "ratio_max" in result:
        spread = f"{_figure(result['ratio_min'])} to {_figure(result['ratio_max'])}"
    ours, base = _throughputs(result, bench.ours_key)
    load = f"{_figure(result.get('load_before'))} / {_figure(result.get('load_after'))}"
    ratio = _figure(result.get("ratio"))
    alone = [
        f"{k[len('ratio_vs_') :]} {_figure(v)}"
        for k, v in result.items()
        if k.startswith("ratio_vs_") and not k.endswith(("_min", "_max"))
    ]
    if alone:
        ratio += f" (against each: {', '.join(alone)})"
    return (
        f"| {label} | {bench.ours} | {bench.baseline} | {ratio} | {spread} "
        f"| {_figure(result.get('rounds', result.get('repeats')))} | {result.get('unit', bench.unit)} | {ours} "
        f"| {base} | {load} |"
    )


def page(results: Mapping[str, Mapping[str, Any]], meta: Mapping[str, Any]) -> str:
    """docs/benchmarks.md: one table and where it was measured."""
    rows = [
        "| bench | ours | baseline | ratio (median) | spread | rounds | unit | ours /s | baseline /s | load before/after |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for bench in BENCHES:
        if bench.name not in results:
            continue
        result = results[bench.name]
        if "error" in result:
            rows.append(
                f"| {bench.name} | {bench.ours} | {bench.baseline} | failed: {result['error']} | | | | | | |"
            )
            continue
        parts = result.get("sizes")
        if isinstance(parts, Mapping) and parts:  # one row per message size (publish)
            for size, part in parts.items():
                rows.append(_row(f"{bench.name} ({size} B)", bench, part))
        else:
            rows.append(_row(bench.name, bench, result))
    goals = [
        "| bench | figure | target | measured | met | worked out in |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for t, value, met in _checked(results):
        verdict = {True: "yes", False: "**no**", None: "not measured"}[met]
        bound = f"{'at most' if t.at_most else 'at least'} {t.bound:g}"
        goals.append(
            f"| {t.bench} | {t.what} | {bound} | {_figure(value)} | {verdict} | [{t.why}]({t.why}) |"
        )
    m = meta["machine"]
    lines = [
        "# Benchmarks",
        "",
        "Written by `python bench/all.py` (do not edit by hand). `ratio` = ours / the better baseline,",
        "the median over alternated rounds (bench/rounds.py); spread is the lowest and highest per-round",
        "ratio. A bench with several baselines also gives the median against each alone. Every figure of",
        "every bench, per round, is in [benchmarks.json](benchmarks.json); each bench's docstring",
        "describes its baseline's set-up.",
        "",
        *rows,
        "",
        "## Targets",
        "",
        "What the project asks of these figures (medians of this run). One that is not met stays here",
        "with its figure; the linked page works out where the time goes and what was tried.",
        "",
        *goals,
        "",
        f"Commit {meta['commit']}, {meta['date']}, mode {meta['mode']}, {meta['wall_s']:.0f} s in all.",
        f"Machine: {m['cpus']} cores ({m['cpu_model']}), {m['memory_gib']} GiB, Python {m['python']},",
        f"{m['system']}; the machine is shared, so the load average is given beside each figure.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small sizes: a check that every bench runs")
    parser.add_argument("--only", default="", help="comma-separated bench names (default: all)")
    parser.add_argument(
        "--args",
        action="append",
        default=[],
        metavar='NAME="ARGS"',
        help="arguments for one bench instead of its defaults (repeatable)",
    )
    parser.add_argument("--out", type=Path, default=REPO / "docs", help="where benchmarks.md/.json go")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    known = {bench.name for bench in BENCHES}
    only = {name for name in args.only.split(",") if name}
    if only - known:
        raise SystemExit(f"unknown bench {sorted(only - known)}; known: {sorted(known)}")
    overrides: dict[str, list[str]] = {}
    for item in args.args:
        name, _, value = item.partition("=")
        if name not in known:
            raise SystemExit(f"--args {item!r}: unknown bench {name!r}; known: {sorted(known)}")
        overrides[name] = shlex.split(value)
    chosen = [bench for bench in BENCHES if not only or bench.name in only]
    started = time.monotonic()
    results: dict[str, dict[str, Any]] = {}
    with broker("bench-all-") as settings:
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
            "ROLLSTREAM_KAFKA__BOOTSTRAP_SERVERS": settings.bootstrap_servers,
            # the broker's own state dir and ports, so a bench that runs `up` (loop, rollout) finds
            # it running instead of starting another on the same port
            "ROLLSTREAM_STATE_DIR": str(settings.state_dir),
            "ROLLSTREAM_KAFKA__PORT": str(settings.kafka_port),
            "ROLLSTREAM_KAFKA__CONTROLLER_PORT": str(settings.controller_port),
        }
        for bench in chosen:
            arguments = overrides.get(bench.name, list(bench.quick if args.quick else bench.default))
            print(f"[all] {bench.name} {' '.join(arguments)}", file=sys.stderr, flush=True)
            if bench.brokers == 1:
                results[bench.name] = run_bench(bench, arguments, env)
            else:
                results[bench.name] = on_cluster(bench, arguments, env)
            outcome = results[bench.name].get("error") or f"ratio {results[bench.name].get('ratio')}"
            print(
                f"[all] {bench.name}: {outcome} ({results[bench.name]['wall_s']} s)",
                file=sys.stderr,
                flush=True,
            )
    meta: dict[str, Any] = {
        "commit": commit(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "mode": "quick" if args.quick else "default",
        "wall_s": time.monotonic() - started,
        "machine": machine(),
        "load_after": load_average(),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "benchmarks.md").write_text(page(results, meta))
    document = {**meta, "benches": results, "targets": targets(results)}
    (args.out / "benchmarks.json").write_text(json.dumps(document, indent=1) + "\n")
    summary = {
        name: {k: v for k, v in r.items() if k in ("rounds", "error") or k.startswith("ratio")}
        for name, r in results.items()
    }
    goals = [{k: v for k, v in t.items() if k != "why"} for t in document["targets"]]
    print(
        json.dumps(
            {
                "commit": meta["commit"],
                "wall_s": round(meta["wall_s"], 1),
                "benches": summary,
                "targets": goals,
            }
        )
    )


if __name__ == "__main__":
    main()
