"""Token-budget batches from stored rows: padded with masks, or packed in the varlen layout.

`plan_batches` groups rows of similar length (sorted by length, cut greedily) so that a padded
batch of at most `token_budget` slots (rows x its longest row) wastes little; a packed batch
holds at most `token_budget` real tokens. `collate` gathers the rows from their chunks.
Packed batches follow flash-attention's varlen convention: one (1, T) sequence of all rows,
`position_ids` restarting at 0 per row, and `cu_seqlens` the int32 cumulative row lengths. In both
layouts `response_mask` leaves out the response tokens whose loss mask is 0 (batching.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, TypedDict

import numpy as np
import numpy.typing as npt
import torch

from consumers.batching import TrajectoryBatch, TrajectoryColumns, kept_pieces
from consumers.replay.chunk import Chunk
from consumers.replay.storage import RowIndex

Layout = Literal["padded", "packed"]


class ReplayBatch(TrajectoryBatch):
    """A padded batch plus what the learner logs and reports back.

    `keys` identify rows for `PrioritizedSampler.update`; `policy_versions` give the lag;
    `padding_waste` is the share of the (rows x width) slots that are padding.
    """

    keys: torch.Tensor
    policy_versions: torch.Tensor
    buckets: list[str]
    domains: list[str]
    task_types: list[str]
    padding_waste: float
    tokens: int


class PackedBatch(TypedDict):
    """All rows back to back in one (1, T) sequence (no padding)."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    cu_seqlens: torch.Tensor
    max_seqlen: int
    response_mask: torch.Tensor
    old_logprobs: torch.Tensor
    advantages: torch.Tensor
    rewards: torch.Tensor
    trajectory_ids: list[str]
    keys: torch.Tensor
    policy_versions: torch.Tensor
    buckets: list[str]
    domains: list[str]
    task_types: list[str]
    padding_waste: float
    tokens: int


def kept_lengths(lengths: npt.NDArray[np.int64], max_length: int) -> npt.NDArray[np.int64]:
    """Row lengths after cutting to `max_length`."""
    return np.minimum(lengths, max_length)


