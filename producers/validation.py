"""Checks a trajectory before it is sent, so a bad one fails at the worker's call site.

The processors check again (a producer may be old or foreign); these are the rules a rollout
worker can fix on the spot: packed buffer sizes, one logprob per response token, a non-empty
response, a non-negative policy_version, a task type some verifier judges, a known domain, and
for a sample from a task: its attempt (>= 1 with a task_id, 0 without), one loss mask byte (0 or
1) per response token, version spans covering the response in order. Cheap: sizes, lookups and
one C-level pass over a mask, no unpacking.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any

from producers.exceptions import InvalidTrajectoryError
from producers.tasks import TASK_TYPES

DomainCheck = Collection[str] | Callable[[str], bool]
"""Known domains: a collection of names, or a predicate (e.g. a registry lookup)."""

KNOWN_TASK_TYPES: frozenset[str] = frozenset(TASK_TYPES)
_REQUIRED = ("trajectory_id", "group_id", "sample_index", "group_size", "domain", "task_type")
_PACKED = ("prompt_tokens", "response_tokens", "response_logprobs")


class TrajectoryValidator:
    """Refuses records that break the contract's invariants; `check` raises InvalidTrajectoryError.

    Args:
        known_domains: the domain names to accept (a collection, or a predicate such as a domain
            registry's membership test); None accepts any non-empty domain.
        task_types: the task types a verifier exists for (default math, code, extraction,
            precomputed).
    """

    def __init__(
        self, *, known_domains: DomainCheck | None = None, task_types: Collection[str] = KNOWN_TASK_TYPES
    ) -> None:
        self._task_types = frozenset(task_types)
        self._domain_ok: Callable[[str], bool] | None
        if known_domains is None or callable(known_domains):
            self._domain_ok = known_domains
        else:
            names = frozenset(known_domains)
            self._domain_ok = names.__contains__

    def check(self, record: Mapping[str, Any]) -> None:
        """Raise InvalidTrajectoryError naming the first broken rule; return None when all hold."""
        try:
            tokens, logprobs = record["response_tokens"], record["response_logprobs"]
            tid, version = record["trajectory_id"], record["policy_version"]
            size, index, domain = record["group_size"], record["sample_index"], record["domain"]
            fine = (
                type(tid) is str
                and type(record["group_id"]) is str
                and type(domain) is str
                and type(tokens) is bytes
                and type(logprobs) is bytes
                and type(record["prompt_tokens"]) is bytes
                and type(version) is int
                and type(size) is int
                and type(index) is int
                and len(tokens) == len(logprobs) > 0
                and not len(tokens) % 4
                and not len(record["prompt_tokens"]) % 4
                and version >= 0
                and 0 <= index < size
                and record["task_type"] in self._task_types
                and bool(tid.strip() and record["group_id"].strip() and domain.strip())
                and (self._domain_ok is None or self._domain_ok(domain))
                and _task_fields_ok(record, len(tokens) // 4)
            )
        except (KeyError, TypeError):
            fine = False
        if not fine:  # the common case is a valid record: name what is wrong only when something is
            self._explain(record)

    def _explain(self, record: Mapping[str, Any]) -> None:
        """Check rule by rule and raise for the first one broken (the slow path of `check`)."""
        if not isinstance(record, Mapping):
            raise InvalidTrajectoryError(
                f"a trajectory must be a mapping of fields, got {type(record).__name__}",
                trajectory_id="?",
                field="record",
            )
        tid = str(record.get("trajectory_id", "?"))

        def fail(field: str, problem: str) -> InvalidTrajectoryError:
            return InvalidTrajectoryError(
                f"trajectory {tid!r}: {problem}; it was not sent", trajectory_id=tid, field=field
            )

        missing = [f for f in (*_REQUIRED, *_PACKED, "policy_version") if f not in record]
        if missing:
            raise fail(missing[0], f"missing field(s) {missing}: see schemas/avro/trajectory.avsc")
        for field in ("trajectory_id", "group_id", "domain"):
            if not isinstance(record[field], str) or not record[field].strip():
                raise fail(field, f"{field}={record[field]!r} must be a non-empty string")
        for field in _PACKED:
            value = record[field]
            if not isinstance(value, bytes | bytearray | memoryview):
                raise fail(field, f"{field} is {type(value).__name__}, not packed bytes (schemas.pack_int32)")
            if len(value) % 4:
                raise fail(
                    field, f"{field} has {len(value)} bytes, not a multiple of 4 (packed 4-byte elements)"
                )
        tokens, logprobs = len(record["response_tokens"]) // 4, len(record["response_logprobs"]) // 4
        if tokens == 0:
            raise fail("response_tokens", "the response is empty (0 tokens): publish only generated samples")
        if tokens != logprobs:
            raise fail(
                "response_logprobs",
                f"{logprobs} logprobs for {tokens} response tokens: send one logprob per response token",
            )
        version = record["policy_version"]
        if not isinstance(version, int) or isinstance(version, bool) or version < 0:
            raise fail("policy_version", f"policy_version={version!r} must be an integer >= 0")
        size, index = record["group_size"], record["sample_index"]
        if not isinstance(size, int) or size < 1:
            raise fail("group_size", f"group_size={size!r} must be an integer >= 1")
        if not isinstance(index, int) or not 0 <= index < size:
            raise fail("sample_index", f"sample_index={index!r} is outside [0, group_size={size})")
        if record["task_type"] not in self._task_types:
            raise fail(
                "task_type",
                f"unknown task_type={record['task_type']!r}; known: {sorted(self._task_types)}",
            )
        if self._domain_ok is not None and not self._domain_ok(record["domain"]):
            raise fail(
                "domain",
                f"unknown domain={record['domain']!r}: register it in the domain registry or fix the name",
            )
        problem = _task_fields_problem(record, tokens)
        if problem is not None:
            raise fail(*problem)


def _task_fields_ok(record: Mapping[str, Any], tokens: int) -> bool:
    """The fast path of `_task_fields_problem`: True when the task fields hold (the common case)."""
    task_id, attempt = record.get("task_id"), record.get("attempt", 0)
    mask, spans = record.get("loss_mask"), record.get("version_spans")
    return (
        type(attempt) is int
        and (
            attempt == 0
            if task_id is None
            else type(task_id) is str and attempt >= 1 and bool(task_id.strip())
        )
        and (mask is None or (type(mask) is bytes and len(mask) == tokens and not mask.strip(b"\x00\x01")))
        and (spans is None or _spans_problem(spans, tokens) is None)
    )


def _task_fields_problem(record: Mapping[str, Any], tokens: int) -> tuple[str, str] | None:
    """(field, problem) of the first broken rule of the task fields, or None."""
    task_id, attempt = record.get("task_id"), record.get("attempt", 0)
    if not isinstance(attempt, int) or isinstance(attempt, bool) or attempt < 0:
        return (
            "attempt",
            f"attempt={attempt!r} must be an integer >= 0 (0: not from a task; 1: first delivery)",
        )
    if task_id is None and attempt:
        return "attempt", f"attempt={attempt} without a task_id: set the task's id, or attempt 0"
    if task_id is not None and (not isinstance(task_id, str) or not task_id.strip()):
        return "task_id", f"task_id={task_id!r} must be a non-empty string, or None when not from a task"
    if task_id is not None and attempt == 0:
        return "attempt", (
            f"task_id={task_id!r} with attempt=0: pass the task's delivery count (1 on the first "
            "delivery) as attempt"
        )
    mask = record.get("loss_mask")
    if mask is not None:
        if not isinstance(mask, bytes):
            return "loss_mask", f"loss_mask is {type(mask).__name__}, not packed bytes (schemas.pack_mask)"
        if len(mask) != tokens:
            return "loss_mask", (
                f"{len(mask)} loss mask bytes for {tokens} response tokens: one byte per response "
                "token (schemas.pack_mask), or None to train on every token"
            )
        if mask.strip(b"\x00\x01"):
            index = next(i for i, b in enumerate(mask) if b > 1)
            return "loss_mask", f"loss_mask[{index}]={mask[index]} is neither 0 nor 1 (schemas.pack_mask)"
    spans = record.get("version_spans")
    problem = None if spans is None else _spans_problem(spans, tokens)
    return None if problem is None else ("version_spans", problem)


def _spans_problem(spans: Any, tokens: int) -> str | None:
    """What is wrong with `version_spans` for a response of `tokens` tokens, or None."""
    if not isinstance(spans, list | tuple):
        return f"version_spans is {type(spans).__name__}, not a list of {{start, end, version}}"
    end = 0
    for i, span in enumerate(spans):
        try:
            start, stop, version = span["start"], span["end"], span["version"]
        except (KeyError, TypeError):
            return f"version_spans[{i}]={span!r} is not a {{start, end, version}} mapping"
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (start, stop, version)):
            return f"version_spans[{i}]={span!r} must hold integers"
        if start != end:
            kind = "a gap" if start > end else "an overlap"
            return f"version_spans[{i}] starts at {start}, not at {end} ({kind}): spans cover [0, {tokens}) in order"
        if stop <= start:
            return f"version_spans[{i}]=[{start}, {stop}) is empty: each span covers at least one token"
        end = stop
    if end != tokens:
        return (
            f"version_spans end at {end}, not at the response's {tokens} tokens: they must cover "
            f"[0, {tokens}); pass None when one policy version made the whole response"
        )
    return None
