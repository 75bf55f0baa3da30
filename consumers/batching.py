"""Padded torch batches from Arrow list columns, without a Python object per token.

Each `list<int32>` / `list<float32>` column is kept as its Arrow offsets and flat values (numpy
views); a batch is a vectorized gather from them into right-padded arrays.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

import numpy as np
import numpy.typing as npt
import polars as pl
import pyarrow as pa
import torch

PAD_ID = 0


class TrajectoryBatch(TypedDict):
    """One learner batch; L is the longest (truncated) row of this batch.

    `old_logprobs` holds each response token's sampling logprob at that token's position and 0
    elsewhere. `trajectory_ids` names the rows, for lineage and debugging.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    response_mask: torch.Tensor
    old_logprobs: torch.Tensor
    advantages: torch.Tensor
    rewards: torch.Tensor
    trajectory_ids: list[str]


@dataclass(frozen=True)
class RaggedColumn:
    """A list column as Arrow offsets (absolute into `values`) and flat values."""

    offsets: npt.NDArray[np.int64]
    values: npt.NDArray[np.generic]

    @classmethod
    def from_series(cls, series: pl.Series) -> RaggedColumn:
        """View a polars list Series (no nulls) as offsets and values."""
        array = series.rechunk().to_arrow()
        if isinstance(array, pa.ChunkedArray):
            array = array.combine_chunks()
        if not isinstance(array, pa.ListArray | pa.LargeListArray):
            raise TypeError(f"column {series.name!r} is {series.dtype}, expected a list column")
        offsets = array.offsets.to_numpy().astype(np.int64, copy=False)
        values = array.values.to_numpy(zero_copy_only=False)
        return cls(offsets=offsets, values=values)

    @property
    def lengths(self) -> npt.NDArray[np.int64]:
        """Number of elements in each row."""
        return np.diff(self.offsets)


@dataclass(frozen=True)
class TrajectoryColumns:
    """The columns a learner needs, ready to gather batches from."""

    prompt: RaggedColumn
    response: RaggedColumn
    logprobs: RaggedColumn
    advantages: npt.NDArray[np.float32]
    rewards: npt.NDArray[np.float32]
    trajectory_ids: list[str]

    @classmethod
    def from_frame(cls, frame: pl.DataFrame) -> TrajectoryColumns:
        """Take prompt/response tokens, logprobs, advantage, reward and id from a frame."""
        return cls(
            prompt=RaggedColumn.from_series(frame["prompt_tokens"]),
            response=RaggedColumn.from_series(frame["response_tokens"]),
            logprobs=RaggedColumn.from_series(frame["response_logprobs"]),
            advantages=frame["advantage"].fill_null(0.0).to_numpy().astype(np.float32),
            rewards=frame["reward"].fill_null(0.0).to_numpy().astype(np.float32),
            trajectory_ids=frame["trajectory_id"].to_list(),
        )

    def __len__(self) -> int:
        return len(self.advantages)

    def batch(self, rows: npt.NDArray[np.int64], max_length: int) -> TrajectoryBatch:
        """Build the padded batch of `rows`: prompt ++ response cut to `max_length` tokens.

        The response is what is trained on, so it keeps its head (up to `max_length` - 1 tokens)
        and the prompt keeps its tail, the context nearest the response; at least one prompt
        token stays, since the first position has nothing to predict it. The batch is padded to
        its own longest row, not to `max_length`.
        """
        prompt_length = self.prompt.lengths[rows]
        response_keep = np.minimum(self.response.lengths[rows], max_length - np.minimum(prompt_length, 1))
        prompt_keep = np.minimum(prompt_length, max_length - response_keep)
        logprob_keep = np.minimum(self.logprobs.lengths[rows], response_keep)
        total = prompt_keep + response_keep
        width = max(int(total.max(initial=0)), 1)
        zeros = np.zeros(len(rows), dtype=np.int64)

        input_ids = np.full((len(rows), width), PAD_ID, dtype=np.int64)
        _gather_into(input_ids, self.prompt, rows, prompt_keep, zeros, skip=prompt_length - prompt_keep)
        _gather_into(input_ids, self.response, rows, response_keep, prompt_keep)
        old_logprobs = np.zeros((len(rows), width), dtype=np.float32)
        _gather_into(old_logprobs, self.logprobs, rows, logprob_keep, prompt_keep)

        positions = np.arange(width)[None, :]
        attention_mask = positions < total[:, None]
        response_mask = attention_mask & (positions >= prompt_keep[:, None])
        return TrajectoryBatch(
            input_ids=torch.from_numpy(input_ids),
            attention_mask=torch.from_numpy(attention_mask),
            response_mask=torch.from_numpy(response_mask),
            old_logprobs=torch.from_numpy(old_logprobs),
            advantages=torch.from_numpy(self.advantages[rows]),
            rewards=torch.from_numpy(self.rewards[rows]),
            trajectory_ids=[self.trajectory_ids[row] for row in rows],
        )


def _gather_into(
    dest: npt.NDArray[np.generic],
    column: RaggedColumn,
    rows: npt.NDArray[np.int64],
    keep: npt.NDArray[np.int64],
    start: npt.NDArray[np.int64],
    *,
    skip: npt.NDArray[np.int64] | None = None,
) -> None:
    """Copy `keep[i]` values of row `rows[i]`, from its `skip[i]`-th on, into `dest[i, start[i]:]`, vectorized."""
    count = int(keep.sum())
    if count == 0:
        return
    batch_row = np.repeat(np.arange(len(rows)), keep)
    within = np.arange(count) - np.repeat(np.cumsum(keep) - keep, keep)
    first = column.offsets[rows] if skip is None else column.offsets[rows] + skip
    source = np.repeat(first, keep) + within
    dest[batch_row, np.repeat(start, keep) + within] = column.values[source]
