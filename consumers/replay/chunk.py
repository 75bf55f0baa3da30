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

from consumers.batching import RaggedColumn, loss_mask_column
from consumers.exceptions import PolicyInputError, TokenRangeError
from consumers.replay.log import DataFile
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
) -> Chunk:
    """Read the trainable rows of one data file.

    Raises:
        TokenRangeError: a token id lies outside [0, vocab_size).
        PolicyInputError: a row's loss mask does not have one value per response token.
    """
    path = f"{table_uri.rstrip('/')}/{file.path}"
    columns = tuple(c for c in CHUNK_COLUMNS if c != "bucket" or file.partition("bucket") is None)
    frame = pl.scan_parquet(
        path,
        schema=_file_schema(columns),
        missing_columns="insert",
        extra_columns="ignore",
        storage_options=dict(storage_options) if storage_options else None,
        glob=False,
    ).collect()
    if "bucket" not in frame.columns:
        frame = frame.with_columns(pl.lit(file.partition("bucket")).alias("bucket"))
    frame = frame.filter(
        pl.col("verifier_status").is_in(list(statuses)),
        pl.col("prompt_tokens").is_not_null(),
        pl.col("response_tokens").is_not_null(),
        pl.col("response_logprobs").is_not_null(),
        pl.col("advantage").is_not_null() & pl.col("advantage").is_finite(),
    )
    domains, domain = _codes(frame["domain"])
    task_types, task_type = _codes(frame["task_type"])
    oldest = pl.col("version_spans").list.eval(pl.element().struct.field("version")).list.min()
    versions = frame.select(pl.coalesce(oldest, pl.col("policy_version")).fill_null(0)).to_series()
    response = RaggedColumn.from_series(frame["response_tokens"])
    try:
        loss_mask = loss_mask_column(frame["loss_mask"], response)
    except PolicyInputError as exc:
        raise PolicyInputError(f"{path}: {exc}") from exc
    chunk = Chunk(
        file=file,
        trajectory_ids=np.asarray(frame["trajectory_id"].to_list(), dtype=object),
        prompt=RaggedColumn.from_series(frame["prompt_tokens"]),
        response=response,
        logprobs=RaggedColumn.from_series(frame["response_logprobs"]),
        loss_mask=loss_mask,
        policy_version=versions.to_numpy().astype(np.int64),
        reward=frame["reward"].fill_null(0.0).to_numpy().astype(np.float32),
        advantage=frame["advantage"].to_numpy().astype(np.float32),
        bucket=np.asarray(frame["bucket"].fill_null("").to_list(), dtype=object),
        domain=domain,
        domains=domains,
        task_type=task_type,
        task_types=task_types,
    )
    _check_vocabulary(chunk, vocab_size, path)
    return chunk


def _codes(series: pl.Series) -> tuple[tuple[str, ...], npt.NDArray[np.int32]]:
    names, codes = np.unique(np.asarray(series.fill_null("").to_list(), dtype=object), return_inverse=True)
    return tuple(str(n) for n in names), codes.astype(np.int32)


def _check_vocabulary(chunk: Chunk, vocab_size: int, path: str) -> None:
    for name, column in (("prompt_tokens", chunk.prompt), ("response_tokens", chunk.response)):
        values = cast(npt.NDArray[np.int32], column.values)
        if values.size == 0:
            continue
        low, high = int(values.min()), int(values.max())
        if low >= 0 and high < vocab_size:
            continue
        bad = int(np.flatnonzero((values < 0) | (values >= vocab_size))[0])
        row = int(np.searchsorted(column.offsets, bad, side="right") - 1)
        raise TokenRangeError(
            f"{path}: row {chunk.trajectory_ids[row]!r} has {name} id {int(values[bad])}, outside the "
            f"vocabulary [0, {vocab_size}): set vocab_size (rollstream learn --vocab-size) to the "
            "tokenizer's size, or fix the producer that wrote it"
        )
