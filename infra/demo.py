"""The end-to-end demo: a local broker, a lake and a tracking store, and every stage between.

`run_demo` starts the services, publishes a synthetic fleet's trajectories (with a share of
malformed messages), runs the real Faust processor as a child process until every message is
accounted for in Delta or the dead letters, then trains a tiny policy on the table in MLflow.
"""

from __future__ import annotations

import dataclasses
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from infra.accounting import OffsetRanges, Outcome, high_watermarks, outcome, ranges_between
from infra.exceptions import DemoError
from infra.processes import tail, terminate
from infra.progress_bars import Advance
from infra.settings import Settings

Progress = Callable[[str], None]


@dataclass
class DemoSummary:
    """Where every published trajectory went, and where to look next."""

    seed: int
    published: int
    malformed_published: int
    delta_rows: int
    dead_letters: int
    duplicates: int
    table_uri: str
    table_version: int
    dead_letters_uri: str
    tracking_uri: str
    mlflow_run_id: str
    mlflow_experiment_id: str
    final_loss: float
    reward_mean: float
    seconds: dict[str, float] = field(default_factory=dict)
    profile_id: str = ""
    bucket_targets: dict[str, float] = field(default_factory=dict)
    bucket_mix: dict[str, float] = field(default_factory=dict)
    group_statuses: dict[str, int] = field(default_factory=dict)

    @property
    def accounted_for(self) -> bool:
        """Every message published in this run is a Delta row or a dead letter, none twice."""
        return self.delta_rows + self.dead_letters == self.published and self.duplicates == 0

    def as_dict(self) -> dict[str, Any]:
        """The summary as JSON-ready values (what `--json` prints)."""
        return {**dataclasses.asdict(self), "accounted_for": self.accounted_for}

    def describe(self) -> str:
        """The summary for a person: counts, the verdict, and where to look next."""
        verdict = "every trajectory accounted for" if self.accounted_for else "MISMATCH: see counts above"
        rate = self.published / self.seconds["process"] if self.seconds.get("process") else 0.0
        return "\n".join(
            [
                "rollstream demo",
                f"  published        {self.published:>8}  ({self.malformed_published} malformed on purpose)",
                f"  rows in Delta    {self.delta_rows:>8}  {self.table_uri} (version {self.table_version})",
                f"  dead letters     {self.dead_letters:>8}  {self.dead_letters_uri} and the rollouts.dlq topic",
                f"  duplicates       {self.duplicates:>8}  (this run's messages found twice, or its trajectory_ids repeated)",
                f"  => {verdict}",
                f"  processed in {self.seconds.get('process', 0):.1f} s ({rate:.0f} messages/s, the processor's start included); "
                f"learned in {self.seconds.get('learn', 0):.1f} s, final loss {self.final_loss:.4f}, "
                f"reward mean {self.reward_mean:.3f}",
                f"  MLflow run       {self.mlflow_run_id} in {self.tracking_uri}",
                f"  groups           {', '.join(f'{k} {v}' for k, v in sorted(self.group_statuses.items()))}",
                f"  buckets          table mix beside profile {self.profile_id}'s targets:",
                *[
                    f"    {name:<12} {self.bucket_mix.get(name, 0.0):>6.1%}  (target {target:.1%})"
                    for name, target in self.bucket_targets.items()
                ],
                "",
                "Look next:",
                f"  python -c \"import polars as pl; print(pl.read_delta('{self.table_uri}')"
                ".group_by('bucket').len().sort('bucket'))\"",
                f"  mlflow ui --backend-store-uri {self.tracking_uri} --host 127.0.0.1",
                "  rollstream status; rollstream down",
            ]
        )


def publish_synthetic(
    settings: Settings,
    *,
    trajectories: int,
    seed: int | None,
    bad_fraction: float,
    progress: Progress,
    advance: Advance | None = None,
) -> dict[str, int]:
    """Publish `trajectories` fleet records plus malformed ones; returns acked counts."""
    from producers import Publisher, SyntheticFleet, malformed_messages
    from schemas.profile import load_profile

    if trajectories < 1:
        raise DemoError(f"--trajectories must be at least 1, got {trajectories}")
    if not 0.0 <= bad_fraction < 1.0:
        raise DemoError(f"--bad-fraction must be in [0, 1), got {bad_fraction}")
    seed = random.SystemRandom().randrange(2**31) if seed is None else seed
    bad = round(trajectories * bad_fraction)
    good = trajectories - bad
    progress(
        f"publishing {good} trajectories and {bad} malformed messages to {settings.raw_topic} (seed {seed})"
    )
    every = max(1, trajectories // 10)
    with Publisher(
        bootstrap_servers=settings.bootstrap_servers,
        topic=settings.raw_topic,
        extra_config=dict(settings.kafka_client),
    ) as publisher:
        # Lengths drawn from the inference workload profile the processor buckets by.
        fleet = SyntheticFleet(seed, profile=load_profile(settings.profile_path or None))
        for i, record in enumerate(fleet.trajectories(good), start=1):
            publisher.publish(record)
            if advance is not None and i % 100 == 0:
                advance("publish", i, trajectories)
            elif advance is None and i % every == 0:
                progress(f"  published {i}/{trajectories}")
        for key, value, _kind in malformed_messages(seed, bad):
            publisher.publish_raw(value, key)
        publisher.flush()
    if advance is not None:
        advance("publish", trajectories, trajectories)
    return {"seed": seed, "published": trajectories, "good": good, "malformed": bad}


def _settings_env(settings: Settings) -> dict[str, str]:
    return {**os.environ, **settings.as_env()}


def process_until_accounted(
    settings: Settings,
    *,
    ranges: OffsetRanges,
    timeout_s: float,
    progress: Progress,
    advance: Advance | None = None,
) -> Outcome:
    """Run `rollstream process` as a child until every message in `ranges` is a row or a dead letter."""
    log_path = settings.state_dir / "logs" / "processor.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    # A group still incomplete when the stream ends (the fleet's last one, cut by --trajectories) is
    # released by the wall-clock rule; 5 s instead of the default 30 keeps the demo short.
    command = [sys.executable, "-m", "infra.cli", "process", "--group-wall-timeout", "5"]
    progress(f"starting the stream processor (log: {log_path})")
    with log_path.open("ab") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=_settings_env(settings))
    try:
        deadline = time.monotonic() + timeout_s
        last = -1
        while True:
            now = outcome(settings.lake_dir, settings.raw_topic, ranges)
            if now.accounted != last and advance is not None:
                advance("process", now.accounted, now.expected)
                last = now.accounted
            elif now.accounted != last:
                progress(
                    f"  processed {now.accounted}/{now.expected} "
                    f"({now.rows} rows in Delta, {now.dead_letters} dead letters)"
                )
                last = now.accounted
            if now.complete:
                return now
            if process.poll() is not None:
                raise DemoError(
                    f"the stream processor exited with code {process.returncode} after {now.accounted}/"
                    f"{now.expected} messages; its log {log_path} ends with:\n{tail(log_path)}"
                )
            if time.monotonic() > deadline:
                raise DemoError(
                    f"only {now.accounted}/{now.expected} messages processed within {timeout_s:.0f} s "
                    f"(raise --timeout for large runs); processor log {log_path} ends with:\n{tail(log_path)}"
                )
            time.sleep(1.0)
    finally:
        if process.poll() is None and not terminate(process.pid, timeout=60.0):
            progress(f"the stream processor (pid {process.pid}) ignored SIGTERM for 60 s and was killed")
        process.wait()