def plan_batches(
    lengths: npt.NDArray[np.int64], *, token_budget: int, layout: Layout, max_waste: float = 0.05
) -> list[npt.NDArray[np.int64]]:
    """Split row indexes 0..n-1 into batches within the token budget, similar lengths together.

    Rows are sorted longest first and cut greedily. Padded: rows x longest row <= budget, and a
    batch ends early rather than take a row shorter than (1 - max_waste) x its longest, so no
    batch wastes more than `max_waste` of its slots on padding. Packed: sum of lengths <= budget.
    A row alone always fits (lengths are cut to max_length <= budget before planning).
    """
    order = np.argsort(-lengths, kind="stable")
    ordered = lengths[order]
    batches: list[npt.NDArray[np.int64]] = []
    start = 0
    n = len(order)
    while start < n:
        if layout == "padded":
            width = max(int(ordered[start]), 1)
            end = min(start + max(token_budget // width, 1), n)
            floor = width * (1.0 - max_waste)
            end = start + 1 + int(np.searchsorted(-ordered[start + 1 : end], -floor, side="right"))
        else:
            cumulative = np.cumsum(ordered[start:])
            end = start + max(int(np.searchsorted(cumulative, token_budget, side="right")), 1)
        batches.append(order[start:end])
        start = end
    return batches


def padded_rows(chunks: Sequence[Chunk], spans: RowSpans) -> TrajectoryBatch:
    """The padded batch of the rows `spans` locates, copied straight from their chunks.

    The same batch as `TrajectoryColumns.batch` over those rows (prompt tail, response head, cut to
    `max_length`). Each kept piece of a row is one slice copy into the batch: rows run to
    hundreds of tokens, so a slice per row and field moves the same bytes as an index per token
    for far less work.
    """
    count = len(spans.total)
    width = max(int(spans.total.max(initial=0)), 1)
    input_ids = np.zeros((count, width), dtype=np.int64)
    old_logprobs = np.zeros((count, width), dtype=np.float32)
    attention_mask = np.zeros((count, width), dtype=np.bool_)
    response_mask = np.zeros((count, width), dtype=np.bool_)
    for i, (c, p0, pk, r0, rk, l0, lk) in enumerate(spans.copies()):
        chunk = chunks[c]
        end = pk + rk
        row = input_ids[i]
        row[:pk] = chunk.prompt.values[p0 : p0 + pk]
        row[pk:end] = chunk.response.values[r0 : r0 + rk]
        old_logprobs[i, pk : pk + lk] = chunk.logprobs.values[l0 : l0 + lk]
        attention_mask[i, :end] = True
        trained = True if chunk.loss_mask is None else chunk.loss_mask.values[r0 : r0 + rk]
        response_mask[i, pk:end] = trained
    return TrajectoryBatch(
        input_ids=torch.from_numpy(input_ids),
        attention_mask=torch.from_numpy(attention_mask),
        response_mask=torch.from_numpy(response_mask),
        old_logprobs=torch.from_numpy(old_logprobs),
        advantages=torch.from_numpy(spans.advantages),
        rewards=torch.from_numpy(spans.rewards),
        trajectory_ids=spans.trajectory_ids.tolist(),
    )


@dataclass(frozen=True)
class RowSpans:
    """Where each selected row's kept pieces lie in its chunk, for a whole batch at once.

    Rows keep the prompt's tail and the response's head, cut to `max_length`: `prompt_from` and
    `prompt_keep` index the chunk's prompt values, `response_from` / `response_keep` and
    `logprobs_from` / `logprobs_keep` likewise; `total` is each row's kept length. Built from the
    storage's `RowIndex` with one gather per field, so no chunk is visited; `domain` and
    `task_type` are codes into the storage's labels.
    """

    chunk_of: npt.NDArray[np.int64]
    prompt_from: npt.NDArray[np.int64]
    prompt_keep: npt.NDArray[np.int64]
    response_from: npt.NDArray[np.int64]
    response_keep: npt.NDArray[np.int64]
    logprobs_from: npt.NDArray[np.int64]
    logprobs_keep: npt.NDArray[np.int64]
    total: npt.NDArray[np.int64]
    advantages: npt.NDArray[np.float32]
    rewards: npt.NDArray[np.float32]
    trajectory_ids: npt.NDArray[np.object_]
    domain: npt.NDArray[np.int64]
    task_type: npt.NDArray[np.int64]

    @classmethod
    def of(cls, rows: RowIndex, positions: npt.NDArray[np.int64], max_length: int) -> RowSpans:
        """The spans of the rows at `positions` of `rows`."""
        prompt_length = rows.prompt_length[positions]
        prompt_keep, response_keep, logprobs_keep = kept_pieces(
            prompt_length, rows.length[positions] - prompt_length, rows.logprobs_length[positions], max_length
        )
        return cls(
            chunk_of=rows.chunk[positions],
            prompt_from=rows.prompt_start[positions] + prompt_length - prompt_keep,
            prompt_keep=prompt_keep,
            response_from=rows.response_start[positions],
            response_keep=response_keep,
            logprobs_from=rows.logprobs_start[positions],
            logprobs_keep=logprobs_keep,
            total=prompt_keep + response_keep,
            advantages=rows.advantage[positions],
            rewards=rows.reward[positions],
            trajectory_ids=rows.trajectory_id[positions],
            domain=rows.domain[positions],
            task_type=rows.task_type[positions],
        )

    def copies(self) -> zip[tuple[int, int, int, int, int, int, int]]:
        """Per row: (chunk, prompt from, prompt kept, response from, response kept, logprobs from, logprobs kept)."""
        return zip(
            self.chunk_of.tolist(),
            self.prompt_from.tolist(),
            self.prompt_keep.tolist(),
            self.response_from.tolist(),
            self.response_keep.tolist(),
            self.logprobs_from.tolist(),
            self.logprobs_keep.tolist(),
            strict=True,
        )


def packed(columns: TrajectoryColumns, max_length: int) -> dict[str, object]:
    """The varlen layout of `columns`' rows, each cut like the padded batch (prompt tail, response head)."""
    return pack(columns.batch(np.arange(len(columns), dtype=np.int64), max_length))


def pack(padded: TrajectoryBatch) -> dict[str, object]:
    """A padded batch in the varlen layout: its rows back to back in one (1, T) sequence."""
    mask = padded["attention_mask"]
    lengths = mask.sum(dim=1)
    rows = np.arange(mask.shape[0])
    cu = torch.zeros(len(rows) + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(lengths, dim=0)
    positions = torch.arange(mask.shape[1]).expand_as(mask)
    return {
        "input_ids": padded["input_ids"][mask][None, :],
        "position_ids": positions[mask][None, :],
        "cu_seqlens": cu,
        "max_seqlen": int(lengths.max()) if len(rows) else 0,
        "response_mask": padded["response_mask"][mask][None, :],
        "old_logprobs": padded["old_logprobs"][mask][None, :],
        "advantages": padded["advantages"],
        "rewards": padded["rewards"],
        "trajectory_ids": padded["trajectory_ids"],
    }
