"""One data file's trainable rows in memory: ragged token columns and per-row metadata.

A chunk is the replay buffer's unit of reading and of eviction. Rows are filtered on read: a
verifier status the learner trains on, tokens present, a finite advantage. Token ids outside
the policy's vocabulary are refused here, at read time, naming the file and the row, rather
than growing an embedding to whatever id the data holds. A row's `policy_version` here is the
oldest version that generated it (the lowest of its `version_spans`, else its policy_version):
staleness and eviction go by it. Files written before the task columns (`loss_mask`,
`version_spans`) read them as null: every token trained on, one version.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np
import numpy.typing as npt
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from consumers.batching import RaggedColumn, loss_mask_column
from consumers.exceptions import PolicyInputError, TokenRangeError
from consumers.replay.log import DataFile
from schemas.local_table import local_path
from schemas.tables import TRAJECTORIES_SCHEMA

CHUNK_COLUMNS = [
    "trajectory_id",
    "domain",
    "task_type",
    "policy_version",
    "prompt_tokens",
    "response_tokens",
    "response_logprobs",
    "reward",
    "advantage",
    "verifier_status",
    "bucket",
    "loss_mask",
    "version_spans",
]


@functools.cache
def _arrow_schema(columns: tuple[str, ...]) -> pa.Schema:
    """The Arrow schema of `columns` as the trajectories table defines them."""
    return pa.schema([TRAJECTORIES_SCHEMA.field(c) for c in columns])


@functools.cache
def _file_schema(columns: tuple[str, ...]) -> pl.Schema:
    """The polars schema of `columns` as the trajectories table defines them."""
    frame = pl.from_arrow(TRAJECTORIES_SCHEMA.empty_table().select(list(columns)))
    assert isinstance(frame, pl.DataFrame)
    return frame.schema


@dataclass(frozen=True)
class Chunk:
    """The rows of one data file that a learner may train on.

    `domain` / `task_type` are codes into `domains` / `task_types`; `bucket` holds bucket names
    (one per row; a table partitioned by bucket has a single value per file); `policy_version`
    the oldest version that generated each row; `loss_mask` is on `response`'s offsets (None:
    every response token is trained on).
    """

    file: DataFile
    trajectory_ids: npt.NDArray[np.object_]
    prompt: RaggedColumn
    response: RaggedColumn
    logprobs: RaggedColumn
    policy_version: npt.NDArray[np.int64]
    reward: npt.NDArray[np.float32]
    advantage: npt.NDArray[np.float32]
    bucket: npt.NDArray[np.object_]
    domain: npt.NDArray[np.int32]
    domains: tuple[str, ...]
    task_type: npt.NDArray[np.int32]
    task_types: tuple[str, ...]
    loss_mask: RaggedColumn | None = None

    def __len__(self) -> int:
        return len(self.advantage)

    @property
    def lengths(self) -> npt.NDArray[np.int64]:
        """Prompt plus response tokens of each row."""
        return self.prompt.lengths + self.response.lengths

    @property
    def tokens(self) -> int:
        """All prompt and response tokens the chunk holds."""
        return int(self.prompt.values.size + self.response.values.size)

    @property
    def nbytes(self) -> int:
        """Approximate memory held by the token columns."""
        columns = (self.prompt, self.response, self.logprobs, *((self.loss_mask,) if self.loss_mask else ()))
        return sum(c.values.nbytes + c.offsets.nbytes for c in columns)


def read_chunk(
    table_uri: str,
    file: DataFile,
    *,
    statuses: Sequence[str],
    vocab_size: int,
    storage_options: Mapping[str, str] | None = None,
    use_threads: bool = True,
) -> Chunk:
    """Read the trainable rows of one data file.

    `use_threads` lets Arrow decode a local file's columns on its own thread pool; a caller that
    reads several files at once on threads of its own passes False (less CPU for the same work).

    Raises:
        TokenRangeError: a token id lies outside [0, vocab_size).
        PolicyInputError: a row's loss mask does not have one value per response token.
    """
    path = f"{table_uri.rstrip('/')}/{file.path}"
    columns = tuple(c for c in CHUNK_COLUMNS if c != "bucket" or file.partition("bucket") is None)
    table = _trainable(_read_columns(path, columns, storage_options, use_threads=use_threads), statuses)
    n = table.num_rows
    response = RaggedColumn.from_arrow(table["response_tokens"], name="response_tokens")
    try:
        loss_mask = loss_mask_column(table["loss_mask"], response)
    except PolicyInputError as exc:
        raise PolicyInputError(f"{path}: {exc}") from exc
    domains, domain = _codes(table["domain"])
    task_types, task_type = _codes(table["task_type"])
    partition_bucket = file.partition("bucket")
    bucket = (
        np.full(n, partition_bucket, dtype=object)
        if "bucket" not in columns
        else _strings(pc.fill_null(table["bucket"], ""))
    )
    chunk = Chunk(
        file=file,
        trajectory_ids=_strings(table["trajectory_id"]),
        prompt=RaggedColumn.from_arrow(table["prompt_tokens"], name="prompt_tokens"),
        response=response,
        logprobs=RaggedColumn.from_arrow(table["response_logprobs"], name="response_logprobs"),
        loss_mask=loss_mask,
        policy_version=_oldest_versions(table),
        reward=_floats(pc.fill_null(table["reward"], 0.0)),
        advantage=_floats(table["advantage"]),
        bucket=bucket,
        domain=domain,
        domains=domains,
        task_type=task_type,
        task_types=task_types,
    )
    _check_vocabulary(chunk, vocab_size, path)
    return chunk


def _read_columns(
    path: str,
    columns: tuple[str, ...],
    storage_options: Mapping[str, str] | None,
    *,
    use_threads: bool = True,
) -> pa.Table:
    """`columns` of one Parquet file as an Arrow table with the trajectories table's types.

    A local file is read by Arrow's Parquet reader directly (no dataset scanner: HAZARDS.md); an
    object store's through polars, which takes deltalake's storage options. Columns the file
    predates (`loss_mask`, `version_spans`) come back as nulls.
    """
    wanted = _arrow_schema(columns)
    local = local_path(path)
    if local is None:
        frame = pl.scan_parquet(
            path,
            schema=_file_schema(columns),
            missing_columns="insert",
            extra_columns="ignore",
            storage_options=dict(storage_options) if storage_options else None,
            glob=False,
        ).collect()
        table = frame.to_arrow()
    else:
        parquet = pq.ParquetFile(str(local))
        present = set(parquet.schema_arrow.names)
        table = parquet.read(columns=[c for c in columns if c in present], use_threads=use_threads)
        for name in columns:
            if name not in present:
                table = table.append_column(
                    wanted.field(name), pa.nulls(table.num_rows, wanted.field(name).type)
                )
    table = table.select(list(columns))
    return table if table.schema.equals(wanted) else table.cast(wanted)


def _trainable(table: pa.Table, statuses: Sequence[str]) -> pa.Table:
    """The rows a learner may train on: a wanted status, tokens and logprobs present, a finite advantage."""
    keep = pc.is_in(table["verifier_status"], value_set=pa.array(list(statuses), type=pa.string()))
    for name in ("prompt_tokens", "response_tokens", "response_logprobs", "advantage"):
        if table[name].null_count:  # counted at decode; most files have no null in these columns
            keep = pc.and_(keep, pc.is_valid(table[name]))
    keep = pc.and_(keep, pc.fill_null(pc.is_finite(table["advantage"]), False))
    mask = keep.to_numpy(zero_copy_only=False)
    return table.combine_chunks() if mask.all() else table.filter(pa.array(mask)).combine_chunks()


def _oldest_versions(table: pa.Table) -> npt.NDArray[np.int64]:
    """Each row's oldest generating version: the lowest of its version spans, else policy_version, else 0."""
    spans = table["version_spans"]
    if spans.null_count == len(spans):
        return pc.fill_null(table["policy_version"], 0).to_numpy().astype(np.int64)
    frame = pl.from_arrow(table.select(["policy_version", "version_spans"]))
    assert isinstance(frame, pl.DataFrame)
    oldest = pl.col("version_spans").list.eval(pl.element().struct.field("version")).list.min()
    versions = frame.select(pl.coalesce(oldest, pl.col("policy_version")).fill_null(0)).to_series()
    return versions.to_numpy().astype(np.int64)


