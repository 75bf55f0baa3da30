"""Tokens per second delivered as padded torch batches: our replay buffer against TorchRL at its best.

All sides start from the same fresh trajectories Delta table (lengths drawn from the shipped
inference profile, policy versions 0..7 across appends), load it inside their window, and deliver
the same padded layout (input_ids, attention and response masks, old logprobs, advantages; rows
cut to `--max-length` keeping the prompt's tail and the response's head) until the table's tokens
went out, at learner version 7 with a hard staleness limit of 8 and a freshness weight halving per
version of lag. Every side fills the same token budget the same way: a pool worth 16 batches drawn
by weight without replacement, sorted by length, cut greedily so that no batch wastes more than 5%.

- ours: `ReplayBuffer` tailing the table (files read in its background thread), sampling only
  once every row is in (`min_size`), as the baselines' first batch waits for their load: from
  the first files read it would deliver the same tokens out of two of the eight versions (mean
  lag 6.8 against 1.1 here), a different workload. It holds the whole table, as the baselines
  do: no capacity bound, since the default 8M tokens would evict the oldest rows of a larger
  table. `<side>_mean_lag` and `<side>_distinct_rows` in the JSON show every side did the same
  workload, and the bench stops when they differ (`same_workload`). Files are read by Arrow's
  Parquet reader on a pool of two threads (one file per thread, up to two versions ahead) into
  flat offsets and values (views of Arrow's decoded buffers, not copies); a batch copies each
  kept row piece once, straight from them.
- torchrl: TorchRL 0.14.1 `ReplayBuffer` over a ragged `ListStorage` (one item per row: views into
  three flat tensors, so no per-row copy), `LengthGroupedSampler` (below, on TorchRL's `Sampler`
  API) and `pad_collate`. Made fast: the table's files read by Arrow's Parquet reader
  (`read_table`: about 115 against 170 ms of CPU for polars `read_delta` here); rows cut and
  aligned once at load with a slice copy per row and field (input ids prompt ++ response, logprobs
  and response mask on the same positions: 27 ms against 150 ms for a per-token index); items are
  views, so a batch costs one copy per row and field, into zeroed arrays (faster than
  `pad_sequence`: about 250 against 400 us a batch); TorchRL's prefetch off (it only added thread
  hand-offs here).
- dataloader: a plain torch `DataLoader` (no workers: on two shared cores a worker process only
  pickles the rows) over a map-style dataset of the same rows, with the same length-grouped
  batches as its `batch_sampler` and the same collate.

The whole process runs torch with one intra-op thread (`--torch-threads`): on two shared cores a
`pad_sequence` of 45 rows took 8.6 ms with two threads and 0.47 ms with one. Sides alternate over
`--rounds` (bench/rounds.py); ratio = ours / the better baseline's real (non-padding) tokens per
second, the median over rounds; `ratio_vs_torchrl` and `ratio_vs_dataloader` against each alone
(bench/all.py's target names TorchRL). Each side also reports `load_s` / `load_cpu_s` (window
start to its first batch: the table read, and the baselines' cut and align), `cpu_ns_per_token` and
`deliver_cpu_ns_per_token` (after the first batch: sampling and collate), steadier than wall
time on a shared machine. A sample of every side's delivered rows (every 8th batch) is compared
token by token with the rows as loaded from the table; any difference stops the bench.
The old baseline (fixed-width `LazyTensorStorage` padded to max_length, random batches of
`--batch-rows`) runs once beside, to show how much faster the new one is.

Where the time goes (4,000 rows, 5.44M trainable tokens; scratch scripts at 6d7ea65, 9 to 24
alternated runs, load average 3 to 7, minimum / median): decoding just the three token columns
costs 58 / 73 ms of CPU whoever does it (prompt ids about 10 ns a value, response ids and
logprobs about 17), and 47 ms of wall on two threads. Ours' whole load (12 columns, the row
index) takes 106 / 188 ms of CPU and 115 / 310 ms of wall; the baselines' `load_rows` 134 / 232
ms of CPU and 187 / 338 of wall. Ours' delivery, main thread, is about 8 ns a token (120 us a
batch of 15.6k tokens): 45 us copying (about 3 ns a token, reads and writes near the memory
bandwidth this VM gives), 18 us allocating the zeroed arrays, the rest the per-batch
bookkeeping; in this bench's figure (process CPU after the first batch, its own bookkeeping
included) ours delivers at 9 to 15 ns a token, the baselines at 11 to 18. So with both cores
free ours' window is about 115 + 45 ms against TorchRL's 187 + 60, a ratio near 1.5; with the
cores shared it is not. Reading on the pool cut ours' load from 198 to 131 ms of wall and 188
to 170 ms of CPU (medians of 24 runs alternated with the code before it, load average 5.2
falling to 2.8). Full runs of this bench, 11 at 6d7ea65 alternated with 11 of the code before
(3 rounds each, load average 2.7 to 7.0): ratio median 1.06 (runs 0.49 to 1.38) against 1.05
(0.70 to 1.68); CPU per token 44.0 ns ours against 55.0 TorchRL (42.1 against 53.1 before).
Keeping Arrow's decoded token buffers instead of copying them, one pass of the vocabulary check
and no validity pass for columns without nulls save a few ms of CPU per load: 20 runs alternated
with the code before (load average 0.6 to 3.5) gave ours 45.7 against 45.8 ns a token of CPU and
a ratio median of 1.22 against 1.19, the same. docs/replay.md has what was tried and the floor.

    python bench/replay.py [--rows 4000] [--max-length 4096] [--token-budget 65536] [--rounds 3] [--json]
"""

