"""The declared topics (``infra/topics.toml``) and their idempotent provisioning on a broker."""

from __future__ import annotations

import logging
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from confluent_kafka import KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
    NewTopic,
    OffsetSpec,
    ResourceType,
)

from infra.exceptions import TopicProvisionError
from infra.processes import poll_until
from infra.settings import Settings

TOPICS_FILE = Path(__file__).resolve().parent / "topics.toml"
ROLES = ("raw", "ultra", "dlq", "tasks_high", "tasks_low", "task_dlq", "task_outcomes")
SHARE_GROUP_ROLES = ("tasks",)

_LIBRDKAFKA_LOG = logging.getLogger("rollstream.infra.librdkafka")
_LIBRDKAFKA_LOG.addHandler(logging.NullHandler())
_LIBRDKAFKA_LOG.propagate = False

Action = Literal["created", "altered", "partitions_increased", "unchanged"]


@dataclass(frozen=True)
class ShareGroupSpec:
    """One declared share group and the group-level configs provisioning sets on it.

    Attributes:
        name: The group id (``Settings.task_group`` for the tasks group).
        config: Group configs as the strings Kafka reports them (``share.*``).
    """

    name: str
    config: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class TopicSpec:
    """One declared topic.

    Attributes:
        role: Its key in topics.toml (``raw``, ``ultra``, ``dlq``, ``tasks_high``, ...); settings
            map a role to a name (`topic_name`).
        name: The topic name, from settings.
        partitions: Declared partition count; provisioning grows a topic to it, never shrinks.
        replication: Replication factor, fixed at creation.
        config: Topic-level Kafka configs as the strings Kafka reports them.
        share_group: The share group that consumes the topic, whose configs provisioning sets.
    """

    role: str
    name: str
    partitions: int
    replication: int
    config: Mapping[str, str] = field(default_factory=dict)
    share_group: ShareGroupSpec | None = None


@dataclass(frozen=True)
class TopicChange:
    """What provisioning did to one topic, with a human-readable detail."""

    topic: str
    action: Action
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.topic}: {self.action}" + (f" ({self.detail})" if self.detail else "")


def load_topics(settings: Settings, path: Path = TOPICS_FILE) -> list[TopicSpec]:
    """Read the topic declarations, named by ``settings``.

    Raises:
        TopicProvisionError: the file is unreadable, names an unknown role, or a value is malformed.
    """
    try:
        declared = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise TopicProvisionError(f"cannot read topic declarations {path}: {exc}") from exc
    tables = declared.get("topics", {})
    unknown = sorted(role for role, body in tables.items() if role not in ROLES and not _named(body))
    if unknown:
        raise TopicProvisionError(
            f"{path}: unknown topic role(s) {unknown}; known roles: {list(ROLES)}, or give the table a name"
        )
    groups = _share_groups(settings, declared.get("share_groups", {}), set(tables), path)
    specs = [
        replace(_spec(role, _name(settings, role, body), body, path), share_group=groups.get(role))
        for role, body in tables.items()
    ]
    return [fit_to_cluster(spec, settings.brokers) for spec in specs]


def topic_name(settings: Settings, role: str) -> str:
    """The topic a role names under `settings`: ``<role>_topic``, and the task classes under ``tasks_topic``."""
    if role in ("tasks_high", "tasks_low"):
        return f"{settings.tasks_topic}.{role.removeprefix('tasks_')}"
    return str(getattr(settings, f"{role}_topic"))


