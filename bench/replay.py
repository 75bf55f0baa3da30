"""Tokens per second delivered as torch batches: our replay buffer against TorchRL's ReplayBuffer.

Both start from the same rows in a fresh trajectories Delta table (lengths drawn from the shipped
inference profile, policy versions 0..7 across appends) and both timings include loading.
Ours: `ReplayBuffer` tailing the table (files read in its background thread), staleness-aware
(max lag 8, freshness weight halving per version of lag), token-budget padded batches.
Baseline: TorchRL 0.14.1 `TensorDictReplayBuffer` with `LazyTensorStorage` and
`StalenessAwareSampler(max_staleness=8)` (weight 1 / (lag + 1)), loaded from the same table
with polars into padded (rows x max_length) tensors by the same vectorized gather ours uses, sampling batches of `--batch-rows` rows,
each trimmed to its longest row as a collate would. Both deliver input_ids, attention and
response masks and old logprobs until `--passes` x the table's tokens went out.
ratio = ours / TorchRL real (non-padding) tokens per second. padding_waste is the share of
padding in our batches; random_padding_waste the same for TorchRL's random batches.

    python bench/replay.py [--rows 4000] [--max-length 4096] [--token-budget 65536]
                           [--batch-rows 16] [--passes 2] [--json]
"""

from __future__ import annotations

import argparse
import gc
import json
import tempfile
import time
from datetime import UTC, datetime

import numpy as np
import polars as pl
import pyarrow as pa
import torch
from deltalake import write_deltalake

from consumers import ReplayBuffer, ReplayConfig, TrajectoryColumns
from schemas.profile import load_profile
from schemas.tables import TRAJECTORIES_SCHEMA

APPENDS = 8
MAX_LAG = 8


def build_table(uri: str, rows: int, seed: int) -> int:
    """Write `rows` rows in APPENDS versions; returns their total prompt + response tokens."""
    profile = load_profile()
    rng = np.random.default_rng(seed)
    now = datetime(2026, 1, 1, tzinfo=UTC)
    total_tokens = 0
    per_append = rows // APPENDS
    for k in range(APPENDS):
        sizes = [profile.sample_length(rng) for _ in range(per_append)]
        prompt = np.asarray([s.prompt_tokens for s in sizes])
        response = np.asarray([s.response_tokens for s in sizes])
        total_tokens += int(prompt.sum() + response.sum())
        ids = np.arange(k * per_append, (k + 1) * per_append)

        def ragged(lengths: np.ndarray, values: np.ndarray) -> pa.Array:
            offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
            np.cumsum(lengths, out=offsets[1:])
            return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))

        n = per_append
        columns = {
            name: pa.nulls(n, type=TRAJECTORIES_SCHEMA.field(name).type) for name in TRAJECTORIES_SCHEMA.names
        }
        columns.update(
            trajectory_id=pa.array([f"t{i:08d}" for i in ids]),
            domain=pa.array(np.asarray(["math/algebra", "code/python", "extraction/invoice"])[ids % 3]),
            task_type=pa.array(np.asarray(["math", "code", "extraction"])[ids % 3]),
            policy_version=pa.array(np.full(n, k, dtype=np.int64)),
            prompt_tokens=ragged(prompt, rng.integers(0, 32_768, int(prompt.sum()), dtype=np.int32)),
            response_tokens=ragged(response, rng.integers(0, 32_768, int(response.sum()), dtype=np.int32)),
            response_logprobs=ragged(response, -rng.random(int(response.sum()), dtype=np.float32)),
            reward=pa.array(rng.random(n)),
            verifier_status=pa.array(np.where(ids % 2 == 0, "ok", "fail")),
            advantage=pa.array(rng.normal(size=n)),
            length=pa.array((prompt + response).astype(np.int32)),
            bucket=pa.array(profile.bucket_names(prompt + response)),
            created_at=pa.array([now] * n, type=pa.timestamp("us", tz="UTC")),
        )
        write_deltalake(
            uri,
            pa.Table.from_pydict(columns, schema=TRAJECTORIES_SCHEMA),
            partition_by=["bucket"],
            mode="append",
        )
    return total_tokens


def run_ours(uri: str, *, max_length: int, token_budget: int, target_tokens: int) -> dict[str, float]:
    started = time.perf_counter()
    config = ReplayConfig(
        table_uri=uri,
        token_budget=token_budget,
        max_length=max_length,
        max_lag=MAX_LAG,
        half_life=1.0,
        profile_matched=False,
        capacity_rows=None,
    )
    delivered = slots = batches = 0
    first_batch_s = 0.0
    with ReplayBuffer(config) as buffer:
        while delivered < target_tokens:
            batch = buffer.sample(APPENDS - 1)
            first_batch_s = first_batch_s or time.perf_counter() - started
            delivered += int(batch["tokens"])
            slots += int(batch["attention_mask"].numel())
            batches += 1
    seconds = time.perf_counter() - started
    return {
        "seconds": seconds,
        "tokens": delivered,
        "batches": batches,
        "waste": 1 - delivered / slots,
        "first_batch_s": first_batch_s,
    }