from __future__ import annotations

import argparse
import gc
import tempfile
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from deltalake import DeltaTable, write_deltalake
from rounds import Sample, alternate, cpu_seconds, emit, load_average, summary
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, ListStorage, TensorDictReplayBuffer
from torchrl.data import ReplayBuffer as TorchRLBuffer
from torchrl.data.replay_buffers.samplers import Sampler, StalenessAwareSampler

from consumers import ReplayBuffer, ReplayConfig, TrajectoryColumns
from schemas.profile import load_profile
from schemas.tables import TRAJECTORIES_SCHEMA

APPENDS = 8
MAX_LAG = 8
HALF_LIFE = 1.0
POOL_BATCHES = 16
MAX_WASTE = 0.05
KEEP_EVERY = 8
"""Every this many-th delivered batch is kept and checked against the loaded rows."""


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


@dataclass(frozen=True)
class Rows:
    """The table's trainable rows as the baselines hold them: per-row views into flat tensors.

    `ids`, `logprobs` and `response` are each row's cut input ids, old logprobs and response mask,
    aligned on the same positions (logprob 0 and mask False on the prompt).
    """

    ids: list[torch.Tensor]
    logprobs: list[torch.Tensor]
    response: list[torch.Tensor]
    lengths: np.ndarray
    versions: np.ndarray
    advantages: list[float]
    trajectory_ids: list[str]

    def __len__(self) -> int:
        return len(self.lengths)

    def item(self, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float, int]:
        return self.ids[i], self.logprobs[i], self.response[i], self.advantages[i], i


def _flat(series: pl.Series) -> tuple[np.ndarray, np.ndarray]:
    array = series.to_arrow()
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    return array.offsets.to_numpy().astype(np.int64), array.values.to_numpy()


def read_table(uri: str, columns: list[str]) -> pl.DataFrame:
    """`columns` of the table's current files, each read by Arrow's Parquet reader, as one frame.

    Faster here than polars `read_delta` (about 115 against 170 ms of CPU for 4,000 rows), so the
    baselines use it. No Arrow dataset scanner is involved (HAZARDS.md).
    """
    files = DeltaTable(uri).file_uris()
    table = pa.concat_tables([pq.ParquetFile(path).read(columns=columns) for path in files])
    frame = pl.from_arrow(table)
    assert isinstance(frame, pl.DataFrame)
    return frame


