"""One data file's trainable rows in memory: ragged token columns and per-row metadata.

A chunk is the replay buffer's unit of reading and of eviction. Rows are filtered on read: a
verifier status the learner trains on, tokens present, a finite advantage. Token ids outside
the policy's vocabulary are refused here, at read time, naming the file and the row, rather
than growing an embedding to whatever id the data holds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np
import numpy.typing as npt
import polars as pl

from consumers.batching import RaggedColumn
from consumers.exceptions import TokenRangeError
from consumers.replay.log import DataFile

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
]


@dataclass(frozen=True)
class Chunk:
    """The rows of one data file that a learner may train on.

    `domain` / `task_type` are codes into `domains` / `task_types`; `bucket` holds bucket names
    (one per row; a table partitioned by bucket has a single value per file).
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
        return sum(c.values.nbytes + c.offsets.nbytes for c in (self.prompt, self.response, self.logprobs))


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
    """
    path = f"{table_uri.rstrip('/')}/{file.path}"
    frame = pl.read_parquet(
        path,
        columns=[c for c in CHUNK_COLUMNS if c != "bucket" or file.partition("bucket") is None],
        storage_options=dict(storage_options) if storage_options else None,
        use_pyarrow=False,
        glob=False,
    )
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
    chunk = Chunk(
        file=file,
        trajectory_ids=np.asarray(frame["trajectory_id"].to_list(), dtype=object),
        prompt=RaggedColumn.from_series(frame["prompt_tokens"]),
        response=RaggedColumn.from_series(frame["response_tokens"]),
        logprobs=RaggedColumn.from_series(frame["response_logprobs"]),
        policy_version=frame["policy_version"].fill_null(0).to_numpy().astype(np.int64),
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