def run_demo(
    settings: Settings,
    *,
    trajectories: int = 10_000,
    seed: int | None = None,
    bad_fraction: float = 0.005,
    learn_steps: int = 20,
    timeout_s: float = 900.0,
    progress: Progress,
    advance: Advance | None = None,
) -> DemoSummary:
    """Up, publish, process, learn; return the accounting of this run.

    `advance(phase, done, total)` follows the publish, process and learn phases (progress bars);
    without it those phases report through `progress` lines.
    """
    import polars as pl

    from consumers import LearnerOptions, learn
    from consumers.replay import ReplayConfig
    from infra import services
    from schemas.profile import load_profile

    seconds: dict[str, float] = {}
    started = time.monotonic()
    services.up(settings, progress=progress)
    seconds["up"] = time.monotonic() - started

    table_uri, dlq_uri = str(settings.lake_dir / "trajectories"), str(settings.lake_dir / "dead_letters")
    # This run's messages are the offsets published between the two watermark readings: the
    # accounting counts exactly those, whatever the topic and tables held before.
    before = high_watermarks(
        settings.bootstrap_servers, settings.raw_topic, kafka_client=settings.kafka_client
    )
    started = time.monotonic()
    published = publish_synthetic(
        settings,
        trajectories=trajectories,
        seed=seed,
        bad_fraction=bad_fraction,
        progress=progress,
        advance=advance,
    )
    seconds["publish"] = time.monotonic() - started
    ranges = ranges_between(
        before,
        high_watermarks(settings.bootstrap_servers, settings.raw_topic, kafka_client=settings.kafka_client),
    )
    in_topic = sum(high - low for low, high in ranges.values())
    if in_topic != published["published"]:
        raise DemoError(
            f"{settings.raw_topic!r} grew by {in_topic} messages while the demo published "
            f"{published['published']}: another producer is writing to it; stop it or use another --state-dir"
        )

    started = time.monotonic()
    found = process_until_accounted(
        settings, ranges=ranges, timeout_s=timeout_s, progress=progress, advance=advance
    )
    seconds["process"] = time.monotonic() - started

    progress(f"learning for {learn_steps} steps from {table_uri}")
    started = time.monotonic()
    result = learn(
        ReplayConfig(
            table_uri=table_uri, vocab_size=settings.vocab_size, profile_path=settings.profile_path or None
        ),
        LearnerOptions(steps=learn_steps),
        tracking_uri=settings.tracking_uri,
        progress=None if advance is not None else progress,
        on_step=None if advance is None else lambda step, total: advance("learn", step, total),
    )
    seconds["learn"] = time.monotonic() - started

    profile = load_profile(settings.profile_path or None)
    counts = pl.read_delta(table_uri, columns=["bucket", "group_status"])
    mix = counts["bucket"].value_counts()
    total = max(counts.height, 1)
    return DemoSummary(
        profile_id=profile.id,
        bucket_targets=profile.targets,
        bucket_mix={str(b): n / total for b, n in mix.iter_rows()},
        group_statuses={str(s): int(n) for s, n in counts["group_status"].value_counts().iter_rows()},
        seed=published["seed"],
        published=published["published"],
        malformed_published=published["malformed"],
        delta_rows=found.rows,
        dead_letters=found.dead_letters,
        duplicates=found.duplicates,
        table_uri=table_uri,
        table_version=result.table_version,
        dead_letters_uri=dlq_uri,
        tracking_uri=settings.tracking_uri,
        mlflow_run_id=result.run_id,
        mlflow_experiment_id=result.experiment_id,
        final_loss=result.final_loss,
        reward_mean=result.reward_mean,
        seconds={k: round(v, 2) for k, v in seconds.items()},
    )