def run_torchrl(uri: str, *, max_length: int, batch_rows: int, target_tokens: int) -> dict[str, float]:
    from tensordict import TensorDict
    from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
    from torchrl.data.replay_buffers.samplers import StalenessAwareSampler

    started = time.perf_counter()
    frame = pl.read_delta(
        uri,
        columns=[
            "prompt_tokens",
            "response_tokens",
            "response_logprobs",
            "policy_version",
            "verifier_status",
            "advantage",
        ],
    ).filter(pl.col("verifier_status").is_in(["ok", "fail"]))
    n = frame.height
    columns = TrajectoryColumns.from_frame(
        frame.with_columns(pl.lit(0.0).alias("reward"), pl.lit("").alias("trajectory_id"))
    )
    padded = columns.batch(np.arange(n, dtype=np.int64), max_length)  # the same vectorized gather ours uses
    width = padded["input_ids"].shape[1]
    pad = max_length - width  # storage rows are max_length wide, as a fixed-shape storage needs
    input_ids = torch.nn.functional.pad(padded["input_ids"], (0, pad))
    old_logprobs = torch.nn.functional.pad(padded["old_logprobs"], (0, pad))
    attention = torch.nn.functional.pad(padded["attention_mask"], (0, pad))
    response = torch.nn.functional.pad(padded["response_mask"], (0, pad))
    lengths = attention.sum(dim=1)
    data = TensorDict(
        {
            "input_ids": input_ids,
            "old_logprobs": old_logprobs,
            "attention_mask": attention,
            "response_mask": response,
            "length": lengths,
            "advantage": torch.from_numpy(frame["advantage"].to_numpy().astype(np.float32)),
            "policy_version": torch.from_numpy(frame["policy_version"].to_numpy()),
        },
        batch_size=[n],
    )
    sampler = StalenessAwareSampler(max_staleness=MAX_LAG)
    buffer = TensorDictReplayBuffer(storage=LazyTensorStorage(n), sampler=sampler, batch_size=batch_rows)
    buffer.extend(data)
    sampler.consumer_version = APPENDS - 1
    loaded_s = time.perf_counter() - started
    delivered = slots = batches = 0
    while delivered < target_tokens:
        sample = buffer.sample()
        width = int(sample["length"].max())
        batch = {
            k: sample[k][:, :width] for k in ("input_ids", "old_logprobs", "attention_mask", "response_mask")
        }
        real = int(batch["attention_mask"].sum())
        delivered += real
        slots += batch["attention_mask"].numel()
        batches += 1
    seconds = time.perf_counter() - started
    return {
        "seconds": seconds,
        "tokens": delivered,
        "batches": batches,
        "waste": 1 - delivered / slots,
        "loaded_s": loaded_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=4000)
    parser.add_argument("--max-length", type=int, default=4096)
    parser.add_argument("--token-budget", type=int, default=65_536)
    parser.add_argument("--batch-rows", type=int, default=16)
    parser.add_argument(
        "--passes", type=float, default=2.0, help="deliver this many times the table's tokens"
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-replay-") as tmp:
        uri = f"{tmp}/trajectories"
        table_tokens = build_table(uri, args.rows, args.seed)
        target = int(args.passes * table_tokens / 2)  # half the rows are ok/fail-trainable; all are here
        theirs = run_torchrl(
            uri, max_length=args.max_length, batch_rows=args.batch_rows, target_tokens=target
        )
        gc.collect()
        ours = run_ours(uri, max_length=args.max_length, token_budget=args.token_budget, target_tokens=target)
        gc.collect()
    ours_rate = ours["tokens"] / ours["seconds"]
    theirs_rate = theirs["tokens"] / theirs["seconds"]
    result = {
        "ratio": round(ours_rate / theirs_rate, 2),
        "ours_tokens_per_s": round(ours_rate),
        "torchrl_tokens_per_s": round(theirs_rate),
        "ours_seconds": round(ours["seconds"], 2),
        "torchrl_seconds": round(theirs["seconds"], 2),
        "tokens_delivered": int(ours["tokens"]),
        "ours_first_batch_s": round(ours["first_batch_s"], 2),
        "torchrl_load_s": round(theirs["loaded_s"], 2),
        "ours_batches": int(ours["batches"]),
        "torchrl_batches": int(theirs["batches"]),
        "padding_waste": round(ours["waste"], 4),
        "random_padding_waste": round(theirs["waste"], 4),
        "rows": args.rows,
        "table_tokens": table_tokens,
        "max_length": args.max_length,
        "token_budget": args.token_budget,
        "batch_rows": args.batch_rows,
    }
    if not args.json:
        print(
            f"ours {ours_rate:,.0f} tokens/s ({ours['seconds']:.1f} s), TorchRL {theirs_rate:,.0f} tokens/s "
            f"({theirs['seconds']:.1f} s): ratio {result['ratio']}; padding waste {ours['waste']:.3f} "
            f"(random batches of {args.batch_rows}: {theirs['waste']:.3f})"
        )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
