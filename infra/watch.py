"""Live status: the pipeline at a glance, refreshed in place (`rollstream status --watch`).

Each refresh reads only cheap things: broker metadata and end offsets, the processor group's
committed offsets (its lag per partition), the Delta logs' row counts and versions, the
newest MLflow run's last metrics, and the key figures of every process registered as serving
Prometheus metrics (infra/metrics_endpoints.py, as `rollstream status` shows them). Rates are
differences between two refreshes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import OffsetSpec
from deltalake import DeltaTable
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from infra.metrics_endpoints import Scraped, scrape_all
from infra.processes import ProcessStatus
from infra.topics import admin_client
from schemas.defaults import StreamDefaults

DEFAULT_GROUP = StreamDefaults.app_id
LAKE_TABLES = ("trajectories", "dead_letters", "executions", "rescores")
TIMEOUT_S = 5.0


@dataclass
class Snapshot:
    """One look at the pipeline."""

    taken_at: float
    broker: ProcessStatus
    group: str = DEFAULT_GROUP
    """The consumer group whose lag `lag` holds."""
    lag: dict[tuple[str, int], tuple[int, int | None]] = field(default_factory=dict)
    """(topic, partition) -> (end offset, the group's committed offset or None)."""
    tables: dict[str, tuple[int, int]] = field(default_factory=dict)
    """table name -> (version, rows)."""
    learner: dict[str, Any] = field(default_factory=dict)
    metrics: list[Scraped] = field(default_factory=list)
    """Each registered metrics endpoint, scraped."""
    error: str | None = None


def table_counts(
    lake_dir: str, names: tuple[str, ...] = LAKE_TABLES, *, storage_options: Mapping[str, str] | None = None
) -> dict[str, tuple[int, int]]:
    """Version and row count of each existing table, from the Delta log (no data file is read)."""
    out: dict[str, tuple[int, int]] = {}
    options = dict(storage_options) if storage_options else None
    for name in names:
        uri = f"{lake_dir.rstrip('/')}/{name}"
        if not DeltaTable.is_deltatable(uri, storage_options=options):
            continue
        table = DeltaTable(uri, storage_options=options)
        actions = table.get_add_actions(flatten=True)
        rows = sum(v for v in actions.column("num_records").to_pylist() if v is not None)
        out[name] = (table.version(), int(rows))
    return out


def group_lag(
    bootstrap_servers: str,
    topics: tuple[str, ...],
    group: str,
    kafka_client: Mapping[str, Any] | None = None,
) -> dict[tuple[str, int], tuple[int, int | None]]:
    """End offset and committed offset of `group` for every partition of `topics`.

    Committed offsets come from a consumer that never joins the group (`Consumer.committed`), not
    from AdminClient.list_consumer_group_offsets, which crashed the interpreter (SIGSEGV, 3 of 3
    runs, confluent-kafka 2.16.1) on a fresh broker whose offsets topic was not ready yet.
    """
    admin = admin_client(bootstrap_servers, kafka_client)
    metadata = admin.list_topics(timeout=TIMEOUT_S).topics
    partitions = [
        TopicPartition(topic, p) for topic in topics if topic in metadata for p in metadata[topic].partitions
    ]
    if not partitions:
        return {}
    ends = admin.list_offsets({tp: OffsetSpec.latest() for tp in partitions}, request_timeout=TIMEOUT_S)
    consumer = Consumer(
        {
            **(kafka_client or {}),
            "bootstrap.servers": bootstrap_servers,
            "group.id": group,
            "enable.auto.commit": False,
        }
    )
    committed: dict[tuple[str, int], int | None] = {}
    try:
        committed = {
            (tp.topic, tp.partition): (tp.offset if tp.offset >= 0 else None)
            for tp in consumer.committed(partitions, timeout=TIMEOUT_S)
        }
    except KafkaException:  # no coordinator yet (a fresh broker): the group has committed nothing
        pass
    finally:
        consumer.close()
    return {
        (tp.topic, tp.partition): (
            future.result(timeout=TIMEOUT_S).offset,
            committed.get((tp.topic, tp.partition)),
        )
        for tp, future in ends.items()
    }


def learner_progress(tracking_uri: str) -> dict[str, Any]:
    """The newest MLflow run's id, status and latest metrics, or {} when there is none.

    A sqlite store that does not exist yet is not created: looking must change nothing (and
    creating one beside the Kafka client's threads crashed the interpreter here).
    """
    if tracking_uri.startswith("sqlite:///") and not Path(tracking_uri.removeprefix("sqlite:///")).is_file():
        return {}
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    runs = client.search_runs(
        [e.experiment_id for e in client.search_experiments()],
        order_by=["attributes.start_time DESC"],
        max_results=1,
    )
    if not runs:
        return {}
    run = runs[0]
    return {"run_id": run.info.run_id, "status": run.info.status, **run.data.metrics}


def take_snapshot(
    *,
    broker: ProcessStatus,
    bootstrap_servers: str,
    topics: tuple[str, ...],
    lake_dir: str,
    tracking_uri: str,
    group: str = DEFAULT_GROUP,
    storage_options: Mapping[str, str] | None = None,
    kafka_client: Mapping[str, Any] | None = None,
    state_dir: Path | None = None,
) -> Snapshot:
    """Look at everything once; a part that cannot be read is reported, not raised.

    `state_dir` holds the metrics endpoints' registrations; None leaves them out.
    """
    snapshot = Snapshot(time.monotonic(), broker, group)
    errors = []
    if broker.running:
        try:
            snapshot.lag = group_lag(bootstrap_servers, topics, group, kafka_client)
        except KafkaException as exc:
            errors.append(f"kafka: {exc.args[0] if exc.args else exc}")
    try:
        snapshot.tables = table_counts(lake_dir, storage_options=storage_options)
    except Exception as exc:  # a table mid-commit or unreadable: show it, keep watching
        errors.append(f"delta: {exc}")
    try:
        snapshot.learner = learner_progress(tracking_uri)
    except Exception as exc:  # the tracking store may not exist yet
        errors.append(f"mlflow: {exc}")
    if state_dir is not None:
        snapshot.metrics = scrape_all(state_dir)  # an endpoint that does not answer says so in its row
    snapshot.error = "; ".join(errors) or None
    return snapshot


def render(now: Snapshot, before: Snapshot | None = None) -> Group:
    """Tables for one snapshot; rates need the previous one."""
    elapsed = (now.taken_at - before.taken_at) if before else 0.0
    services = Table(title="services", expand=False)
    for column in ("service", "state", "pid", "where"):
        services.add_column(column)
    state = "[green]up[/green]" if now.broker.running else "[red]down[/red]"
    services.add_row("kafka broker", state, str(now.broker.pid or "-"), now.broker.url)

    lag = Table(title=f"consumer lag ({now.group} group)")
    for column in ("topic", "partition", "end offset", "committed", "lag"):
        lag.add_column(column, justify="right")
    for (topic, partition), (end, committed) in sorted(now.lag.items()):
        behind = end - (committed or 0)
        lag.add_row(
            topic, str(partition), str(end), "-" if committed is None else str(committed), str(behind)
        )

    tables = Table(title="delta tables")
    for column in ("table", "version", "rows", "rows/s"):
        tables.add_column(column, justify="right")
    for name, (version, rows) in sorted(now.tables.items()):
        rate = "-"
        if before and name in before.tables and elapsed > 0:
            rate = f"{(rows - before.tables[name][1]) / elapsed:,.0f}"
        tables.add_row(name, str(version), f"{rows:,}", rate)

    learner = Table(title="learner (newest MLflow run)")
    learner.add_column("metric")
    learner.add_column("value", justify="right")
    for key, value in sorted(now.learner.items()):
        learner.add_row(key, f"{value:.4g}" if isinstance(value, float) else str(value))
    metrics = Table(title="metrics endpoints")
    for column in ("role", "pid", "url", "figures"):
        metrics.add_column(column)
    for scraped in now.metrics:
        e = scraped.endpoint
        metrics.add_row(e.role, str(e.pid), e.url, scraped.figures_text())
    parts: list[Any] = [services, lag, tables, learner, metrics]
    if now.error:
        parts.append(f"[yellow]{now.error}[/yellow]")
    return Group(*parts)


def watch(
    look: Callable[[], Snapshot],
    *,
    interval_s: float = 2.0,
    iterations: int | None = None,
    console: Console | None = None,
) -> int:
    """Refresh the view in place every `interval_s` until Ctrl-C (or `iterations` refreshes)."""
    before: Snapshot | None = None
    count = 0
    with Live(console=console or Console(), auto_refresh=False, transient=False) as live:
        try:
            while iterations is None or count < iterations:
                now = look()
                live.update(render(now, before), refresh=True)
                before, count = now, count + 1
                if iterations is None or count < iterations:
                    time.sleep(interval_s)
        except KeyboardInterrupt:
            pass
    return count
