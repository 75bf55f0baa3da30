"""Semantic checks on a decoded trajectory, the rules Avro cannot express.

Each failure raises a specific `InvalidRecordError` naming the field and its value, so the dead
letter's reason tells the producer exactly what to fix (schemas/WIRE_FORMAT.md states the rules).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from schemas import DecodeError, unpack_float32, unpack_int32
from schemas.packing import FLOAT32, INT32
from stream_processors.exceptions import (
    AttemptError,
    EmptyIdError,
    GroupIndexError,
    LengthMismatchError,
    LossMaskError,
    NonFiniteValueError,
    PackedBufferError,
    TokenIdError,
    VersionSpanError,
)

MAX_TOKEN_ID = 2**24
"""Token ids must lie in [0, MAX_TOKEN_ID): 16,777,216 is far above any vocabulary in use, and a
learner sizes its embedding by the largest id it sees (schemas/WIRE_FORMAT.md, Fields)."""


@dataclass(frozen=True, slots=True)
class TokenArrays:
    """The packed sequences of one trajectory, viewed as numpy arrays without a copy.

    `loss_mask` holds one byte per response token (1 trained on, 0 not), or None when every
    response token is trained on.
    """

    prompt_tokens: npt.NDArray[np.int32]
    response_tokens: npt.NDArray[np.int32]
    response_logprobs: npt.NDArray[np.float32]
    loss_mask: npt.NDArray[np.uint8] | None = None

    @property
    def length(self) -> int:
        """Prompt plus response tokens: what the bucket is chosen by."""
        return len(self.prompt_tokens) + len(self.response_tokens)


def _unpack_int32(record: Mapping[str, Any], field: str) -> npt.NDArray[np.int32]:
    try:
        return unpack_int32(record[field])
    except DecodeError as exc:
        raise PackedBufferError(f"{field}: {exc}") from exc


def _ids_in_range(tokens: npt.NDArray[np.int32]) -> bool:
    """Every id in [0, MAX_TOKEN_ID), in one reduction: as uint32, a negative id wraps above 2**31."""
    return not len(tokens) or int(tokens.view(np.uint32).max()) < MAX_TOKEN_ID


def _all_finite(values: npt.NDArray[np.float32]) -> bool:
    """No NaN or inf, in one reduction: they survive a float64 sum, which float32 values cannot overflow."""
    return not len(values) or math.isfinite(float(values.sum(dtype=np.float64)))


def _bits_ok(mask: npt.NDArray[np.uint8]) -> bool:
    """Every mask byte is 0 or 1, in one reduction."""
    return not len(mask) or int(mask.max()) <= 1


def _check_token_ids(tokens: npt.NDArray[np.int32], field: str) -> None:
    if _ids_in_range(tokens):
        return
    bad = (tokens < 0) | (tokens >= MAX_TOKEN_ID)
    if bad.any():
        index = int(np.flatnonzero(bad)[0])
        raise TokenIdError(
            f"{field}[{index}]={int(tokens[index])} is outside [0, {MAX_TOKEN_ID}) "
            f"({int(bad.sum())} of {len(tokens)} are): send the tokenizer's ids"
        )


def values_ok(batch: Sequence[TokenArrays]) -> bool:
    """Whether every token id of `batch` is in range, every logprob finite and every loss mask byte
    0 or 1, in one reduction each.

    The per-record checks of `validate` cost a few numpy calls per record, and each call may
    release the GIL and wait a switch interval to get it back while the sink thread runs: checked
    once per batch instead (`validate(record, values=False)` first), with per-record checks only
    for a batch that fails.
    """
    if not batch:
        return True
    ids = _joined([a for t in batch for a in (t.prompt_tokens, t.response_tokens)], INT32)
    masks = [t.loss_mask for t in batch if t.loss_mask is not None]
    return (
        _ids_in_range(ids)
        and _all_finite(_joined([t.response_logprobs for t in batch], FLOAT32))
        and (not masks or _bits_ok(_joined(masks, np.dtype(np.uint8))))
    )


def _joined(arrays: Sequence[npt.NDArray[Any]], dtype: np.dtype[Any]) -> npt.NDArray[Any]:
    """The arrays concatenated: views of packed buffers (as `validate` makes them) by joining their
    bytes, which costs less than numpy's concatenation of many small arrays; others by numpy."""
    try:
        return np.frombuffer(b"".join(arrays), dtype)  # type: ignore[arg-type]  # arrays are bytes-like
    except TypeError:  # not contiguous
        return np.concatenate(arrays).astype(dtype, copy=False)


def _check_attempt(record: Mapping[str, Any]) -> None:
    """task_id and attempt agree: no task and attempt 0, or a task and its delivery count (>= 1)."""
    task_id, attempt = record.get("task_id"), record.get("attempt", 0)
    if attempt < 0:
        raise AttemptError(f"attempt={attempt} must be >= 0 (0: not from a task; 1: a task's first delivery)")
    if task_id is None:
        if attempt:
            raise AttemptError(
                f"attempt={attempt} without a task_id: send the task's id, or attempt 0 for a sample "
                "not from a task"
            )
        return
    if not str(task_id).strip():
        raise EmptyIdError(f"task_id={task_id!r} is empty: send the task's id, or null when not from a task")
    if attempt == 0:
        raise AttemptError(
            f"task_id={task_id!r} with attempt=0: a task's deliveries count from 1; send the "
            "delivery count as attempt (or task_id null when the sample is not from a task)"
        )


