"""The task record: what a scheduler submits and a rollout worker takes, and its wire codec.

A task is one prompt (token ids, or text with the tokenizer it is meant for), the verifier's
inputs, the group size, the sampling parameters, a priority class and a deadline per attempt.
On Kafka it is Avro single-object encoded like a trajectory (``schemas/avro/task.avsc``,
WIRE_FORMAT.md); `Task` checks every field when it is built, so a decoded task is a valid one.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import MISSING, asdict, dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import numpy as np
import numpy.typing as npt

from schemas.codec import AVRO_DIR, RecordCodec, SchemaLike
from schemas.exceptions import RollstreamError
from schemas.packing import unpack_int32

TASK_SCHEMA_PATH = AVRO_DIR / "task.avsc"
TASK_RECORD = "dev.rollstream.Task"
PRIORITIES: Mapping[int, str] = {0: "low", 1: "high"}
"""Priority classes by number; a higher number is served first (docs/rollout.md, Tasks)."""
VERIFIER_INPUTS: Mapping[str, str] = {
    "math": "expected_answer",
    "code": "unit_tests",
    "extraction": "gold_fields",
}
"""The field each verified task type needs; other task types need none."""
MAX_GROUP_SIZE = 4096


class TaskError(RollstreamError, ValueError):
    """A task field is missing, of the wrong type or out of range; the message names it."""


@dataclass(frozen=True)
class Task:
    """One task, checked when built.

    Attributes: as ``schemas/avro/task.avsc`` documents them. `created_at` is kept in UTC at
    millisecond precision (an int is taken as epoch milliseconds).

    Raises:
        TaskError: a field is invalid; the message names the task, the field and the fix.
    """

    task_id: str
    domain: str
    task_type: str
    group_size: int
    max_tokens: int
    deadline_ms: int
    created_at: datetime
    prompt_tokens: bytes = b""
    prompt_text: str | None = None
    tokenizer: str | None = None
    expected_answer: str | None = None
    unit_tests: str | None = None
    gold_fields: Mapping[str, str] | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    seed: int | None = None
    priority: int = 0
    prior_attempts: int = 0
    metadata: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._check_names()
        self._check_prompt()
        self._check_sampling()
        self._check_queueing()
        object.__setattr__(self, "created_at", _utc_millis(self.created_at, self.task_id))

    @property
    def prompt_ids(self) -> npt.NDArray[np.int32]:
        """The prompt token ids as a read-only int32 array (empty for a text prompt)."""
        return unpack_int32(self.prompt_tokens)

    @property
    def priority_name(self) -> str:
        """The priority class's name: 'low' or 'high'."""
        return PRIORITIES[self.priority]

    def as_dict(self) -> dict[str, Any]:
        """The fields by name, as the Avro record the codec writes."""
        out = asdict(self)
        out["gold_fields"] = None if self.gold_fields is None else dict(self.gold_fields)
        out["metadata"] = dict(self.metadata)
        return out

    def with_prior_attempts(self, prior_attempts: int) -> Task:
        """A copy carrying `prior_attempts` (a requeued task)."""
        return replace(self, prior_attempts=prior_attempts)

    @classmethod
    def from_dict(cls, fields: Mapping[str, Any]) -> Task:
        """The task from a decoded record or a plain mapping; keys that are not fields are refused.

        Raises:
            TaskError: a required field is missing, a key is unknown, or a value is invalid.
        """
        names = set(cls.__dataclass_fields__)
        unknown = sorted(set(fields) - names)
        if unknown:
            raise TaskError(
                f"task {fields.get('task_id', '?')!r}: unknown field(s) {unknown}; fields are {sorted(names)}"
            )
        required = [
            n for n, f in cls.__dataclass_fields__.items() if f.default is MISSING is f.default_factory
        ]
        missing = [name for name in required if fields.get(name) is None]
        if missing:
            raise TaskError(f"task {fields.get('task_id', '?')!r}: missing required field(s) {missing}")
        return cls(**dict(fields))

    def _fail(self, message: str) -> TaskError:
        return TaskError(f"task {self.task_id!r}: {message}")

    def _check_names(self) -> None:
        if not isinstance(self.task_id, str) or not self.task_id.strip():
            raise TaskError(f"task_id = {self.task_id!r}; give a non-empty string (a UUID, say)")
        for name in ("domain", "task_type"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip():
                raise self._fail(f"{name} = {value!r}; give a non-empty string")
        needed = VERIFIER_INPUTS.get(self.task_type)
        value = getattr(self, needed) if needed else None
        if needed and (value is None or (needed == "gold_fields" and not value)):
            raise self._fail(f"task_type {self.task_type!r} is verified against {needed}, which is missing")
        if self.gold_fields is not None and not _strings(self.gold_fields):
            raise self._fail("gold_fields must map field names (strings) to gold values (strings)")
        for name in ("expected_answer", "unit_tests"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), str):
                raise self._fail(f"{name} must be a string or null")
        if not _strings(self.metadata):
            raise self._fail("metadata must map strings to strings")

    def _check_prompt(self) -> None:
        tokens, text = self.prompt_tokens, self.prompt_text
        if not isinstance(tokens, bytes):
            raise self._fail(
                f"prompt_tokens is {type(tokens).__name__}; give packed int32 bytes (pack_int32)"
            )
        if bool(tokens) == (text is not None):
            raise self._fail(
                "give exactly one prompt: prompt_tokens (token ids) or prompt_text with a tokenizer"
            )
        if text is not None:
            if not isinstance(text, str) or not text:
                raise self._fail("prompt_text is empty; give the prompt or use prompt_tokens")
            if not isinstance(self.tokenizer, str) or not self.tokenizer:
                raise self._fail("prompt_text needs tokenizer: the name of the tokenizer it is meant for")
            return
        if len(tokens) % 4:
            raise self._fail(f"prompt_tokens has {len(tokens)} bytes, not a multiple of 4 (packed int32)")
        ids = unpack_int32(tokens)
        if int(ids.min()) < 0:
            raise self._fail(
                f"prompt_tokens holds a negative id {int(ids.min())} at index {int(ids.argmin())}"
            )

    def _check_sampling(self) -> None:
        if not _integer(self.group_size) or not 1 <= self.group_size <= MAX_GROUP_SIZE:
            raise self._fail(f"group_size = {self.group_size!r}; give 1 to {MAX_GROUP_SIZE} samples")
        if not _integer(self.max_tokens) or self.max_tokens < 1:
            raise self._fail(f"max_tokens = {self.max_tokens!r}; give a positive token count")
        if not _real(self.temperature) or self.temperature < 0:
            raise self._fail(f"temperature = {self.temperature!r}; give a finite number >= 0")
        if not _real(self.top_p) or not 0 < self.top_p <= 1:
            raise self._fail(f"top_p = {self.top_p!r}; give a number in (0, 1] (1 is no truncation)")
        if self.top_k is not None and (not _integer(self.top_k) or self.top_k < 1):
            raise self._fail(f"top_k = {self.top_k!r}; give a positive k, or null for no top-k")
        if self.seed is not None and not _integer(self.seed):
            raise self._fail(f"seed = {self.seed!r}; give an integer or null")

    def _check_queueing(self) -> None:
        if not _integer(self.priority) or self.priority not in PRIORITIES:
            names = ", ".join(f"{n} ({name})" for n, name in PRIORITIES.items())
            raise self._fail(f"priority = {self.priority!r}; give one of {names}")
        if not _integer(self.deadline_ms) or self.deadline_ms < 1:
            raise self._fail(
                f"deadline_ms = {self.deadline_ms!r}; give the milliseconds one attempt may take"
            )
        if not _integer(self.prior_attempts) or self.prior_attempts < 0:
            raise self._fail(f"prior_attempts = {self.prior_attempts!r}; give an integer >= 0")


