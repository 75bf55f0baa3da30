"""The local stack behind ``rollstream up``, ``down`` and ``status``: broker, topics, tracking server."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaException

from infra.broker import (
    BrokerPaths,
    broker_status,
    broker_statuses,
    running_layout,
    stack_client_config,
    start_broker,
    stop_broker,
)
from infra.exceptions import BrokerError
from infra.kafka_jars import ensure_jars
from infra.metrics_endpoints import Scraped, scrape_all
from infra.mlflow_server import mlflow_server_status, start_mlflow_server, stop_mlflow_server
from infra.object_store import lake_settings_hint, object_store_status, start_object_store, stop_object_store
from infra.processes import ProcessStatus, stderr_progress
from infra.secure import SecurePaths, TaskAcls, ensure_material, ensure_users_and_acls, write_role_configs
from infra.settings import Settings
from infra.topics import TopicChange, admin_client, load_topics, provision_topics, wait_until_served

STATUS_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class ServiceStatus:
    """A snapshot of the local stack.

    Attributes:
        state_dir: The state directory the stack lives in.
        bootstrap_servers: The broker address clients use.
        tracking_uri: The MLflow tracking store jobs log to.
        kafka: The broker process.
        mlflow: The optional tracking server process.
        topics: Topics present on the broker (Kafka's internal ``__`` topics left out).
        missing_topics: Declared topics the broker does not have.
        changes: What provisioning did, when this snapshot comes from ``up``.
        error: Why the topics could not be listed, when the broker runs but did not answer.
        metrics: Each process registered as serving metrics, with the figures scraped from it.
    """

    state_dir: Path
    bootstrap_servers: str
    tracking_uri: str
    kafka: ProcessStatus
    mlflow: ProcessStatus
    topics: tuple[str, ...] = ()
    missing_topics: tuple[str, ...] = ()
    changes: tuple[TopicChange, ...] = ()
    error: str | None = None
    nodes: tuple[ProcessStatus, ...] = ()
    object_store: ProcessStatus | None = None
    metrics: tuple[Scraped, ...] = ()

    @property
    def running(self) -> bool:
        """Whether the broker runs."""
        return self.kafka.running

    @property
    def pid(self) -> int | None:
        """The broker's pid, when it runs."""
        return self.kafka.pid

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready view, for ``rollstream status --json``."""
        return {
            "running": self.running,
            "pid": self.pid,
            "bootstrap_servers": self.bootstrap_servers,
            "state_dir": str(self.state_dir),
            "tracking_uri": self.tracking_uri,
            "kafka_log": str(self.kafka.log_file),
            "topics": list(self.topics),
            "missing_topics": list(self.missing_topics),
            "mlflow_server": {
                "running": self.mlflow.running,
                "pid": self.mlflow.pid,
                "url": self.mlflow.url,
                "log": str(self.mlflow.log_file),
            },
            "changes": [str(change) for change in self.changes],
            "nodes": [{"name": n.name, "running": n.running, "pid": n.pid, "url": n.url} for n in self.nodes],
            "object_store": None
            if self.object_store is None
            else {
                "running": self.object_store.running,
                "pid": self.object_store.pid,
                "url": self.object_store.url,
            },
            "metrics": [scraped.as_dict() for scraped in self.metrics],
            "error": self.error,
        }

    def describe(self) -> str:
        """A human-readable summary, one fact per line."""
        kafka = f"running (pid {self.pid})" if self.running else "stopped"
        mlflow = f"running (pid {self.mlflow.pid}) at {self.mlflow.url}" if self.mlflow.running else "stopped"
        lines = [
            f"kafka broker:  {kafka} at {self.bootstrap_servers}; log {self.kafka.log_file}",
            f"topics:        {', '.join(self.topics) or '-'}",
            f"mlflow server: {mlflow}",
            f"tracking uri:  {self.tracking_uri}",
            f"state dir:     {self.state_dir}",
        ]
        if self.object_store is not None and self.object_store.running:
            lines.append(f"object store:  running (pid {self.object_store.pid}) at {self.object_store.url}")
        if len(self.nodes) > 1:
            for node in self.nodes:
                state = f"running (pid {node.pid})" if node.running else "DOWN"
                lines.append(f"  {node.name}: {state} at {node.url}")
        serving = len(self.metrics)
        lines.append(
            f"metrics:       {serving} {'process' if serving == 1 else 'processes'} serving /metrics"
            if serving
            else "metrics:       no process serving /metrics registered"
        )
        lines += [f"  {scraped.describe()}" for scraped in self.metrics]
        if self.missing_topics:
            lines.append(f"missing:       {', '.join(self.missing_topics)} (run `rollstream up`)")
        if self.error:
            lines.append(f"error:         {self.error}")
        return "\n".join(lines)


def up(
    settings: Settings,
    *,
    mlflow_server: bool = False,
    secure: bool = False,
    object_store: bool = False,
    progress: Callable[[str], None] = stderr_progress,
) -> ServiceStatus:
    """Start what is not running and provision topics; safe to run again on a running stack.

        Steps: fetch the Kafka jars once, format storage once, start the broker and wait until it
        answers, provision the declared topics, then the tracking server and the object store (MinIO,
    infra/object_store.py) when asked. With `secure`
        (or on a state directory set up so before), the brokers take only SASL_SSL clients, and the
        role users and ACLs of infra/secure.py are created (docs/security.md).

        Raises:
            InfraError: a step failed; the message names the step's log or the setting to change.
    """
    paths = SecurePaths.of(settings.state_dir)
    if secure and not paths.enabled:
        formatted = BrokerPaths.of(settings).data / "meta.properties"
        if formatted.is_file() or (settings.state_dir / "kafka-cluster").is_dir():
            raise BrokerError(
                f"the state directory {settings.state_dir} holds a plaintext broker; `rollstream down`, "
                "then start the secure stack in another --state-dir (or delete this one's kafka data)"
            )
        ensure_material(paths, settings.kafka_host)
        progress(f"secure stack: certificates and role passwords in {paths.root}")
    specs = load_topics(settings)
    jars = ensure_jars(settings, progress=progress)
    start_broker(settings, jars=jars, specs=specs, progress=progress)
    admin = admin_client(settings.bootstrap_servers, stack_client_config(settings))
    changes = provision_topics(admin, specs)
    wait_until_served(admin, [spec.name for spec in specs])
    if paths.enabled:
        passwords = ensure_material(paths, settings.kafka_host)
        named = {spec.role: spec.name for spec in specs}
        tasks = TaskAcls(
            (named["tasks_high"], named["tasks_low"]),
            named["task_dlq"],
            named["task_outcomes"],
            settings.task_group,
        )
        ensure_users_and_acls(
            admin,
            passwords,
            trajectory_topics=[settings.raw_topic, settings.ultra_topic],
            dlq_topic=settings.dlq_topic,
            tasks=tasks,
        )
        for config in write_role_configs(paths, passwords):
            progress(f"client settings: {config}")
    for change in changes:
        if change.action != "unchanged":
            progress(f"topic {change}")
    if mlflow_server:
        start_mlflow_server(settings, progress=progress)
    if object_store:
        store = start_object_store(settings, progress=progress)
        progress(f"lake on the object store: {lake_settings_hint(store)}")
    return replace(status(settings), changes=tuple(changes))


def down(settings: Settings, *, progress: Callable[[str], None] = stderr_progress) -> list[str]:
    """Stop the tracking server, the object store and the broker of this state directory; return what was stopped."""
    stopped: list[str] = []
    stops = (
        ("mlflow server", stop_mlflow_server),
        ("object store", stop_object_store),
        ("kafka broker", stop_broker),
    )
    for name, stop in stops:
        pid = stop(settings)
        if pid is None:
            progress(f"{name}: not running")
        else:
            progress(f"{name}: stopped (pid {pid})")
            stopped.append(f"{name} (pid {pid})")
    return stopped


def status(settings: Settings) -> ServiceStatus:
    """What runs for ``settings``, which topics the broker has and what each process serving metrics
    reports; never starts or stops anything (it removes the metrics registrations of processes gone)."""
    settings = running_layout(settings)
    kafka = broker_status(settings)
    topics: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()
    error = None
    if kafka.running:
        try:
            admin = admin_client(settings.bootstrap_servers, stack_client_config(settings))
            present = admin.list_topics(timeout=STATUS_TIMEOUT_S).topics
            topics = tuple(sorted(name for name in present if not name.startswith("__")))
            missing = tuple(spec.name for spec in load_topics(settings) if spec.name not in present)
        except KafkaException as exc:
            error = f"broker did not answer within {STATUS_TIMEOUT_S:.0f} s: {exc}"
    return ServiceStatus(
        state_dir=settings.state_dir,
        bootstrap_servers=settings.bootstrap_servers,
        tracking_uri=settings.tracking_uri,
        kafka=kafka,
        mlflow=mlflow_server_status(settings),
        topics=topics,
        missing_topics=missing,
        error=error,
        nodes=tuple(broker_statuses(settings)),
        object_store=object_store_status(settings),
        metrics=tuple(scrape_all(settings.state_dir)),
    )
