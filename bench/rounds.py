"""Alternated rounds of ours against baselines, and the JSON every bench prints.

A bench measures one `Side` per contender. `alternate` runs them in turn, ``rounds`` times, the
order rotating each round so no side always goes first (a warm page cache or a JIT'd broker
favours whoever runs second). Each measurement is a `Sample`: items done, the window's wall
seconds and the CPU seconds the side spent (its own process and children, or what it reports).
`summary` folds the rounds: per-round ratio ``ours_i / best baseline_i``, the median as ``ratio``,
the spread, each side's median throughput and CPU seconds per item, and the machine's load
average before and after. With several baselines it also gives ``ratio_vs_<baseline>`` (and its
``_min`` / ``_max``): the median of ``ours_i / that baseline_i``.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Sample:
    """One side's measurement in one round.

    Attributes:
        items: things done in the window (messages, rows, verdicts, tokens).
        seconds: the window's wall time.
        cpu_s: CPU seconds spent on the items (0.0 when the side cannot tell).
        extra: other figures of this measurement, in snake_case.
    """

    items: float
    seconds: float
    cpu_s: float = 0.0
    extra: Mapping[str, float] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.items / self.seconds if self.seconds > 0 else 0.0

    @property
    def cpu_per_item(self) -> float:
        return self.cpu_s / self.items if self.items else 0.0


Side = Callable[[int], Sample]
"""A contender: called with the round's index, returns its `Sample`."""


def load_average() -> float:
    """The one-minute load average."""
    return round(os.getloadavg()[0], 2)


def cpu_seconds() -> float:
    """CPU seconds of this process and its waited-for children so far."""
    own = os.times()
    return own.user + own.system + own.children_user + own.children_system


def alternate(
    ours: tuple[str, Side],
    baselines: Sequence[tuple[str, Side]],
    rounds: int,
    progress: Callable[[str], None] | None = None,
) -> dict[str, list[Sample]]:
    """Run every side once per round, rotating the order; returns each side's samples by name."""
    sides = [ours, *baselines]
    out: dict[str, list[Sample]] = {name: [] for name, _ in sides}
    say = progress or (lambda message: print(f"[bench] {message}", file=sys.stderr))
    for index in range(rounds):
        shift = index % len(sides)
        for name, side in sides[shift:] + sides[:shift]:
            sample = side(index)
            out[name].append(sample)
            say(
                f"round {index + 1}/{rounds} {name}: {sample.rate:,.1f}/s ({sample.items:,.0f} in {sample.seconds:.2f} s)"
            )
    return out


def summary(
    samples: Mapping[str, Sequence[Sample]],
    ours: str,
    load_before: float,
    unit: str = "items",
) -> dict[str, Any]:
    """The JSON figures: ``ratio`` is the median over rounds of ours_i / best baseline_i."""
    baselines = [name for name in samples if name != ours]
    rounds = len(samples[ours])
    per_round: list[float] = []
    best_names: list[str] = []
    for index in range(rounds):
        best = max(baselines, key=lambda name: samples[name][index].rate)
        best_names.append(best)
        base = samples[best][index].rate
        per_round.append(samples[ours][index].rate / base if base else 0.0)
    result: dict[str, Any] = {
        "ratio": round(statistics.median(per_round), 3),
        "ratio_min": round(min(per_round), 3),
        "ratio_max": round(max(per_round), 3),
        "rounds": rounds,
        "ratios": [round(value, 3) for value in per_round],
        "baseline_per_round": best_names,
        "unit": unit,
        "load_before": load_before,
        "load_after": load_average(),
    }
    if len(baselines) > 1:  # against each baseline alone too: a target may name one of them
        for name in baselines:
            alone = [
                samples[ours][i].rate / samples[name][i].rate if samples[name][i].rate else 0.0
                for i in range(rounds)
            ]
            key = _key(name)
            result[f"ratio_vs_{key}"] = round(statistics.median(alone), 3)
            result[f"ratio_vs_{key}_min"] = round(min(alone), 3)
            result[f"ratio_vs_{key}_max"] = round(max(alone), 3)
    for name, side in samples.items():
        key = _key(name)
        result[f"{key}_per_s"] = round(statistics.median(s.rate for s in side), 1)
        result[f"{key}_per_s_rounds"] = [round(s.rate, 1) for s in side]
        result[f"{key}_cpu_s_per_item"] = round(statistics.median(s.cpu_per_item for s in side), 7)
        for extra in sorted({k for s in side for k in s.extra}):
            values = [s.extra[extra] for s in side if extra in s.extra]
            result[f"{key}_{extra}"] = round(statistics.median(values), 4)
    return result


def _key(name: str) -> str:
    """A side's name as a JSON key part (snake_case)."""
    return name.replace("-", "_").replace(" ", "_")


def commit() -> str:
    """The checkout's short commit, with ``+dirty`` when the tree has changes."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        )
        dirty = subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def emit(
    result: Mapping[str, Any], as_json: bool, human: Callable[[Mapping[str, Any]], str] | None = None
) -> None:
    """Print the figures: a readable block, then (``--json``) one JSON object on the last line."""
    if not as_json or human is not None:
        text = human(result) if human else "\n".join(f"{key}: {value}" for key, value in result.items())
        print(text, file=sys.stderr if as_json else sys.stdout)
    if as_json:
        print(json.dumps({**result, "commit": commit(), "cpus": os.cpu_count()}))


def timed(action: Callable[[], float]) -> Sample:
    """Run ``action`` (returns items done) on this process's clock and CPU."""
    cpu0, wall0 = cpu_seconds(), time.perf_counter()
    items = action()
    return Sample(items=items, seconds=time.perf_counter() - wall0, cpu_s=cpu_seconds() - cpu0)