class TaskCodec(RecordCodec):
    """Avro single-object encoding of `Task`, resolving any known writer schema to the shipped one.

    Args:
        writer_schemas: further Task schemas whose messages may arrive; every .avsc under
            ``schemas/avro/`` naming ``dev.rollstream.Task`` is known too.
    """

    def __init__(self, *, writer_schemas: Iterable[SchemaLike] = ()) -> None:
        super().__init__(TASK_SCHEMA_PATH, writer_schemas=writer_schemas)

    def encode(self, task: Task) -> bytes:
        """One message: marker, fingerprint, Avro body."""
        return self.encode_fields(task.as_dict(), f"task {task.task_id!r}")

    def decode(self, data: bytes) -> Task:
        """The task in one message.

        Raises:
            UnknownSchemaError: the message names a writer schema this codec does not know.
            DecodeError: the bytes are not a single-object message of a Task record.
            TaskError: the record decodes but a field is invalid.
        """
        return Task.from_dict(self.decode_fields(data))


def _utc_millis(value: Any, task_id: str) -> datetime:
    if isinstance(value, int) and not isinstance(value, bool):
        value = datetime.fromtimestamp(value / 1000, UTC)
    if not isinstance(value, datetime) or value.tzinfo is None:
        raise TaskError(
            f"task {task_id!r}: created_at = {value!r}; give a timezone-aware datetime or epoch milliseconds"
        )
    at = value.astimezone(UTC)
    return at.replace(microsecond=at.microsecond // 1000 * 1000)


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _real(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _strings(mapping: Any) -> bool:
    return isinstance(mapping, Mapping) and all(
        isinstance(k, str) and isinstance(v, str) for k, v in mapping.items()
    )