def _share_groups(settings: Settings, tables: Any, roles: set[str], path: Path) -> dict[str, ShareGroupSpec]:
    """Topic role -> the declared share group consuming it, its configs completed from settings."""
    if not isinstance(tables, dict) or set(tables) - set(SHARE_GROUP_ROLES):
        raise TopicProvisionError(
            f"{path}: [share_groups] may declare only {list(SHARE_GROUP_ROLES)}, got {tables!r}"
        )
    out: dict[str, ShareGroupSpec] = {}
    for role, body in tables.items():
        where = f"{path} [share_groups.{role}]"
        topics = body.get("topics") if isinstance(body, dict) else None
        config = body.get("config", {}) if isinstance(body, dict) else None
        if (
            not isinstance(topics, list)
            or not set(topics) <= roles
            or not isinstance(config, dict)
            or set(body) - {"topics", "config"}
        ):
            raise TopicProvisionError(
                f"{where}: expected topics = [declared topic roles] and a config table of group configs"
            )
        strings = {key: _kafka_string(value) for key, value in config.items()}
        strings["share.record.lock.duration.ms"] = str(settings.task_lock_ms)
        strings["share.delivery.count.limit"] = str(settings.task_delivery_limit)
        group = ShareGroupSpec(settings.task_group, strings)
        out.update({topic: group for topic in topics})
    return out


def fit_to_cluster(spec: TopicSpec, brokers: int) -> TopicSpec:
    """Clamp replication to the nodes there are, and min.insync.replicas to one below it (at least 1).

    So the one declaration serves a single node (replication 1) and a 3-node cluster (3, with
    min.insync.replicas 2: an acks=all write survives one node's loss).
    """
    replication = min(spec.replication, brokers)
    config = dict(spec.config)
    if "min.insync.replicas" in config:
        config["min.insync.replicas"] = str(min(int(config["min.insync.replicas"]), max(1, replication - 1)))
    return replace(spec, replication=replication, config=config)


def _named(body: Any) -> bool:
    return isinstance(body, dict) and isinstance(body.get("name"), str) and bool(body["name"])


def _name(settings: Settings, role: str, body: Any) -> str:
    """A role's topic: named by settings (`topic_name`), or for a role no setting names, by `name`."""
    if role in ROLES:
        return topic_name(settings, role)
    return str(body["name"])


def _spec(role: str, name: str, body: Any, path: Path) -> TopicSpec:
    where = f"{path} [topics.{role}]"
    if role in ROLES and isinstance(body, dict) and "name" in body:
        raise TopicProvisionError(f"{where}: settings name this topic ({role}_topic); drop name")
    if not isinstance(body, dict) or set(body) - {"name", "partitions", "replication", "config"}:
        raise TopicProvisionError(f"{where}: expected only name, partitions, replication and a config table")
    counts = {key: body.get(key) for key in ("partitions", "replication")}
    for key, value in counts.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise TopicProvisionError(f"{where}: {key} = {value!r}; give a positive integer")
    config = body.get("config", {})
    if not isinstance(config, dict):
        raise TopicProvisionError(f"{where}: config must be a table of Kafka topic configs")
    strings = {key: _kafka_string(value) for key, value in config.items()}
    return TopicSpec(role, name, int(body["partitions"]), int(body["replication"]), strings)


