"""Counting tasks per priority class from the outcome log and the task topics' offsets.

Every task record ever written (the task topics' end offsets) ends as one of done, dead or
requeued (replaced by a copy, itself a record); until then it is in flight (its last event is a
``started`` younger than the lock) or pending. Events are counted per record coordinates, so an
event sent twice counts once. The counts are exact while the outcome log keeps every event (its
retention covers the tasks') and no worker died between settling a task and logging it (each such
death leaves one task counted as pending; docs/rollout.md).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition

from producers.tasks.exceptions import TaskQueueError
from producers.tasks.outcomes import TERMINAL, Outcome, now_ms
from producers.tasks.topics import TaskTopics
from schemas.task import PRIORITIES


@dataclass(frozen=True)
class ClassStatus:
    """The tasks of one priority class.

    Attributes:
        priority: the class's name.
        submitted: tasks submitted (records written, less requeued copies' originals).
        pending: waiting to be taken (or taken by a worker that died, until its lock runs out).
        in_flight: taken, not yet settled, lock not yet run out.
        done: completed.
        dead: task dead letters.
        retries: failed attempts released for another (events, not tasks).
        requeued: put back without using an attempt (events, not tasks).
    """

    priority: str
    submitted: int
    pending: int
    in_flight: int
    done: int
    dead: int
    retries: int
    requeued: int


@dataclass(frozen=True)
class TaskStatus:
    """Every class's counts, and how much of the log was read."""

    classes: Mapping[str, ClassStatus]
    events: int
    unreadable_events: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "classes": {name: asdict(status) for name, status in self.classes.items()},
            "events": self.events,
            "unreadable_events": self.unreadable_events,
        }


def read_status(
    *,
    bootstrap_servers: str,
    topics: TaskTopics,
    lock_ms: int,
    extra_config: Mapping[str, Any] | None = None,
    timeout: float = 30.0,
) -> TaskStatus:
    """Read the outcome log from its start to its current end, and the task topics' end offsets.

    Raises:
        TaskQueueError: a topic is missing or the broker did not answer within `timeout`.
    """
    consumer = Consumer(
        {
            **(extra_config or {}),
            "bootstrap.servers": bootstrap_servers,
            "group.id": f"rollstream-tasks-status-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "enable.partition.eof": False,
        }
    )
    try:
        records = {p: _records(consumer, topic, timeout) for p, topic in topics.classes.items()}
        events = _read_log(consumer, topics.outcomes, timeout)
    finally:
        consumer.close()
    return _count(topics, records, events, lock_ms)


def _partitions(consumer: Consumer, topic: str, timeout: float) -> list[int]:
    try:
        meta = consumer.list_topics(topic, timeout=timeout).topics.get(topic)
    except KafkaException as exc:
        raise TaskQueueError(f"cannot list {topic}: {exc.args[0].str()}; is the broker up?") from exc
    if meta is None or meta.error is not None or not meta.partitions:
        raise TaskQueueError(f"topic {topic} does not exist; provision the task topics (`rollstream up`)")
    return sorted(meta.partitions)


def _records(consumer: Consumer, topic: str, timeout: float) -> int:
    """Records ever written to `topic`: the sum of its end offsets."""
    return sum(
        consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout)[1]
        for p in _partitions(consumer, topic, timeout)
    )


def _read_log(consumer: Consumer, topic: str, timeout: float) -> list[Outcome | None]:
    ends = {
        p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout)[1]
        for p in _partitions(consumer, topic, timeout)
    }
    todo = {p for p, end in ends.items() if end > 0}
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in todo])
    out: list[Outcome | None] = []
    idle = 0.0
    while todo:
        messages = consumer.consume(10_000, timeout=1.0)
        if not messages:
            idle += 1.0
            if idle >= timeout:
                raise TaskQueueError(f"reading the outcome log {topic} stalled for {timeout:.0f} s")
            continue
        idle = 0.0
        for message in messages:
            if message.error() is not None:
                continue
            try:
                out.append(Outcome.decode(message.value() or b""))
            except (ValueError, TypeError):
                out.append(None)
            if (message.offset() or 0) + 1 >= ends[message.partition() or 0]:
                todo.discard(message.partition() or 0)
    return out


def _count(
    topics: TaskTopics, records: Mapping[int, int], events: list[Outcome | None], lock_ms: int
) -> TaskStatus:
    terminal: dict[tuple[str, int, int], Outcome] = {}
    last: dict[tuple[str, int, int], Outcome] = {}
    retries = dict.fromkeys(topics.classes, 0)
    for event in events:
        if event is None:
            continue
        where = event.coordinates
        if event.event in TERMINAL:
            terminal.setdefault(where, event)
        else:
            last[where] = event
        if event.event == "released" and event.priority in retries:
            retries[event.priority] += 1
    now = now_ms()
    classes: dict[str, ClassStatus] = {}
    for priority in sorted(topics.classes, reverse=True):
        ended = [e for e in terminal.values() if e.priority == priority]
        done = sum(e.event == "done" for e in ended)
        dead = sum(e.event == "dead" for e in ended)
        requeued = sum(e.event == "requeued" for e in ended)
        in_flight = sum(
            e.priority == priority
            and e.event == "started"
            and where not in terminal
            and e.time_ms + lock_ms > now
            for where, e in last.items()
        )
        total = records.get(priority, 0)
        name = PRIORITIES.get(priority, str(priority))
        classes[name] = ClassStatus(
            priority=name,
            submitted=total - requeued,
            pending=max(0, total - done - dead - requeued - in_flight),
            in_flight=in_flight,
            done=done,
            dead=dead,
            retries=retries[priority],
            requeued=requeued,
        )
    return TaskStatus(classes, sum(e is not None for e in events), sum(e is None for e in events))
