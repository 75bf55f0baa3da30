"""Scraping a process's Prometheus ``/metrics`` in tests."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

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
