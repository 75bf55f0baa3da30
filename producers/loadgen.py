"""A load generator: several worker processes publish a synthetic fleet at a target rate.

Each worker is a process with its own fleet (seed + worker index), publisher and share of the
rate; ultra-long samples go to the ultra topic, a configurable share of messages is malformed on
purpose (published raw, unvalidated). The parent shows the achieved rate and collects each
worker's report: what was acknowledged, what failed (by id), and an order-free digest of the
acknowledged trajectory ids so a reader of the topic can check that each arrived exactly once.
"""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import queue
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from multiprocessing.sharedctypes import Synchronized
from pathlib import Path
from typing import Any

import numpy as np

from producers.exceptions import FleetConfigError, ProducerError, PublishError
from producers.lanes import Lane
from producers.malformed import malformed_messages
from schemas.defaults import TopicDefaults

REPORT_EVERY = 200
DIGEST_MASK = (1 << 64) - 1


def id_digest(ids: Iterable[str]) -> int:
    """An order-free 64-bit digest of trajectory ids (sum of their BLAKE2 hashes, mod 2^64)."""
    total = 0
    for tid in ids:
        total += int.from_bytes(hashlib.blake2b(tid.encode(), digest_size=8).digest(), "little")
    return total & DIGEST_MASK


@dataclass(frozen=True)
class LoadSpec:
    """What to generate and where to send it.

    Attributes:
        bootstrap_servers: the Kafka brokers.
        topic: where trajectories (and the malformed messages) go.
        ultra_topic: where ultra-long trajectories go.
        trajectories: messages in all, malformed ones included, split over the workers.
        workers: worker processes.
        rate: target messages per second over all workers; None publishes as fast as possible.
        seed: the fleet seed; worker i uses seed * 1000 + i.
        num_domains: the fleet's domain catalog size.
        group_sizes: (smallest, largest) samples per prompt group.
        ultra_share: chance that a sample is ultra-long (600k-1M tokens).
        malformed_share: chance that a message is malformed (see producers.malformed).
        profile_path: the inference workload profile lengths are drawn from; None the shipped one.
        lane: the publishers' lane.
        max_in_flight_bytes: each worker's publisher budget.
        extra_config: librdkafka settings for every publisher (security: SASL, TLS).
    """

    bootstrap_servers: str
    topic: str = TopicDefaults.raw
    ultra_topic: str = TopicDefaults.ultra
    trajectories: int = 10_000
    workers: int = 4
    rate: float | None = None
    seed: int = 0
    num_domains: int = 300
    group_sizes: tuple[int, int] = (8, 16)
    ultra_share: float = 0.0
    malformed_share: float = 0.0
    profile_path: Path | None = None
    lane: str = Lane.THROUGHPUT.value
    max_in_flight_bytes: int = 64 * 1024 * 1024
    extra_config: Mapping[str, Any] = field(default_factory=dict)

    def check(self) -> None:
        """Raise FleetConfigError on an impossible value, naming it."""
        if self.trajectories < 1:
            raise FleetConfigError(f"trajectories must be at least 1, got {self.trajectories}")
        if self.workers < 1:
            raise FleetConfigError(f"workers must be at least 1, got {self.workers}")
        if self.rate is not None and self.rate <= 0:
            raise FleetConfigError(f"rate must be positive (messages per second) or None, got {self.rate}")
        for name in ("ultra_share", "malformed_share"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise FleetConfigError(f"{name} must lie in [0, 1], got {getattr(self, name)}")
        Lane(self.lane)


@dataclass
class WorkerReport:
    """One worker's outcome."""

    worker: int
    acked: int = 0
    failed: int = 0
    malformed: int = 0
    ultra: int = 0
    payload_bytes: int = 0
    seconds: float = 0.0
    trajectory_digest: int = 0
    trajectories_acked: int = 0
    failed_ids: list[str] = field(default_factory=list)
    error: str = ""


@dataclass
class LoadReport:
    """Every worker's outcome, summed."""

    workers: list[WorkerReport]
    seconds: float

    @property
    def acked(self) -> int:
        """Messages the broker acknowledged."""
        return sum(w.acked for w in self.workers)

    @property
    def failed(self) -> int:
        """Messages that failed delivery (each named in a worker's failed_ids)."""
        return sum(w.failed for w in self.workers)

    @property
    def rate(self) -> float:
        """Acknowledged messages per second, over the whole run."""
        return self.acked / self.seconds if self.seconds else 0.0

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready summary (what `rollstream produce` prints)."""
        return {
            "acked": self.acked,
            "failed": self.failed,
            "malformed": sum(w.malformed for w in self.workers),
            "ultra": sum(w.ultra for w in self.workers),
            "trajectories_acked": sum(w.trajectories_acked for w in self.workers),
            "trajectory_digest": sum(w.trajectory_digest for w in self.workers) & DIGEST_MASK,
            "seconds": round(self.seconds, 2),
            "messages_per_s": round(self.rate, 1),
            "mb_per_s": round(sum(w.payload_bytes for w in self.workers) / 1e6 / self.seconds, 2)
            if self.seconds
            else 0.0,
            "failed_ids": [i for w in self.workers for i in w.failed_ids][:100],
            "errors": [w.error for w in self.workers if w.error],
        }


def _share(total: int, workers: int, index: int) -> int:
    return total // workers + (1 if index < total % workers else 0)


def _work(spec: LoadSpec, index: int, sent: Synchronized, results: mp.Queue) -> None:
    """One worker process: publish its share, pace it, report."""
    from producers.fleet import SyntheticFleet
    from producers.publisher import Publisher
    from schemas.profile import load_profile

    report = WorkerReport(worker=index)
    count = _share(spec.trajectories, spec.workers, index)
    rng = np.random.default_rng([spec.seed, index, 0x10AD])
    fleet = SyntheticFleet(
        spec.seed * 1000 + index,
        num_domains=spec.num_domains,
        profile=load_profile(spec.profile_path),
        group_sizes=spec.group_sizes,
        ultra_share=spec.ultra_share,
        worker_count=64,
    )
    malformed = int(rng.binomial(count, spec.malformed_share)) if spec.malformed_share else 0
    bad = iter(malformed_messages(spec.seed * 1000 + index, malformed))
    bad_slots = set(rng.choice(count, size=malformed, replace=False).tolist()) if malformed else set()
    records = fleet.trajectories(count - malformed)
    acked_ids: list[str] = []
    per_s = spec.rate / spec.workers if spec.rate else None
    start = time.monotonic()

    def delivered(result: Any) -> None:  # on either of two threads: appends only (atomic)
        if result.ok:
            if not result.message_id.startswith("malformed-"):
                acked_ids.append(result.message_id)
        else:
            report.failed_ids.append(result.message_id)

    publisher: Publisher | None = None
    try:
        with Publisher(
            bootstrap_servers=spec.bootstrap_servers,
            topic=spec.topic,
            ultra_topic=spec.ultra_topic,
            lane=spec.lane,
            max_in_flight_bytes=spec.max_in_flight_bytes,
            known_domains={d.name for d in fleet.domains},
            extra_config=spec.extra_config,
        ) as publisher:
            for i in range(count):
                if per_s is not None and (ahead := start + i / per_s - time.monotonic()) > 0:
                    time.sleep(ahead)
                if i in bad_slots:
                    key, value, kind = next(bad)
                    publisher.publish_raw(
                        value, key, message_id=f"malformed-{index}-{i}-{kind}", on_delivery=delivered
                    )
                    report.malformed += 1
                    report.payload_bytes += len(value)
                else:
                    record = next(records)
                    publisher.publish(record, on_delivery=delivered)
                    report.payload_bytes += len(record["response_tokens"]) * 2 + len(record["prompt_tokens"])
                    if len(record["response_tokens"]) > 2_000_000:
                        report.ultra += 1
                if i % REPORT_EVERY == REPORT_EVERY - 1:
                    with sent.get_lock():
                        sent.value += REPORT_EVERY
    except PublishError as exc:
        report.error = str(exc)
    except ProducerError as exc:
        report.error = f"{type(exc).__name__}: {exc}"
    if publisher is not None:
        report.acked, report.failed = publisher.published, publisher.failed
    with sent.get_lock():
        sent.value += count % REPORT_EVERY
    report.seconds = time.monotonic() - start
    report.trajectories_acked = len(acked_ids)
    report.trajectory_digest = id_digest(acked_ids)
    results.put(asdict(report))


Progress = Callable[[int, int, float], None]
"""Called about 5 times a second with (messages queued so far, total, seconds elapsed)."""


def run_load(spec: LoadSpec, progress: Progress | None = None) -> LoadReport:
    """Run `spec.workers` processes to completion; returns their reports.

    Raises:
        FleetConfigError: the spec is impossible.
        ProducerError: a worker process died without reporting.
    """
    spec.check()
    context = mp.get_context("spawn")  # deltalake and polars do not survive fork (HAZARDS.md)
    sent = context.Value("q", 0)
    results = context.Queue()
    start = time.monotonic()
    processes = [
        context.Process(target=_work, args=(spec, i, sent, results), name=f"rollstream-load-{i}", daemon=True)
        for i in range(spec.workers)
    ]
    for process in processes:
        process.start()
    reports: list[WorkerReport] = []
    while len(reports) < spec.workers:
        try:
            raw = results.get(timeout=0.2)
            reports.append(WorkerReport(**raw))
        except queue.Empty:
            dead = [p for p in processes if p.exitcode not in (None, 0)]
            if dead:
                for process in processes:
                    if process.is_alive():
                        process.terminate()
                raise ProducerError(
                    f"load worker {dead[0].name} exited with code {dead[0].exitcode} before reporting; "
                    "run with --workers 1 to see its traceback"
                ) from None
        if progress is not None:
            progress(int(sent.value), spec.trajectories, time.monotonic() - start)
    for process in processes:
        process.join(timeout=30)
    if progress is not None:
        progress(spec.trajectories, spec.trajectories, time.monotonic() - start)
    return LoadReport(sorted(reports, key=lambda r: r.worker), time.monotonic() - start)