def load_rows(uri: str, max_length: int) -> Rows:
    """Read the table (`read_table`); cut and align every row once, a slice copy per row and field."""
    frame = read_table(
        uri,
        [
            "trajectory_id",
            "prompt_tokens",
            "response_tokens",
            "response_logprobs",
            "policy_version",
            "verifier_status",
            "advantage",
        ],
    ).filter(
        pl.col("verifier_status").is_in(["ok", "fail"]),
        pl.col("prompt_tokens").is_not_null(),
        pl.col("response_tokens").is_not_null(),
        pl.col("response_logprobs").is_not_null(),
        pl.col("advantage").is_not_null() & pl.col("advantage").is_finite(),
    )
    p_off, p_val = _flat(frame["prompt_tokens"])
    r_off, r_val = _flat(frame["response_tokens"])
    l_off, l_val = _flat(frame["response_logprobs"])
    p_len, r_len, l_len = np.diff(p_off), np.diff(r_off), np.diff(l_off)
    r_keep = np.minimum(r_len, max_length - np.minimum(p_len, 1))
    p_keep = np.minimum(p_len, max_length - r_keep)
    l_keep = np.minimum(l_len, r_keep)
    lengths = p_keep + r_keep
    at = np.zeros(len(lengths), dtype=np.int64)
    np.cumsum(lengths[:-1], out=at[1:])
    size = int(lengths.sum())
    ids = np.zeros(size, dtype=np.int64)
    logprobs = np.zeros(size, dtype=np.float32)
    response = np.zeros(size, dtype=np.bool_)
    # One slice copy per row and field: rows are hundreds of tokens long, so this beats building
    # an index per token (np.repeat) by about 5x here (27 ms against 150 ms for 4,000 rows).
    for a, p0, pk, r0, rk, l0, lk in zip(
        at.tolist(),
        (p_off[:-1] + p_len - p_keep).tolist(),
        p_keep.tolist(),
        r_off[:-1].tolist(),
        r_keep.tolist(),
        l_off[:-1].tolist(),
        l_keep.tolist(),
        strict=True,
    ):
        b = a + pk
        ids[a:b] = p_val[p0 : p0 + pk]
        ids[b : b + rk] = r_val[r0 : r0 + rk]
        logprobs[b : b + lk] = l_val[l0 : l0 + lk]
        response[b : b + rk] = True
    split = lengths.tolist()
    return Rows(
        ids=list(torch.from_numpy(ids).split(split)),
        logprobs=list(torch.from_numpy(logprobs).split(split)),
        response=list(torch.from_numpy(response).split(split)),
        lengths=lengths,
        versions=frame["policy_version"].to_numpy().astype(np.int64),
        advantages=frame["advantage"].cast(pl.Float32).to_list(),
        trajectory_ids=frame["trajectory_id"].to_list(),
    )


