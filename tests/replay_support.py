"""Real trajectories tables for the replay-buffer tests: rows of the contract's schema, appended
by deltalake, optionally from a live writer process while a learner reads."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from deltalake import write_deltalake

from schemas.profile import load_profile
from schemas.tables import TRAJECTORIES_SCHEMA

STATUSES = ["ok", "fail", "ok", "error", "fail", "timeout", "skipped"]
PROFILE = load_profile()


def make_rows(
    count: int,
    *,
    first: int,
    seed: int,
    policy_version: int = 0,
    bucket_shares: tuple[float, float, float] = (0.5, 0.4, 0.1),
    lengths: tuple[int, int, int] = (24, 48, 96),
    vocab: int = 32_768,
    all_trainable: bool = False,
) -> list[dict[str, Any]]:
    """Rows of varied length per bucket (short/long/ultra_long by `bucket_shares`), every status.

    Lengths are small stand-ins (`lengths` gives each bucket's typical total) so tests stay fast;
    the bucket column carries the profile's names as the stream stage writes them.
    """
    rng = np.random.default_rng(seed)
    now = datetime(2026, 1, 1, tzinfo=UTC)
    names = PROFILE.names
    rows = []
    for i in range(first, first + count):
        b = int(rng.choice(3, p=np.asarray(bucket_shares) / sum(bucket_shares)))
        total = max(2, int(rng.integers(lengths[b] // 2, lengths[b] + lengths[b] // 2)))
        prompt_len = max(1, total // 3)
        prompt = rng.integers(0, vocab, prompt_len).tolist()
        response = rng.integers(0, vocab, total - prompt_len).tolist()
        status = "ok" if all_trainable and i % 2 else "fail" if all_trainable else STATUSES[i % len(STATUSES)]
        reward = 1.0 if status == "ok" else 0.0
        rows.append(
            {
                "trajectory_id": f"t{i:06d}",
                "group_id": f"g{i // 4}",
                "sample_index": i % 4,
                "group_size": 4,
                "domain": ["math/algebra", "code/python", "extraction/invoice"][i % 3],
                "task_type": ["math", "code", "extraction"][i % 3],
                "policy_version": policy_version,
                "prompt_tokens": prompt,
                "response_tokens": response,
                "response_logprobs": (-rng.random(len(response))).astype(np.float32).tolist(),
                "response_text": "42",
                "finish_reason": "stop",
                "worker_id": "w0",
                "created_at": now,
                "metadata": [("seed", str(seed))],
                "reward": reward,
                "reward_components": [("exact", reward)],
                "verifier": "exact_answer",
                "verifier_version": "1",
                "verifier_status": status,
                "domain_reward": reward - 0.5,
                "advantage": float(rng.normal()),
                "group_status": "complete",
                "length": total,
                "bucket": names[b],
                "profile_id": PROFILE.id,
                "ingested_at": now,
                "topic": "rollouts.raw",
                "partition": i % 2,
                "offset": i,
            }
        )
    return rows


def write_rows(uri: str, rows: list[dict[str, Any]]) -> None:
    """One append (one table version), partitioned by bucket as the sink writes it."""
    write_deltalake(
        uri, pa.Table.from_pylist(rows, schema=TRAJECTORIES_SCHEMA), partition_by=["bucket"], mode="append"
    )


def trainable(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows the learner may train on (ok / fail)."""
    return [r for r in rows if r["verifier_status"] in ("ok", "fail")]


def writer_process(
    uri: str, appends: int, rows_per_append: int, interval_s: float, first: int, versions_per_policy: int
) -> None:
    """Append `appends` versions, policy_version rising by one every `versions_per_policy` appends."""
    for k in range(appends):
        rows = make_rows(
            rows_per_append,
            first=first + k * rows_per_append,
            seed=1000 + k,
            policy_version=k // versions_per_policy,
        )
        write_rows(uri, rows)
        time.sleep(interval_s)


def table_path(tmp: Path) -> str:
    return str(tmp / "lake" / "trajectories")
