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


def fast_table(
    count: int,
    *,
    first: int,
    seed: int,
    policy_version: int = 0,
    mean_length: int = 512,
    vocab: int = 32_768,
) -> pa.Table:
    """`count` trainable rows built column-wise with numpy (fast enough for tables of millions of tokens).

    Lengths are lognormal around `mean_length`; buckets follow the shipped profile's edges
    scaled so that `mean_length` falls in its short bucket's middle.
    """
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(np.log(mean_length), 0.6, count).astype(np.int64), 4, 8 * mean_length)
    prompt = np.maximum(lengths // 4, 1)
    response = lengths - prompt
    scale = mean_length / 700
    names = PROFILE.bucket_names((lengths / scale).astype(np.int64))

    def ragged(sizes: np.ndarray, values: np.ndarray) -> pa.Array:
        offsets = np.zeros(len(sizes) + 1, dtype=np.int32)
        np.cumsum(sizes, out=offsets[1:])
        return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))

    ids = np.arange(first, first + count)
    statuses = np.where(ids % 2 == 0, "ok", "fail")
    now = datetime(2026, 1, 1, tzinfo=UTC)
    columns = {
        "trajectory_id": pa.array([f"t{i:07d}" for i in ids]),
        "group_id": pa.array([f"g{i // 4}" for i in ids]),
        "sample_index": pa.array((ids % 4).astype(np.int32)),
        "group_size": pa.array(np.full(count, 4, dtype=np.int32)),
        "domain": pa.array(np.asarray(["math/algebra", "code/python", "extraction/invoice"])[ids % 3]),
        "task_type": pa.array(np.asarray(["math", "code", "extraction"])[ids % 3]),
        "policy_version": pa.array(np.full(count, policy_version, dtype=np.int64)),
        "prompt_tokens": ragged(prompt, rng.integers(0, vocab, int(prompt.sum()), dtype=np.int32)),
        "response_tokens": ragged(response, rng.integers(0, vocab, int(response.sum()), dtype=np.int32)),
        "response_logprobs": ragged(response, -rng.random(int(response.sum()), dtype=np.float32)),
        "response_text": pa.array(["42"] * count),
        "finish_reason": pa.array(["stop"] * count),
        "worker_id": pa.array(["w0"] * count),
        "created_at": pa.array([now] * count, type=pa.timestamp("us", tz="UTC")),
        "metadata": pa.array([[]] * count, type=pa.map_(pa.string(), pa.string())),
        "reward": pa.array((statuses == "ok").astype(np.float64)),
        "reward_components": pa.array([[]] * count, type=pa.map_(pa.string(), pa.float64())),
        "verifier": pa.array(["exact_answer"] * count),
        "verifier_version": pa.array(["1"] * count),
        "verifier_status": pa.array(statuses),
        "domain_reward": pa.array(rng.normal(size=count)),
        "advantage": pa.array(rng.normal(size=count)),
        "group_status": pa.array(["complete"] * count),
        "length": pa.array(lengths.astype(np.int32)),
        "bucket": pa.array(names),
        "profile_id": pa.array([PROFILE.id] * count),
        "ingested_at": pa.array([now] * count, type=pa.timestamp("us", tz="UTC")),
        "topic": pa.array(["rollouts.raw"] * count),
        "partition": pa.array((ids % 2).astype(np.int32)),
        "offset": pa.array(ids.astype(np.int64)),
    }
    for name in TRAJECTORIES_SCHEMA.names[len(columns) :]:  # the task columns: not from a task
        columns[name] = pa.nulls(count, TRAJECTORIES_SCHEMA.field(name).type)
    return pa.Table.from_pydict(columns, schema=TRAJECTORIES_SCHEMA)


def append_fast(uri: str, table: pa.Table) -> None:
    """One append of a `fast_table`, partitioned by bucket."""
    write_deltalake(uri, table, partition_by=["bucket"], mode="append")


def fast_writer_process(
    uri: str, appends: int, rows_per_append: int, first: int, mean_length: int, interval_s: float
) -> None:
    """Append `appends` versions of `fast_table` rows (a live writer in its own process)."""
    for k in range(appends):
        append_fast(
            uri,
            fast_table(
                rows_per_append, first=first + k * rows_per_append, seed=7000 + k, mean_length=mean_length
            ),
        )
        time.sleep(interval_s)


def rank_main(rank: int, world: int, init_file: str, uri: str, out_file: str) -> None:
    """One torch.distributed rank (gloo): drain its shard of the table, gather every rank's row ids."""
    import json

    import torch
    import torch.distributed as dist

    from consumers import ReplayConfig, ReplayDataset

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        dataset = ReplayDataset(ReplayConfig(table_uri=uri, token_budget=400, max_length=64, max_uses=1))
        ids = [tid for batch in dataset for tid in batch["trajectory_ids"]]
        count = torch.tensor([len(ids)])
        dist.all_reduce(count)
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, {"rank": dataset.rank, "world": dataset.world_size, "ids": ids})
        if rank == 0:
            Path(out_file).write_text(json.dumps({"total": int(count.item()), "ranks": gathered}))
    finally:
        dist.destroy_process_group()
