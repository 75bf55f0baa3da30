"""A rollout worker's Prometheus metrics (``rollstream_rollout_*``, listed in docs/operations.md)."""

from __future__ import annotations

from schemas.metrics import counter, gauge, histogram, new_registry

SUBSYSTEM = "rollout"


class RolloutMetrics:
    """Tasks in flight, generation latency, settled tasks by outcome, retries, dead letters.

    The worker calls these from its event loop; the series are thread-safe for the scrape thread.
    """

    def __init__(self) -> None:
        self.registry = r = new_registry()
        self.in_flight = gauge(r, SUBSYSTEM, "tasks_in_flight", "Tasks taken and not yet settled")
        self.generate_seconds = histogram(
            r, SUBSYSTEM, "generate_seconds", "Time to generate one task's group (environment turns included)"
        )
        self.tasks = counter(
            r,
            SUBSYSTEM,
            "tasks",
            "Tasks settled, by outcome: done, released (for a retry), dead, requeued, unsettled",
            ["outcome"],
        )
        self.retries = counter(r, SUBSYSTEM, "retries", "Tasks taken on a second or later attempt")
        self.dead_letters = counter(
            r, SUBSYSTEM, "dead_letters", "Tasks dead-lettered, by reason (the error type)", ["reason"]
        )
        self.samples = counter(r, SUBSYSTEM, "samples", "Samples published and acknowledged by Kafka")

    def taken(self, attempt: int) -> None:
        """A task was taken on `attempt` (1 on the first delivery)."""
        self.in_flight.inc()
        if attempt > 1:
            self.retries.inc()

    def generated(self, seconds: float) -> None:
        self.generate_seconds.observe(seconds)

    def published(self, samples: int) -> None:
        self.samples.inc(samples)

    def settled(self, outcome: str, reason: str | None = None) -> None:
        """A task left the worker with `outcome`; a dead one names its `reason`."""
        self.in_flight.dec()
        self.tasks.labels(outcome).inc()
        if outcome == "dead":
            self.dead_letters.labels(reason or "unknown").inc()
