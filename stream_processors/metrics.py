"""The stream worker's Prometheus metrics (names in docs/operations.md), on its own registry.

Verdicts of the verifier pool's processes are counted here, in the worker, from the verdicts
the pool returns: every verdict comes back to this process, so no multiprocess collection is
needed. Lag is computed at each scrape from the intakes' log-end offsets and the state stored
in Delta (`LagCollector`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from schemas.metrics import BYTES_BUCKETS, COUNT_BUCKETS, NAMESPACE, counter, gauge, histogram, new_registry
from stream_processors.compaction import Compacted
from stream_processors.dead_letters import DeadLetter
from stream_processors.offsets import TopicPartition
from stream_processors.processing import JudgedBatch
from stream_processors.stage import StageObserver

SUBSYSTEM = "stream"


class WorkerMetrics(StageObserver):
    """The worker's counters, histograms and gauges; each `observe`-like method is thread-safe."""

    def __init__(self) -> None:
        self.registry = r = new_registry()
        self.messages = counter(r, SUBSYSTEM, "messages", "Messages consumed, by lane", ["lane"])
        self.rows = counter(r, SUBSYSTEM, "rows", "Rows stored in the trajectories table")
        self.dead_letters = counter(
            r, SUBSYSTEM, "dead_letters", "Dead letters stored, by reason (the error type)", ["reason"]
        )
        self.judge_seconds = histogram(r, SUBSYSTEM, "batch_judge_seconds", "Time to judge a batch", ["lane"])
        self.verdicts = counter(
            r, SUBSYSTEM, "verdicts", "Verdicts, by verifier and status", ["verifier", "status"]
        )
        self.sandbox_runs = counter(
            r, SUBSYSTEM, "sandbox_runs", "Sandbox executions, by outcome", ["outcome"]
        )
        self.sandbox_run_seconds = histogram(
            r, SUBSYSTEM, "sandbox_run_seconds", "Wall time of a sandbox run"
        )
        self.sandbox_start_seconds = histogram(
            r,
            SUBSYSTEM,
            "sandbox_start_seconds",
            "Time from asking the launcher for a sandbox run until bwrap starts its command",
        )
        self.commit_seconds = histogram(
            r, SUBSYSTEM, "commit_seconds", "Time of a trajectories commit, its retries included"
        )
        self.commit_rows = histogram(r, SUBSYSTEM, "commit_rows", "Rows per commit", buckets=COUNT_BUCKETS)
        self.commit_bytes = histogram(
            r, SUBSYSTEM, "commit_message_bytes", "Message bytes per commit", buckets=BYTES_BUCKETS
        )
        self.groups = counter(
            r, SUBSYSTEM, "groups_decided", "Groups decided, by status (timed_out among them)", ["status"]
        )
        self.pending = gauge(r, SUBSYSTEM, "groups_pending", "Groups waiting for samples")
        self.compacted_files = counter(
            r, SUBSYSTEM, "compacted_files", "Small files replaced by compaction, by table", ["table"]
        )
        self.compaction_seconds = histogram(
            r, SUBSYSTEM, "compaction_seconds", "Time of compacting one partition's small files"
        )

    def judged(self, lane: str, batch: JudgedBatch) -> None:
        """A lane judged `batch`: its messages, time, verdicts and sandbox executions."""
        self.messages.labels(lane).inc(len(batch.coordinates))
        self.judge_seconds.labels(lane).observe(batch.seconds)
        # Counted per batch: a labelled increment costs microseconds, on the event loop's thread.
        verdicts = Counter((s.verdict.verifier, s.verdict.status) for s in batch.samples)
        for (verifier, status), count in verdicts.items():
            self.verdicts.labels(verifier, status).inc(count)
        for record in batch.executions:
            self.sandbox_runs.labels(record.execution.outcome).inc()
            self.sandbox_run_seconds.observe(record.execution.wall_s)
            self.sandbox_start_seconds.observe(record.execution.start_s)

    def stored_rows(self, rows: int) -> None:
        """Rows a sink step stored."""
        if rows:
            self.rows.inc(rows)

    def stored_letters(self, letters: Sequence[DeadLetter]) -> None:
        """Dead letters a write stored."""
        for letter in letters:
            self.dead_letters.labels(letter.error_type).inc()

    def committed(self, rows: int, nbytes: int, seconds: float) -> None:
        self.commit_seconds.observe(seconds)
        self.commit_rows.observe(rows)
        self.commit_bytes.observe(nbytes)

    def compacted(self, done: Iterable[Compacted]) -> None:
        """Partitions a compaction run compacted."""
        for c in done:
            self.compacted_files.labels(c.table.rstrip("/").rsplit("/", 1)[-1]).inc(c.files_removed)
            self.compaction_seconds.observe(c.seconds)

    def decided(self, status: str, samples: int) -> None:
        self.groups.labels(status).inc()

    def follow_pending(self, pending: Callable[[], int]) -> None:
        """Read the pending groups at each scrape."""
        self.pending.set_function(pending)

    def follow_lag(self, collector: LagCollector) -> None:
        """Report lag per partition at each scrape."""
        self.registry.register(collector)


class LagCollector(Collector):
    """``rollstream_stream_lag_messages{topic, partition}``: log-end offset minus the next offset
    stored in Delta, per partition assigned to this worker and fetched at least once.

    Args:
        log_ends: per assigned partition, its log-end offset (the intakes' `log_ends`).
        stored_next: a partition's next offset stored in Delta, or None when not loaded.
    """

    def __init__(
        self,
        log_ends: Callable[[], Iterable[tuple[TopicPartition, int]]],
        stored_next: Callable[[TopicPartition], int | None],
    ) -> None:
        self.log_ends = log_ends
        self.stored_next = stored_next

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            f"{NAMESPACE}_{SUBSYSTEM}_lag_messages",
            "Messages of a partition not yet stored in Delta (log-end offset minus the stored next offset)",
            labels=["topic", "partition"],
        )
        for (topic, partition), end in sorted(self.log_ends()):
            stored = self.stored_next((topic, partition))
            if stored is not None:
                family.add_metric([topic, str(partition)], max(0, end - stored))
        yield family
