"""The share group's lease terms as the broker holds them: lock duration, delivery limit, reset."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

from producers.tasks.exceptions import TaskQueueError


@dataclass(frozen=True)
class GroupTerms:
    """A share group's configs that the queue depends on.

    Attributes:
        lock_ms: ``share.record.lock.duration.ms``: how long a taken task stays leased.
        delivery_limit: ``share.delivery.count.limit``: deliveries before the broker archives.
        offset_reset: ``share.auto.offset.reset``: where a new group starts.
    """

    lock_ms: int
    delivery_limit: int
    offset_reset: str


def read_group_terms(
    bootstrap_servers: str,
    group: str,
    *,
    extra_config: Mapping[str, Any] | None = None,
    timeout: float = 30.0,
) -> GroupTerms:
    """The group's terms, read from the broker (the group need not have members yet).

    Raises:
        TaskQueueError: the broker did not answer or the group's configs are missing.
    """
    admin = AdminClient({**(extra_config or {}), "bootstrap.servers": bootstrap_servers})
    resource = ConfigResource(ResourceType.GROUP, group)
    try:
        entries = admin.describe_configs([resource], request_timeout=timeout)[resource].result(
            timeout=timeout
        )
    except KafkaException as exc:
        raise TaskQueueError(
            f"cannot read share group {group!r}'s configs at {bootstrap_servers}: {exc.args[0].str()}; "
            "is the broker up (`rollstream status`)?"
        ) from exc
    values = {name: entry.value for name, entry in entries.items()}
    try:
        return GroupTerms(
            lock_ms=int(values["share.record.lock.duration.ms"]),
            delivery_limit=int(values["share.delivery.count.limit"]),
            offset_reset=str(values["share.auto.offset.reset"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise TaskQueueError(
            f"share group {group!r} has no readable {exc} config: the broker does not support share "
            "groups (Kafka 4.2 or later, share.version 1)"
        ) from exc
