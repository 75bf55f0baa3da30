"""The Python shape of a Trajectory record, as the codec reads and writes it."""

from __future__ import annotations

from datetime import datetime
from typing import TypedDict


class VersionSpan(TypedDict):
    """Response tokens [start, end) were produced by policy `version`."""

    start: int
    end: int
    version: int


class _Required(TypedDict):
    trajectory_id: str
    group_id: str
    sample_index: int
    group_size: int
    domain: str
    task_type: str
    policy_version: int
    prompt_tokens: bytes
    response_tokens: bytes
    response_logprobs: bytes
    finish_reason: str
    worker_id: str
    created_at: datetime | int


class TrajectoryRecord(_Required, total=False):
    """One trajectory; fields with a schema default may be left out when encoding."""

    response_text: str
    expected_answer: str | None
    unit_tests: str | None
    gold_fields: dict[str, str] | None
    precomputed_reward: float | None
    task_id: str | None
    attempt: int
    loss_mask: bytes | None
    version_spans: list[VersionSpan] | None
    logprob_mode: str | None
    metadata: dict[str, str]
