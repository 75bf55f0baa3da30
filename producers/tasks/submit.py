"""Submitting tasks: rows (JSONL, Parquet, a Delta table, or mappings) checked and sent by class.

A row has the task's fields (``schemas/avro/task.avsc``) with conveniences: ``prompt_tokens`` as
a list of ids, ``priority`` as a number or a class name ('high', 'low'), and ``task_id``,
``deadline_ms`` and ``created_at`` optional (a UUID, the default deadline, now). A row that is not
a valid task, repeats a task id, or whose deadline outlasts the share group's lock is refused
with its reason; the others are sent, one record per batch, and waited for.
"""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

import numpy as np

from producers.exceptions import PublishError
from producers.tasks.sending import TaskSender
from producers.tasks.topics import TaskTopics
from schemas.packing import pack_int32
from schemas.task import PRIORITIES, Task, TaskCodec, TaskError

Row = tuple[str, Mapping[str, Any] | Task | Exception]
"""Where a row came from ('line 3', 'row 7') and its fields (or a task), or why it could not be read."""
_BY_NAME = {name: number for number, name in PRIORITIES.items()}


@dataclass(frozen=True)
class Refusal:
    """A row that was not submitted, and why."""

    where: str
    task_id: str
    reason: str


@dataclass
class SubmitReport:
    """What one submission did.

    Attributes:
        submitted: tasks sent and acknowledged, per priority class name.
        refused: the rows not submitted, with their reasons.
    """

    submitted: dict[str, int] = field(default_factory=lambda: dict.fromkeys(PRIORITIES.values(), 0))
    refused: list[Refusal] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(self.submitted.values())

    def as_dict(self) -> dict[str, Any]:
        return {
            "submitted": self.total,
            "by_priority": dict(self.submitted),
            "refused": [{"where": r.where, "task_id": r.task_id, "reason": r.reason} for r in self.refused],
        }


class TaskSubmitter:
    """Sends tasks to their class's topic, keyed by task id.

    Args:
        bootstrap_servers: the Kafka brokers.
        topics: the task topics.
        lock_ms: the share group's lock duration: no task's deadline may exceed it.
        default_deadline_ms: the deadline of a row that gives none.
        extra_config: librdkafka options applied last.
        codec: encodes tasks; default the shipped task schema.
    """

    def __init__(
        self,
        *,
        bootstrap_servers: str,
        topics: TaskTopics,
        lock_ms: int,
        default_deadline_ms: int,
        extra_config: Mapping[str, Any] | None = None,
        codec: TaskCodec | None = None,
    ) -> None:
        if not 1 <= default_deadline_ms <= lock_ms:
            raise TaskError(
                f"default deadline of {default_deadline_ms} ms must lie in 1..{lock_ms} (the share group's "
                "lock): lower task_deadline_ms or raise task_lock_ms"
            )
        self.topics, self.lock_ms, self.default_deadline_ms = topics, lock_ms, default_deadline_ms
        self._codec = codec or TaskCodec()
        self._sender = TaskSender(bootstrap_servers, extra_config=extra_config)

    def submit(self, tasks: Iterable[Task | Mapping[str, Any]]) -> SubmitReport:
        """Submit tasks or rows of task fields; item i is reported as 'item i'."""
        return self.submit_rows((f"item {i}", t) for i, t in enumerate(tasks))

    def submit_rows(self, rows: Iterable[Row]) -> SubmitReport:
        """Check every row, send the valid ones, wait for all, and report."""
        report = SubmitReport()
        now = datetime.now(UTC)
        seen: set[str] = set()
        queued: dict[str, tuple[str, Task]] = {}
        for where, fields in rows:
            task_id = str(fields.get("task_id") or "") if isinstance(fields, Mapping) else ""
            try:
                if isinstance(fields, Exception):
                    raise fields
                task = (
                    fields
                    if isinstance(fields, Task)
                    else task_from_row(fields, self.default_deadline_ms, now)
                )
                task_id = task.task_id
                if task.deadline_ms > self.lock_ms:
                    raise TaskError(
                        f"deadline_ms = {task.deadline_ms} outlasts the share group's lock of {self.lock_ms} ms "
                        "(task_lock_ms): a worker would lose the lease mid-attempt; shorten the deadline"
                    )
                if task_id in seen:
                    raise TaskError(
                        f"task_id {task_id!r} appears twice in this submission; give each task its own"
                    )
            except (TaskError, ValueError, TypeError) as exc:
                report.refused.append(Refusal(where, task_id, str(exc)))
                continue
            seen.add(task_id)
            queued[task_id] = (where, task)
            self._sender.queue(self.topics.classes[task.priority], self._codec.encode(task), key=task_id)
        failed: set[str] = set()
        try:
            self._sender.flush("the task topics")
        except PublishError as exc:
            failed = set(exc.message_ids)
            for task_id in failed & set(queued):
                report.refused.append(
                    Refusal(queued[task_id][0], task_id, f"not acknowledged: {exc.first_reason}")
                )
            if "?" in failed:  # timed out unnamed: none of them can be counted as in Kafka
                failed |= set(queued)
        for task_id, (_, task) in queued.items():
            if task_id not in failed:
                report.submitted[task.priority_name] += 1
        return report

    def close(self) -> None:
        self._sender.close()

    def __enter__(self) -> TaskSubmitter:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def task_from_row(row: Mapping[str, Any], default_deadline_ms: int, now: datetime) -> Task:
    """A task from one row of fields, with the conveniences the module describes.

    Raises:
        TaskError: a field is invalid or a required one is missing.
    """
    fields = {key: _plain(value) for key, value in row.items() if value is not None}
    fields.setdefault("task_id", str(uuid.uuid4()))
    fields.setdefault("deadline_ms", default_deadline_ms)
    fields.setdefault("created_at", now)
    tokens = fields.get("prompt_tokens")
    if isinstance(tokens, list):
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
            raise TaskError(f"task {fields['task_id']!r}: prompt_tokens must be a list of integer token ids")
        fields["prompt_tokens"] = pack_int32(tokens) if tokens else b""
    elif isinstance(tokens, str):
        raise TaskError(
            f"task {fields['task_id']!r}: prompt_tokens is text; give token ids, or use prompt_text"
        )
    priority = fields.get("priority")
    if isinstance(priority, str):
        if priority not in _BY_NAME:
            raise TaskError(
                f"task {fields['task_id']!r}: priority {priority!r}; give one of {sorted(_BY_NAME)}"
            )
        fields["priority"] = _BY_NAME[priority]
    created = fields["created_at"]
    if isinstance(created, str):
        try:
            fields["created_at"] = datetime.fromisoformat(created)
        except ValueError:
            raise TaskError(
                f"task {fields['task_id']!r}: created_at {created!r} is not an ISO timestamp"
            ) from None
    if isinstance(fields["created_at"], datetime) and fields["created_at"].tzinfo is None:
        fields["created_at"] = fields["created_at"].replace(tzinfo=UTC)
    for name in ("gold_fields", "metadata"):
        if isinstance(fields.get(name), list):  # a Parquet or Delta map reads as key/value structs
            fields[name] = {item["key"]: item["value"] for item in fields[name]}
    return Task.from_dict(fields)


