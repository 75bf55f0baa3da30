"""The learner's Prometheus metrics (``rollstream_learner_*``, listed in docs/operations.md).

The training loop reports each step (`LearnerMetrics.trained`); the replay buffer's figures
(depth, rows admitted and dropped, samples per insert, the staleness limit) are read from it at
each scrape (`BufferCollector`), so the buffer keeps no metric objects of its own.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from consumers.replay import ReplayBuffer
from schemas.metrics import COUNT_BUCKETS, NAMESPACE, counter, gauge, histogram, new_registry

SUBSYSTEM = "learner"
STALENESS_BUCKETS = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256)
"""Learner versions a sampled row lags behind (``le="0"``: on-policy)."""


class LearnerMetrics:
    """Steps, step time, rows and tokens trained, the staleness of every sampled row, and the buffer."""

    def __init__(self) -> None:
        self.registry = r = new_registry()
        self.steps = counter(r, SUBSYSTEM, "steps", "Optimizer steps taken")
        self.step_seconds = histogram(r, SUBSYSTEM, "step_seconds", "Time of one optimizer step")
        self.rows = counter(r, SUBSYSTEM, "rows_trained", "Rows trained on (a row drawn twice counts twice)")
        self.tokens = counter(
            r, SUBSYSTEM, "tokens_trained", "Tokens trained on; rate() of it is tokens per second"
        )
        self.batch_rows = histogram(r, SUBSYSTEM, "batch_rows", "Rows per batch", buckets=COUNT_BUCKETS)
        self.staleness = histogram(
            r,
            SUBSYSTEM,
            "staleness_versions",
            "Learner version minus the row's policy version, for every sampled row",
            buckets=STALENESS_BUCKETS,
        )
        self.version = gauge(r, SUBSYSTEM, "version", "The learner's policy version")
        self.buffer: ReplayBuffer | None = None

    def watch(self, buffer: ReplayBuffer) -> None:
        """Report `buffer`'s figures at each scrape."""
        self.buffer = buffer
        self.registry.register(BufferCollector(buffer))

    def trained(self, lag: Sequence[int], tokens: int, seconds: float, version: int) -> None:
        """One step: the staleness of each of its rows, its tokens, its time, the version after it."""
        self.steps.inc()
        self.step_seconds.observe(seconds)
        self.rows.inc(len(lag))
        self.tokens.inc(tokens)
        self.batch_rows.observe(len(lag))
        for versions in lag:
            self.staleness.observe(versions)
        self.version.set(version)


class BufferCollector(Collector):
    """A replay buffer's depth, admissions, drops and sampling ratio, read when scraped."""

    def __init__(self, buffer: ReplayBuffer) -> None:
        self.buffer = buffer

    def collect(self) -> Iterator[Metric]:
        stats = self.buffer.stats()
        dropped = dict(self.buffer.dropped_rows)
        prefix = f"{NAMESPACE}_{SUBSYSTEM}"
        yield GaugeMetricFamily(
            f"{prefix}_buffer_rows", "Rows held by the replay buffer", stats["buffer_rows"]
        )
        yield GaugeMetricFamily(
            f"{prefix}_buffer_tokens", "Prompt + response tokens held", stats["buffer_tokens"]
        )
        yield CounterMetricFamily(
            f"{prefix}_rows_admitted", "Rows inserted into the buffer", stats["inserts"]
        )
        yield CounterMetricFamily(f"{prefix}_rows_sampled", "Rows handed out in batches", stats["samples"])
        family = CounterMetricFamily(
            f"{prefix}_rows_dropped",
            "Rows dropped, by reason: stale (no row of their file may be drawn any more: past max_lag "
            "or used up), evicted (over capacity)",
            labels=["reason"],
        )
        for reason, rows in sorted(dropped.items()):
            family.add_metric([reason], rows)
        yield family
        yield GaugeMetricFamily(
            f"{prefix}_samples_per_insert",
            "Rows sampled per row inserted so far",
            stats["samples"] / stats["inserts"] if stats["inserts"] else 0.0,
        )
        limit = self.buffer.config.max_lag
        if limit is not None:
            yield GaugeMetricFamily(
                f"{prefix}_max_staleness_versions", "The buffer's staleness limit (max_lag)", limit
            )