def _kafka_string(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def max_message_bytes(specs: Iterable[TopicSpec], floor: int = 1_048_588) -> int:
    """The largest batch any declared topic admits: what the broker's request size must hold."""
    return max([floor, *(int(spec.config.get("max.message.bytes", floor)) for spec in specs)])


def admin_client(bootstrap_servers: str, config: Mapping[str, Any] | None = None) -> AdminClient:
    """An AdminClient whose librdkafka chatter (connection refused while a broker starts) stays quiet.

    `config` adds librdkafka settings (security: ``security.protocol``, ``sasl.*``, ``ssl.*``).
    """
    return AdminClient({**(config or {}), "bootstrap.servers": bootstrap_servers}, logger=_LIBRDKAFKA_LOG)


def provision_topics(
    admin: AdminClient, specs: Iterable[TopicSpec], timeout: float = 30.0
) -> list[TopicChange]:
    """Bring the broker in line with ``specs``: create, alter configs, grow partitions.

    Every topic is handled before any error is raised, so one bad topic does not block the rest.

    Raises:
        TopicProvisionError: a topic has more partitions or another replication factor than
            declared (Kafka cannot shrink or re-replicate here), or the broker refused a request.
    """
    specs = list(specs)
    metadata = admin.list_topics(timeout=timeout).topics
    changes: list[TopicChange] = []
    problems: list[str] = []
    missing = [spec for spec in specs if spec.name not in metadata]
    existing = [spec for spec in specs if spec.name in metadata]
    if missing:
        futures = admin.create_topics(
            [NewTopic(s.name, s.partitions, s.replication, config=dict(s.config)) for s in missing],
            request_timeout=timeout,
        )
        for spec in missing:
            try:
                futures[spec.name].result(timeout=timeout)
                changes.append(TopicChange(spec.name, "created", f"{spec.partitions} partitions"))
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    problems.append(f"{spec.name}: create failed: {exc.args[0].str()}")
                else:
                    existing.append(spec)
    if existing:
        names = {spec.name for spec in existing}

        def listed() -> dict[str, Any] | None:
            # A topic another client just created can be missing from this broker's metadata for a
            # moment (seen under load): ask again until every existing topic is listed.
            topics = admin.list_topics(timeout=timeout).topics
            return topics if names <= set(topics) else None

        metadata = (
            poll_until(listed, timeout=timeout, interval=0.2) or admin.list_topics(timeout=timeout).topics
        )
        for spec in existing:
            if spec.name not in metadata:
                problems.append(
                    f"{spec.name}: exists, yet is missing from the broker's metadata after {timeout:.0f} s"
                )
                continue
            _reconcile(admin, spec, metadata[spec.name], timeout, changes, problems)
    groups = {spec.share_group.name: spec.share_group for spec in specs if spec.share_group is not None}
    for group in groups.values():
        try:
            changes.append(provision_share_group(admin, group, timeout))
        except TopicProvisionError as exc:
            problems.append(str(exc))
    if problems:
        raise TopicProvisionError("topics not as declared in topics.toml:\n  " + "\n  ".join(problems))
    return changes


def provision_share_group(admin: AdminClient, group: ShareGroupSpec, timeout: float = 30.0) -> TopicChange:
    """Set the group-level configs of `group` that differ on the broker; the group need not exist yet.

    Raises:
        TopicProvisionError: the broker refused a value (a lock outside the broker's
            group.share.min/max.record.lock.duration.ms, say); the message has its reason.
    """
    label = f"share group {group.name}"
    differing = _differing_group_configs(admin, group, timeout)
    if not differing:
        return TopicChange(label, "unchanged")
    ops = [ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in differing.items()]
    resource = ConfigResource(ResourceType.GROUP, group.name, incremental_configs=ops)
    try:
        admin.incremental_alter_configs([resource], request_timeout=timeout)[resource].result(timeout=timeout)
    except KafkaException as exc:
        raise TopicProvisionError(
            f"{label}: setting {sorted(differing)} failed: {exc.args[0].str()}; check the task_* settings "
            "against the broker's group.share.* bounds (infra/broker.py)"
        ) from exc
    # The change travels through the metadata log: a describe right after it can show the old values.
    if (
        poll_until(lambda: not _differing_group_configs(admin, group, timeout) or None, timeout=timeout)
        is None
    ):
        raise TopicProvisionError(
            f"{label}: {sorted(differing)} set, yet not in effect after {timeout:.0f} s"
        )
    return TopicChange(label, "altered", ", ".join(f"{k}={v}" for k, v in differing.items()))


def _differing_group_configs(admin: AdminClient, group: ShareGroupSpec, timeout: float) -> dict[str, str]:
    resource = ConfigResource(ResourceType.GROUP, group.name)
    try:
        entries = admin.describe_configs([resource], request_timeout=timeout)[resource].result(
            timeout=timeout
        )
    except KafkaException as exc:
        raise TopicProvisionError(
            f"share group {group.name}: describing its configs failed: {exc.args[0].str()}"
        ) from exc
    current = {name: entry.value for name, entry in entries.items()}
    return {key: value for key, value in group.config.items() if current.get(key) != value}


def _reconcile(
    admin: AdminClient,
    spec: TopicSpec,
    meta: Any,
    timeout: float,
    changes: list[TopicChange],
    problems: list[str],
) -> None:
    actual_partitions = len(meta.partitions)
    replication = len(next(iter(meta.partitions.values())).replicas) if meta.partitions else 0
    if replication != spec.replication:
        problems.append(
            f"{spec.name}: replication factor is {replication}, declared {spec.replication}; "
            "reassign its partitions or delete and recreate the topic"
        )
    if actual_partitions > spec.partitions:
        problems.append(
            f"{spec.name}: has {actual_partitions} partitions, declared {spec.partitions}; Kafka cannot "
            f"remove partitions: declare {actual_partitions} or delete and recreate the topic"
        )
    done: list[str] = []
    differing = _differing_configs(admin, spec, timeout)
    if differing:
        entries = [
            ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in differing.items()
        ]
        resource = ConfigResource(ResourceType.TOPIC, spec.name, incremental_configs=entries)
        try:
            admin.incremental_alter_configs([resource], request_timeout=timeout)[resource].result(
                timeout=timeout
            )
            changes.append(
                TopicChange(spec.name, "altered", ", ".join(f"{k}={v}" for k, v in differing.items()))
            )
            done.append("altered")
        except KafkaException as exc:
            problems.append(f"{spec.name}: altering {sorted(differing)} failed: {exc.args[0].str()}")
    if actual_partitions < spec.partitions:
        try:
            admin.create_partitions([NewPartitions(spec.name, spec.partitions)], request_timeout=timeout)[
                spec.name
            ].result(timeout=timeout)
            changes.append(
                TopicChange(spec.name, "partitions_increased", f"{actual_partitions} -> {spec.partitions}")
            )
            done.append("grown")
        except KafkaException as exc:
            problems.append(
                f"{spec.name}: growing to {spec.partitions} partitions failed: {exc.args[0].str()}"
            )
    if not done:
        changes.append(TopicChange(spec.name, "unchanged"))


def _differing_configs(admin: AdminClient, spec: TopicSpec, timeout: float) -> dict[str, str]:
    """Declared configs whose value on the broker differs."""
    current = describe_topic_configs(admin, spec.name, timeout)
    return {key: value for key, value in spec.config.items() if current.get(key) != value}


def describe_topic_configs(admin: AdminClient, topic: str, timeout: float = 30.0) -> dict[str, str]:
    """A topic's effective configs as strings, as Kafka reports them."""
    resource = ConfigResource(ResourceType.TOPIC, topic)
    entries = admin.describe_configs([resource], request_timeout=timeout)[resource].result(timeout=timeout)
    return {name: entry.value for name, entry in entries.items() if entry.value is not None}


def wait_until_served(admin: AdminClient, topics: Iterable[str], timeout: float = 60.0) -> None:
    """Wait until every partition of `topics` answers an end-offset request (a leader serves it).

    Right after a topic is created its partitions can answer "not leader" for a moment: a client
    that asks at once (the demo reading end offsets) fails. `up` waits here instead.

    Raises:
        TopicProvisionError: some partition still had no serving leader after `timeout` seconds.
    """
    names = list(topics)
    last_error = "no answer yet"

    def served() -> bool | None:
        nonlocal last_error
        metadata = admin.list_topics(timeout=10).topics
        request = {}
        for name in names:
            topic = metadata.get(name)
            if topic is None or topic.error is not None:
                last_error = f"{name}: {topic.error if topic is not None else 'not in metadata'}"
                return None
            request.update({TopicPartition(name, p): OffsetSpec.latest() for p in topic.partitions})
        try:
            for future in admin.list_offsets(request, request_timeout=10).values():
                future.result(timeout=10)
        except KafkaException as exc:
            last_error = exc.args[0].str() if exc.args else str(exc)
            return None
        return True

    if not poll_until(served, timeout=timeout, interval=0.3):
        raise TopicProvisionError(f"topics {names} were not served within {timeout:.0f} s: {last_error}")
