"""Scraping a process's Prometheus ``/metrics`` in tests, directly or through `rollstream status`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[1]

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(url: str) -> Samples:
    """Every sample of ``GET url`` by (name, labels)."""
    response = httpx.get(url, timeout=30)
    response.raise_for_status()
    return parse(response.text)


def parse(text: str) -> Samples:
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[sample.name, frozenset(sample.labels.items())] = sample.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    """One sample's value; 0.0 when the series does not exist (a counter never incremented)."""
    return samples.get((name, frozenset(labels.items())), 0.0)


def total(samples: Samples, name: str) -> float:
    """The sum of every series of `name`, whatever their labels."""
    return sum(v for (n, _), v in samples.items() if n == name)


def status_metrics(state_dir: Path) -> list[dict[str, Any]]:
    """The ``metrics`` entries of ``rollstream status --json`` for `state_dir` (no broker needed there)."""
    done = subprocess.run(
        [sys.executable, "-m", "infra.cli", "status", "--json"],
        env={**os.environ, "ROLLSTREAM_STATE_DIR": str(state_dir), "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode in (0, 3), done.stderr  # 3: no broker runs in that state directory
    return json.loads(done.stdout.splitlines()[-1])["metrics"]