def _strings(column: pa.ChunkedArray) -> npt.NDArray[np.object_]:
    return np.asarray(column.to_numpy(zero_copy_only=False), dtype=object)


def _floats(column: pa.ChunkedArray) -> npt.NDArray[np.float32]:
    return column.to_numpy().astype(np.float32)


def _codes(column: pa.ChunkedArray) -> tuple[tuple[str, ...], npt.NDArray[np.int32]]:
    encoded = pc.dictionary_encode(pc.fill_null(column, "")).combine_chunks()
    return tuple(encoded.dictionary.to_pylist()), encoded.indices.to_numpy().astype(np.int32)


def _check_vocabulary(chunk: Chunk, vocab_size: int, path: str) -> None:
    for name, column in (("prompt_tokens", chunk.prompt), ("response_tokens", chunk.response)):
        values = cast(npt.NDArray[np.int32], column.values)
        if values.size == 0:
            continue
        # Read as unsigned, a negative id is above any vocabulary: one pass over the ids, not two.
        if int(values.view(np.dtype(f"u{values.itemsize}")).max()) < vocab_size:
            continue
        bad = int(np.flatnonzero((values < 0) | (values >= vocab_size))[0])
        row = int(np.searchsorted(column.offsets, bad, side="right") - 1)
        raise TokenRangeError(
            f"{path}: row {chunk.trajectory_ids[row]!r} has {name} id {int(values[bad])}, outside the "
            f"vocabulary [0, {vocab_size}): set vocab_size (rollstream learn --vocab-size) to the "
            "tokenizer's size, or fix the producer that wrote it"
        )