def plan_pool(
    lengths: np.ndarray, versions: np.ndarray, version: int, token_budget: int, generator: torch.Generator
) -> list[list[int]]:
    """One pool's batches: POOL_BATCHES batches' worth of rows drawn by freshness weight, grouped by length."""
    lag = version - versions
    eligible = np.flatnonzero(lag <= MAX_LAG)
    if len(eligible) == 0:
        return []
    mean = max(float(lengths[eligible].mean()), 1.0)
    count = max(int(token_budget / (mean * 1.15) * POOL_BATCHES), 1)
    if count >= len(eligible):
        pool = eligible
    else:
        weights = torch.from_numpy(np.exp2(-np.maximum(lag[eligible], 0) / HALF_LIFE))
        pool = eligible[torch.multinomial(weights, count, replacement=False, generator=generator).numpy()]
    order = pool[np.argsort(-lengths[pool], kind="stable")]
    ordered = lengths[order]
    batches: list[list[int]] = []
    start = 0
    while start < len(order):
        width = max(int(ordered[start]), 1)
        end = min(start + max(token_budget // width, 1), len(order))
        end = (
            start
            + 1
            + int(np.searchsorted(-ordered[start + 1 : end], -width * (1 - MAX_WASTE), side="right"))
        )
        batches.append(order[start:end].tolist())
        start = end
    shuffle = torch.randperm(len(batches), generator=generator).tolist()
    return [batches[i] for i in shuffle]


def pad_collate(
    items: Sequence[tuple[torch.Tensor, torch.Tensor, torch.Tensor, float, int]],
) -> dict[str, Any]:
    """Right-padded batch of aligned rows: one zeroed array per field, one slice copy per row and field.

    Faster here than `pad_sequence` per field (about 250 against 400 us for a batch of 11 rows
    and 15k tokens, masks included), so the baselines use it.
    """
    ids, logprobs, response, advantages, rows = zip(*items, strict=True)
    lengths = [len(t) for t in ids]
    count, width = len(lengths), max(lengths)
    input_ids = np.zeros((count, width), dtype=np.int64)
    old_logprobs = np.zeros((count, width), dtype=np.float32)
    response_mask = np.zeros((count, width), dtype=np.bool_)
    attention_mask = np.zeros((count, width), dtype=np.bool_)
    for i, (n, row_ids, row_logprobs, row_response) in enumerate(
        zip(lengths, ids, logprobs, response, strict=True)
    ):
        input_ids[i, :n] = row_ids.numpy()
        old_logprobs[i, :n] = row_logprobs.numpy()
        response_mask[i, :n] = row_response.numpy()
        attention_mask[i, :n] = True
    return {
        "input_ids": torch.from_numpy(input_ids),
        "attention_mask": torch.from_numpy(attention_mask),
        "response_mask": torch.from_numpy(response_mask),
        "old_logprobs": torch.from_numpy(old_logprobs),
        "advantages": torch.tensor(advantages),
        "rows": list(rows),
        "tokens": sum(lengths),
    }


class LengthGroupedSampler(Sampler):
    """Token-budget batches of similar lengths, on TorchRL's `Sampler` API.

    `sample` returns the next planned batch (a list of storage indexes); when none is left it
    plans a pool (`plan_pool`). The batch size TorchRL passes is ignored: the budget decides.
    `consumer_version` is the learner's version, for the staleness limit and weights.
    """

    def __init__(self, lengths: np.ndarray, versions: np.ndarray, *, token_budget: int, seed: int) -> None:
        self.lengths = lengths
        self.versions = versions
        self.token_budget = token_budget
        self.consumer_version = 0
        self.generator = torch.Generator().manual_seed(seed)
        self._pending: deque[list[int]] = deque()

    def sample(self, storage: Any, batch_size: int) -> tuple[list[int], dict[str, Any]]:
        if not self._pending:
            n = len(storage)
            self._pending.extend(
                plan_pool(
                    self.lengths[:n],
                    self.versions[:n],
                    self.consumer_version,
                    self.token_budget,
                    self.generator,
                )
            )
        return self._pending.popleft(), {}

    def _empty(self) -> None:
        self._pending.clear()

    def state_dict(self) -> dict[str, Any]:
        return {"pending": list(self._pending), "generator": self.generator.get_state()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._pending = deque(state_dict["pending"])
        self.generator.set_state(state_dict["generator"])

    def dumps(self, path: str) -> None:
        torch.save(self.state_dict(), f"{path}/length_grouped_sampler.pt")

    def loads(self, path: str) -> None:
        self.load_state_dict(torch.load(f"{path}/length_grouped_sampler.pt"))


class LengthGroupedBatches:
    """The same batches as a `DataLoader` batch sampler (endless; the consumer stops)."""

    def __init__(self, rows: Rows, *, version: int, token_budget: int, seed: int) -> None:
        self.rows, self.version, self.token_budget = rows, version, token_budget
        self.generator = torch.Generator().manual_seed(seed)

    def __iter__(self) -> Iterator[list[int]]:
        while True:
            batches = plan_pool(
                self.rows.lengths, self.rows.versions, self.version, self.token_budget, self.generator
            )
            if not batches:
                return
            yield from batches


class RowsDataset(torch.utils.data.Dataset[tuple[torch.Tensor, torch.Tensor, torch.Tensor, float, int]]):
    """Map-style dataset over the loaded rows."""

    def __init__(self, rows: Rows) -> None:
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float, int]:
        return self.rows.item(i)


@dataclass
class Delivery:
    """What a side delivered in its window, and the batches kept for the content check.

    `first_s` / `first_cpu_s` are the wall and CPU seconds from the window's start to the first
    batch: the load (every side waits for the whole table before its first batch).
    """

    tokens: int = 0
    slots: int = 0
    batches: int = 0
    lag: int = 0
    rows: int = 0
    kept: list[dict[str, Any]] | None = None
    distinct: set[Any] = field(default_factory=set)
    started: tuple[float, float] = field(default_factory=lambda: (time.perf_counter(), cpu_seconds()))
    first_s: float = 0.0
    first_cpu_s: float = 0.0

    def add(self, batch: dict[str, Any], tokens: int, versions: np.ndarray, ids: Sequence[Any]) -> None:
        if self.batches == 0:
            self.first_s = time.perf_counter() - self.started[0]
            self.first_cpu_s = cpu_seconds() - self.started[1]
        self.tokens += tokens
        self.slots += int(batch["attention_mask"].numel())
        self.lag += int((APPENDS - 1 - versions).sum())
        self.rows += len(ids)
        self.distinct.update(ids)
        if self.kept is not None and self.batches % KEEP_EVERY == 0:
            self.kept.append(batch)
        self.batches += 1

    def sample(self, seconds: float, cpu_s: float) -> Sample:
        waste = 1 - self.tokens / self.slots if self.slots else 0.0
        return Sample(
            items=self.tokens,
            seconds=seconds,
            cpu_s=cpu_s,
            extra={
                "padding_waste": waste,
                "batches": float(self.batches),
                "mean_lag": self.lag / max(self.rows, 1),
                "distinct_rows": float(len(self.distinct)),
                "cpu_ns_per_token": round(cpu_s / max(self.tokens, 1) * 1e9, 1),
                "load_s": round(self.first_s, 4),
                "load_cpu_s": round(self.first_cpu_s, 4),
                "deliver_cpu_ns_per_token": round((cpu_s - self.first_cpu_s) / max(self.tokens, 1) * 1e9, 1),
            },
        )


def run_ours(uri: str, args: argparse.Namespace, target: int, rows: int, out: Delivery) -> None:
    config = ReplayConfig(
        table_uri=uri,
        token_budget=args.token_budget,
        max_length=args.max_length,
        max_lag=MAX_LAG,
        half_life=HALF_LIFE,
        pool_batches=POOL_BATCHES,
        max_waste=MAX_WASTE,
        profile_matched=False,
        capacity_rows=None,
        capacity_tokens=None,  # the baselines hold the whole table; so does ours
        min_size=rows,  # the baselines' first batch waits for the whole table; so does ours
        seed=args.seed,
    )
    with ReplayBuffer(config) as buffer:
        while out.tokens < target:
            batch = buffer.sample(APPENDS - 1)
            out.add(
                dict(batch), int(batch["tokens"]), batch["policy_versions"].numpy(), batch["trajectory_ids"]
            )


def run_torchrl(uri: str, args: argparse.Namespace, target: int, out: Delivery, seed: int) -> None:
    rows = load_rows(uri, args.max_length)
    sampler = LengthGroupedSampler(rows.lengths, rows.versions, token_budget=args.token_budget, seed=seed)
    buffer = TorchRLBuffer(
        storage=ListStorage(len(rows)), sampler=sampler, collate_fn=pad_collate, batch_size=1
    )
    buffer.extend([rows.item(i) for i in range(len(rows))])
    sampler.consumer_version = APPENDS - 1
    while out.tokens < target:
        batch = buffer.sample()
        out.add(batch, batch["tokens"], rows.versions[batch["rows"]], batch["rows"])


def run_dataloader(uri: str, args: argparse.Namespace, target: int, out: Delivery, seed: int) -> None:
    rows = load_rows(uri, args.max_length)
    batches = LengthGroupedBatches(rows, version=APPENDS - 1, token_budget=args.token_budget, seed=seed)
    loader = torch.utils.data.DataLoader(
        RowsDataset(rows), batch_sampler=batches, collate_fn=pad_collate, num_workers=0
    )
    for batch in loader:
        out.add(batch, batch["tokens"], rows.versions[batch["rows"]], batch["rows"])
        if out.tokens >= target:
            break


def check_rows(name: str, kept: list[dict[str, Any]], reference: Rows) -> int:
    """Compare every kept batch's rows with the reference rows; returns rows checked, exits on a difference."""
    where = {tid: i for i, tid in enumerate(reference.trajectory_ids)}
    checked = 0
    for number, batch in enumerate(kept):
        indexes = list(batch["rows"]) if "rows" in batch else [where[tid] for tid in batch["trajectory_ids"]]
        width = batch["input_ids"].shape[1]
        if width != max(int(reference.lengths[r]) for r in indexes):
            raise SystemExit(f"{name}: kept batch {number} is {width} wide, not its longest row")
        for i, r in enumerate(indexes):
            n = int(reference.lengths[r])
            problems = [
                field
                for field, got, want, pad in (
                    ("input_ids", batch["input_ids"][i], reference.ids[r], 0),
                    ("response_mask", batch["response_mask"][i], reference.response[r], False),
                    ("old_logprobs", batch["old_logprobs"][i], reference.logprobs[r], 0.0),
                    ("attention_mask", batch["attention_mask"][i], torch.ones(n, dtype=torch.bool), False),
                )
                if not (torch.equal(got[:n], want) and not got[n:].ne(pad).any())
            ]
            if float(batch["advantages"][i]) != reference.advantages[r]:
                problems.append("advantages")
            if problems:
                raise SystemExit(
                    f"{name} delivered row {reference.trajectory_ids[r]} (batch {number}, position {i}) "
                    f"with {', '.join(problems)} different from the table's row: the layouts disagree"
                )
            checked += 1
    return checked


def run_fixed_torchrl(uri: str, *, max_length: int, batch_rows: int, target_tokens: int) -> dict[str, float]:
    """The old baseline: rows padded to max_length in a LazyTensorStorage, random batches of `batch_rows`."""
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


SIDES = ("ours", "torchrl", "dataloader")
LAG_TOLERANCE = 0.15
"""Largest difference of mean lag (versions) between sides that still counts as one workload."""
ROWS_TOLERANCE = 0.05
"""Largest relative difference of distinct rows delivered between sides that still counts as one workload."""


def same_workload(result: dict[str, Any]) -> None:
    """Exit unless every side delivered about the same rows at the same lag: a side that held
    fewer rows (a capacity bound evicting the oldest) would be timed on a different workload."""
    lags = {side: result[f"{side}_mean_lag"] for side in SIDES}
    rows = {side: result[f"{side}_distinct_rows"] for side in SIDES}
    lag_spread = max(lags.values()) - min(lags.values())
    rows_spread = max(rows.values()) / max(min(rows.values()), 1.0) - 1
    if lag_spread > LAG_TOLERANCE or rows_spread > ROWS_TOLERANCE:
        raise SystemExit(
            f"the sides did different workloads (mean lag {lags}, distinct rows {rows}); "
            "every side must hold the whole table: check ours' capacity settings in run_ours"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=4000)
    parser.add_argument("--max-length", type=int, default=4096)
    parser.add_argument("--token-budget", type=int, default=65_536)
    parser.add_argument(
        "--passes", type=float, default=1.0, help="deliver this many times the table's tokens"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--torch-threads", type=int, default=1)
    parser.add_argument("--batch-rows", type=int, default=16, help="the old baseline's rows per batch")
    parser.add_argument("--no-old", action="store_true", help="skip the old fixed-width baseline")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.torch_threads)
    load_before = load_average()

    with tempfile.TemporaryDirectory(prefix="bench-replay-") as tmp:
        uri = f"{tmp}/trajectories"
        table_tokens = build_table(uri, args.rows, args.seed)
        reference = load_rows(uri, args.max_length)
        target = int(args.passes * reference.lengths.sum())
        checked: dict[str, int] = {}

        def side(name: str, run: Any) -> Any:
            def measure(index: int) -> Sample:
                gc.collect()
                out = Delivery(kept=[])
                wall0, cpu0 = out.started
                run(out, index)
                sample = out.sample(time.perf_counter() - wall0, cpu_seconds() - cpu0)
                checked[name] = checked.get(name, 0) + check_rows(name, out.kept or [], reference)
                return sample

            return name, measure

        samples = alternate(
            side("ours", lambda out, i: run_ours(uri, args, target, len(reference), out)),
            [
                side("torchrl", lambda out, i: run_torchrl(uri, args, target, out, args.seed + i)),
                side("dataloader", lambda out, i: run_dataloader(uri, args, target, out, args.seed + i)),
            ],
            args.rounds,
        )
        result = summary(samples, "ours", load_before, unit="tokens")
        same_workload(result)
        old: dict[str, float] | None = None
        if not args.no_old:
            gc.collect()
            old = run_fixed_torchrl(
                uri, max_length=args.max_length, batch_rows=args.batch_rows, target_tokens=target
            )
    result.update(
        padding_waste=result["ours_padding_waste"],
        rows_checked=checked,
        rows=args.rows,
        table_tokens=table_tokens,
        trainable_tokens=int(reference.lengths.sum()),
        tokens_per_side=target,
        max_length=args.max_length,
        token_budget=args.token_budget,
        torch_threads=args.torch_threads,
    )
    if old is not None:
        old_rate = old["tokens"] / old["seconds"]
        result.update(
            old_torchrl_per_s=round(old_rate, 1),
            old_torchrl_padding_waste=round(old["waste"], 4),
            torchrl_vs_old=round(result["torchrl_per_s"] / old_rate, 2),
        )

    def human(r: Any) -> str:
        text = (
            f"ours {r['ours_per_s']:,.0f} tokens/s, TorchRL {r['torchrl_per_s']:,.0f}, DataLoader "
            f"{r['dataloader_per_s']:,.0f}: ratio {r['ratio']} ({r['ratio_min']} to {r['ratio_max']}, "
            f"{r['rounds']} rounds); padding waste {r['padding_waste']:.3f}; load {r['load_before']} -> {r['load_after']}"
        )
        if "old_torchrl_per_s" in r:
            text += (
                f"\nold baseline (LazyTensorStorage at {r['max_length']}, random batches): "
                f"{r['old_torchrl_per_s']:,.0f} tokens/s, waste {r['old_torchrl_padding_waste']:.3f}; "
                f"the new TorchRL baseline is {r['torchrl_vs_old']}x faster"
            )
        return text

    emit(result, args.json, human)


if __name__ == "__main__":
    main()