def _check_loss_mask(record: Mapping[str, Any], count: int, *, values: bool) -> npt.NDArray[np.uint8] | None:
    """The loss mask as a uint8 view (no copy), None when absent; one byte per response token."""
    packed = record.get("loss_mask")
    if packed is None:
        return None
    mask = np.frombuffer(packed, dtype=np.uint8)
    if len(mask) != count:
        raise LengthMismatchError(
            f"len(loss_mask)={len(mask)} != len(response_tokens)={count}: send one mask byte per "
            "response token (schemas.pack_mask), or null to train on every token"
        )
    if values and not _bits_ok(mask):
        bad = mask > 1
        index = int(np.flatnonzero(bad)[0])
        raise LossMaskError(
            f"loss_mask[{index}]={int(mask[index])} is neither 0 nor 1 ({int(bad.sum())} of {count} "
            "are not): 1 trains on the token, 0 masks it out (schemas.pack_mask)"
        )
    return mask


def _check_version_spans(spans: Sequence[Mapping[str, Any]] | None, count: int) -> None:
    """The spans cover response tokens [0, count) in order, each non-empty, without gaps or overlap."""
    if spans is None:
        return
    end = 0
    for i, span in enumerate(spans):
        start, stop = span["start"], span["end"]
        if start != end:
            kind = "a gap" if start > end else "an overlap"
            raise VersionSpanError(
                f"version_spans[{i}] starts at {start}, not at {end} ({kind}): spans must cover the "
                f"response tokens [0, {count}) in order"
            )
        if stop <= start:
            raise VersionSpanError(
                f"version_spans[{i}]=[{start}, {stop}) is empty: each span covers at least one token"
            )
        end = stop
    if end != count:
        raise VersionSpanError(
            f"version_spans end at {end}, not at len(response_tokens)={count}: they must cover [0, "
            f"{count}); send null when one policy version made the whole response"
        )


def validate(record: Mapping[str, Any], *, values: bool = True) -> TokenArrays:
    """Check one decoded record and return its token arrays; raises InvalidRecordError subclasses.

    `values=False` skips the token id range, logprob finiteness and mask byte checks, for a
    caller that runs `values_ok` over its whole batch.
    """
    for field in ("trajectory_id", "group_id"):
        if not str(record[field]).strip():
            raise EmptyIdError(f"{field}={record[field]!r} is empty: every trajectory needs one")
    group_size, sample_index = record["group_size"], record["sample_index"]
    if group_size < 1:
        raise GroupIndexError(f"group_size={group_size} must be >= 1")
    if not 0 <= sample_index < group_size:
        raise GroupIndexError(f"sample_index={sample_index} is outside [0, group_size={group_size})")
    if record.get("task_id") is not None or record.get("attempt", 0):
        _check_attempt(record)
    packed = record["prompt_tokens"], record["response_tokens"], record["response_logprobs"]
    if values or any(len(b) % 4 for b in packed):  # the checks in order, each with its error
        prompt = _unpack_int32(record, "prompt_tokens")
        response = _unpack_int32(record, "response_tokens")
        if values:
            _check_token_ids(prompt, "prompt_tokens")
            _check_token_ids(response, "response_tokens")
        try:
            logprobs = unpack_float32(record["response_logprobs"])
        except DecodeError as exc:
            raise PackedBufferError(f"response_logprobs: {exc}") from exc
    else:  # every buffer a whole number of elements: views without a per-field call
        prompt = np.frombuffer(packed[0], INT32)
        response = np.frombuffer(packed[1], INT32)
        logprobs = np.frombuffer(packed[2], FLOAT32)
    if len(logprobs) != len(response):
        raise LengthMismatchError(
            f"len(response_logprobs)={len(logprobs)} != len(response_tokens)={len(response)}: "
            "send one logprob per response token"
        )
    if values and not _all_finite(logprobs):
        finite = np.isfinite(logprobs)
        bad = int(np.flatnonzero(~finite)[0])
        raise NonFiniteValueError(
            f"response_logprobs[{bad}]={float(logprobs[bad])!r} is not finite "
            f"({int((~finite).sum())} of {len(logprobs)} are not): logprobs must be real numbers"
        )
    mask = _check_loss_mask(record, len(response), values=values)
    spans = record.get("version_spans")
    if spans is not None:
        _check_version_spans(spans, len(response))
    reward = record.get("precomputed_reward")
    if reward is not None and not math.isfinite(reward):
        raise NonFiniteValueError(f"precomputed_reward={reward!r} is not finite: send a real number or null")
    return TokenArrays(prompt, response, logprobs, mask)