def read_rows(
    source: str | Path, *, stdin: IO[str] | None = None, storage_options: Mapping[str, str] | None = None
) -> Iterator[Row]:
    """Rows of a JSONL file (or ``-``: JSONL on stdin), a ``.parquet`` file, or a Delta table.

    A Delta table is a directory with a ``_delta_log`` or an object-store URI; read with polars.

    Raises:
        TaskError: the source does not exist or is not readable as any of these.
    """
    text = str(source)
    if text == "-":
        yield from _jsonl(stdin or sys.stdin, "line")
        return
    path = Path(text)
    if "://" in text or (path / "_delta_log").is_dir():
        yield from _frame_rows(text, "delta", storage_options)
        return
    if not path.is_file():
        raise TaskError(f"{text}: no such file; give a JSONL or Parquet file, a Delta table, or - for stdin")
    if path.suffix == ".parquet":
        yield from _frame_rows(text, "parquet", storage_options)
        return
    with path.open() as handle:
        yield from _jsonl(handle, "line")


def _jsonl(handle: IO[str], unit: str) -> Iterator[Row]:
    for number, line in enumerate(handle, start=1):
        if not line.strip():
            continue
        try:
            fields = json.loads(line)
        except json.JSONDecodeError as exc:
            yield f"{unit} {number}", TaskError(f"not JSON: {exc}")
            continue
        if not isinstance(fields, dict):
            yield f"{unit} {number}", TaskError(f"not a JSON object but {type(fields).__name__}")
            continue
        yield f"{unit} {number}", fields


def _frame_rows(source: str, kind: str, storage_options: Mapping[str, str] | None) -> Iterator[Row]:
    import polars as pl

    try:
        if kind == "delta":
            frame = pl.read_delta(source, storage_options=dict(storage_options or {}) or None)
        else:
            frame = pl.read_parquet(source)
    except Exception as exc:
        raise TaskError(f"{source}: cannot read it as {kind}: {exc}") from exc
    for number, row in enumerate(frame.iter_rows(named=True), start=1):
        yield f"row {number}", row


def _plain(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value
