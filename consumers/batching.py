"""Padded torch batches from Arrow list columns, without a Python object per token.

Each `list<int32>` / `list<float32>` column is kept as its Arrow offsets and flat values (numpy
views); a batch is a vectorized gather from them into right-padded arrays. The per-token loss mask
(`loss_mask`, list<bool>, null = every response token trained on) is combined into the response
mask: tokens the environment inserted are attended to but not trained on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

import numpy as np
import numpy.typing as npt
import polars as pl
import pyarrow as pa
import torch

from consumers.exceptions import PolicyInputError

PAD_ID = 0


class TrajectoryBatch(TypedDict):
    """One learner batch; L is the longest (truncated) row of this batch.

    `response_mask` is True at the response tokens trained on: a token whose loss mask is 0 (the
    environment inserted it) is False there though attended to. `old_logprobs` holds each
    response token's sampling logprob at that token's position and 0 elsewhere. `trajectory_ids`
    names the rows, for lineage and debugging.
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
        return cls.from_arrow(series.rechunk().to_arrow(), name=series.name)

    @classmethod
    def from_arrow(cls, array: pa.Array | pa.ChunkedArray, *, name: str = "") -> RaggedColumn:
        """View an Arrow list array (no nulls) as offsets and values; a single chunk is not copied."""
        if isinstance(array, pa.ChunkedArray):
            array = single_array(array)
        if not isinstance(array, pa.ListArray | pa.LargeListArray):
            raise TypeError(f"column {name!r} is {array.type}, expected a list column")
        offsets = array.offsets.to_numpy().astype(np.int64, copy=False)
        values = array.values.to_numpy(zero_copy_only=False)
        return cls(offsets=offsets, values=values)

    @property
    def lengths(self) -> npt.NDArray[np.int64]:
        """Number of elements in each row."""
        return np.diff(self.offsets)


def single_array(column: pa.ChunkedArray) -> pa.Array:
    """`column` as one array: its only chunk as is (`combine_chunks` would copy it), else the chunks joined."""
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


def loss_mask_column(
    column: pl.Series | pa.Array | pa.ChunkedArray | None, response: RaggedColumn
) -> RaggedColumn | None:
    """The loss masks as booleans on `response`'s offsets (True = trained on); None when no row has one.

    A null row (or a missing column: a table written before masks) is trained on at every token.

    Raises:
        PolicyInputError: a row's mask does not have one value per response token.
    """
    if column is None:
        return None
    name = column.name if isinstance(column, pl.Series) else "loss_mask"
    array = column.rechunk().to_arrow() if isinstance(column, pl.Series) else column
    if isinstance(array, pa.ChunkedArray):
        array = single_array(array)
    if array.null_count == len(array):
        return None
    if not isinstance(array, pa.ListArray | pa.LargeListArray):
        raise TypeError(f"column {name!r} is {array.type}, expected list<bool>")
    valid = ~array.is_null().to_numpy(zero_copy_only=False)
    offsets = array.offsets.to_numpy().astype(np.int64, copy=False)
    lengths = np.diff(offsets)
    bad = np.flatnonzero(valid & (lengths != response.lengths))
    if len(bad):
        row = int(bad[0])
        raise PolicyInputError(
            f"row {row} of {name!r} has {int(lengths[row])} loss mask values for "
            f"{int(response.lengths[row])} response tokens ({len(bad)} rows differ): the mask needs one "
            "value per response token; fix the writer of the table"
        )
    out = np.ones(len(response.values), dtype=np.bool_)
    rows = np.flatnonzero(valid)
    counts = lengths[rows]
    total = int(counts.sum())
    if total:
        within = np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts)
        values = array.values.to_numpy(zero_copy_only=False).astype(np.bool_, copy=False)
        out[np.repeat(response.offsets[rows], counts) + within] = values[
            np.repeat(offsets[rows], counts) + within
        ]
    return RaggedColumn(offsets=response.offsets, values=out)


def kept_pieces(
    prompt_length: npt.NDArray[np.int64],
    response_length: npt.NDArray[np.int64],
    logprobs_length: npt.NDArray[np.int64],
    max_length: int,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Tokens each row keeps when cut to `max_length`: (prompt, response, logprobs).

    The response keeps its head (up to `max_length` - 1 tokens when there is a prompt), the prompt
    its tail; the logprobs follow the kept response.
    """
    response_keep = np.minimum(response_length, max_length - np.minimum(prompt_length, 1))
    prompt_keep = np.minimum(prompt_length, max_length - response_keep)
    return prompt_keep, response_keep, np.minimum(logprobs_length, response_keep)


@dataclass(frozen=True)
class TrajectoryColumns:
    """The columns a learner needs, ready to gather batches from."""

    prompt: RaggedColumn
    response: RaggedColumn
    logprobs: RaggedColumn
    advantages: npt.NDArray[np.float32]
    rewards: npt.NDArray[np.float32]
    trajectory_ids: list[str]
    loss_mask: RaggedColumn | None = None
    """Per response token, on `response`'s offsets; None: every response token is trained on."""

    @classmethod
    def from_frame(cls, frame: pl.DataFrame) -> TrajectoryColumns:
        """Take prompt/response tokens, logprobs, loss masks (when present), advantage, reward and id."""
        response = RaggedColumn.from_series(frame["response_tokens"])
        return cls(
            prompt=RaggedColumn.from_series(frame["prompt_tokens"]),
            response=response,
            logprobs=RaggedColumn.from_series(frame["response_logprobs"]),
            advantages=frame["advantage"].fill_null(0.0).to_numpy().astype(np.float32),
            rewards=frame["reward"].fill_null(0.0).to_numpy().astype(np.float32),
            trajectory_ids=frame["trajectory_id"].to_list(),
            loss_mask=loss_mask_column(
                frame["loss_mask"] if "loss_mask" in frame.columns else None, response
            ),
        )

    def __len__(self) -> int:
        return len(self.advantages)

    def batch(self, rows: npt.NDArray[np.int64], max_length: int) -> TrajectoryBatch:
        """Build the padded batch of `rows`: prompt ++ response cut to `max_length` tokens.

        The response is what is trained on, so it keeps its head (up to `max_length` - 1 tokens)
        and the prompt keeps its tail, the context nearest the response; at least one prompt
        token stays, since the first position has nothing to predict it. The batch is padded to
        its own longest row, not to `max_length`. Response tokens masked out by `loss_mask` stay
        in `input_ids` and `attention_mask` and leave `response_mask`.
        """
        prompt_length = self.prompt.lengths[rows]
        prompt_keep, response_keep, logprob_keep = kept_pieces(
            prompt_length, self.response.lengths[rows], self.logprobs.lengths[rows], max_length
        )
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
        if self.loss_mask is not None:
            trained = np.ones((len(rows), width), dtype=np.bool_)
            _gather_into(trained, self.loss_mask, rows, response_keep, prompt_keep)
            response_mask &= trained
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
