"""`ChunkStorage`: the replay buffer's rows in memory, bounded in rows or tokens.

Rows live in chunks (one per data file, as read); a flat index of per-row metadata over all
chunks is what samplers see. Eviction drops whole chunks, so memory is returned at once:
first chunks in which no row may be drawn again (used up, or past the staleness limit), then
oldest-first (insertion order) or stalest-first (lowest policy_version) until within capacity.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from consumers.replay.chunk import Chunk

Eviction = Literal["oldest", "stalest"]
STORAGE_STATE_VERSION = 1


@dataclass
class RowIndex:
    """Per-row metadata of every stored row, aligned; position i is row i of the buffer.

    `bucket` is a code into the storage's bucket names, with len(names) for a name not among them;
    `domain` and `task_type` are codes into the storage's `labels`.
    `prompt_start`, `response_start` and `logprobs_start` are where the row's values begin in its
    chunk's flat token columns; with `prompt_length` and `logprobs_length` (the response's is
    `length - prompt_length`) a batch finds every row's tokens without visiting its chunk.
    """

    chunk: npt.NDArray[np.int64]
    seq: npt.NDArray[np.int64]
    policy_version: npt.NDArray[np.int64]
    length: npt.NDArray[np.int64]
    bucket: npt.NDArray[np.int64]
    advantage: npt.NDArray[np.float32]
    reward: npt.NDArray[np.float32]
    prompt_start: npt.NDArray[np.int64]
    prompt_length: npt.NDArray[np.int64]
    response_start: npt.NDArray[np.int64]
    logprobs_start: npt.NDArray[np.int64]
    logprobs_length: npt.NDArray[np.int64]
    trajectory_id: npt.NDArray[np.object_]
    domain: npt.NDArray[np.int64]
    task_type: npt.NDArray[np.int64]

    @classmethod
    def empty(cls) -> RowIndex:
        i64 = np.zeros(0, dtype=np.int64)
        f32 = np.zeros(0, dtype=np.float32)
        ids = np.zeros(0, dtype=object)
        return cls(i64, i64, i64, i64, i64, f32, f32, i64, i64, i64, i64, i64, ids, i64, i64)

    @classmethod
    def of_chunk(
        cls,
        chunk: Chunk,
        *,
        position: int,
        first_seq: int,
        bucket: npt.NDArray[np.int64],
        labels: npt.NDArray[np.int64],
    ) -> RowIndex:
        """The index of a chunk's rows, the chunk stored at `position`, keys from `first_seq` on.

        `labels` maps the chunk's domain and task type codes (`Chunk.labels`) to the storage's.
        """
        count = len(chunk)
        prompt, response, logprobs = chunk.prompt.offsets, chunk.response.offsets, chunk.logprobs.offsets
        return cls(
            chunk=np.full(count, position, dtype=np.int64),
            seq=np.arange(first_seq, first_seq + count, dtype=np.int64),
            policy_version=chunk.policy_version,
            length=chunk.lengths,
            bucket=bucket,
            advantage=chunk.advantage,
            reward=chunk.reward,
            prompt_start=prompt[:-1],
            prompt_length=np.diff(prompt),
            response_start=response[:-1],
            logprobs_start=logprobs[:-1],
            logprobs_length=np.diff(logprobs),
            trajectory_id=chunk.trajectory_ids,
            domain=labels[chunk.domain],
            task_type=labels[len(chunk.domains) + chunk.task_type],
        )

    def __len__(self) -> int:
        return len(self.seq)

    def _arrays(self) -> dict[str, np.ndarray]:
        return dict(vars(self))

    def appended(self, other: RowIndex) -> RowIndex:
        mine, theirs = self._arrays(), other._arrays()
        return RowIndex(**{k: np.concatenate([mine[k], theirs[k]]) for k in mine})

    def kept(self, keep: npt.NDArray[np.bool_]) -> RowIndex:
        return RowIndex(**{k: v[keep] for k, v in self._arrays().items()})


class ChunkStorage:
    """Chunks of rows with a capacity in rows and/or tokens.

    Args:
        bucket_names: the profile's bucket names, in order (codes index into them).
        max_rows: most rows held; None for no row bound.
        max_tokens: most prompt + response tokens held; None for no token bound.
        eviction: "oldest" (insertion order) or "stalest" (lowest policy_version first).
    """

    def __init__(
        self,
        *,
        bucket_names: Sequence[str],
        max_rows: int | None = 100_000,
        max_tokens: int | None = None,
        eviction: Eviction = "oldest",
    ) -> None:
        if max_rows is not None and max_rows < 1:
            raise ValueError(f"max_rows must be at least 1 or None, got max_rows={max_rows}")
        if max_tokens is not None and max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1 or None, got max_tokens={max_tokens}")
        if eviction not in ("oldest", "stalest"):
            raise ValueError(f"eviction must be 'oldest' or 'stalest', got eviction={eviction!r}")
        self.bucket_names = tuple(bucket_names)
        self.max_rows = max_rows
        self.max_tokens = max_tokens
        self.eviction = eviction
        self.chunks: list[Chunk] = []
        self.rows = RowIndex.empty()
        self.labels = np.zeros(0, dtype=object)
        """Domain and task type names by the code `RowIndex.domain` / `task_type` hold."""
        self._label_codes: dict[str, int] = {}
        self.tokens = 0
        self._next_seq = 0
        self.evicted_rows = 0

    def __len__(self) -> int:
        return len(self.rows)

    def extend(self, chunk: Chunk, *, first_seq: int | None = None) -> int:
        """Add a chunk's rows at the end; returns how many. `first_seq` restores a checkpoint's keys."""
        count = len(chunk)
        if first_seq is not None:
            self._next_seq = first_seq
        names, inverse = np.unique(chunk.bucket.astype(str), return_inverse=True)
        codes = {name: i for i, name in enumerate(self.bucket_names)}
        name_codes = np.asarray([codes.get(str(n), len(self.bucket_names)) for n in names], dtype=np.int64)
        added = RowIndex.of_chunk(
            chunk,
            position=len(self.chunks),
            first_seq=self._next_seq,
            bucket=name_codes[inverse.reshape(-1)],
            labels=self._codes_of((*chunk.domains, *chunk.task_types)),
        )
        self._next_seq += count
        self.chunks.append(chunk)
        self.rows = self.rows.appended(added)
        self.tokens += chunk.tokens
        return count

    def _codes_of(self, names: Sequence[str]) -> npt.NDArray[np.int64]:
        """The storage's codes for `names`, adding the names it has not seen to `labels`."""
        new = [n for n in dict.fromkeys(names) if n not in self._label_codes]
        if new:
            for name in new:
                self._label_codes[name] = len(self._label_codes)
            self.labels = np.asarray(list(self._label_codes), dtype=object)
        return np.asarray([self._label_codes[n] for n in names], dtype=np.int64)

    def over_capacity(self) -> bool:
        """Whether the stored rows or tokens exceed a bound."""
        return (self.max_rows is not None and len(self.rows) > self.max_rows) or (
            self.max_tokens is not None and self.tokens > self.max_tokens
        )

    def choose_evictions(self, alive: npt.NDArray[np.bool_]) -> list[int]:
        """Chunks (positions) to drop: those without an alive row, then by policy until within capacity."""
        per_chunk_alive = np.bincount(self.rows.chunk[alive], minlength=len(self.chunks))
        dead = [i for i in range(len(self.chunks)) if per_chunk_alive[i] == 0]
        rows, tokens = len(self.rows), self.tokens
        for i in dead:
            rows -= len(self.chunks[i])
            tokens -= self.chunks[i].tokens
        candidates = [i for i in range(len(self.chunks)) if i not in set(dead)]
        if self.eviction == "stalest":
            candidates.sort(key=lambda i: (int(self.chunks[i].policy_version.max(initial=0)), i))
        chosen = list(dead)
        for i in candidates[:-1]:  # the newest chunk always stays
            if not (
                (self.max_rows is not None and rows > self.max_rows)
                or (self.max_tokens is not None and tokens > self.max_tokens)
            ):
                break
            chosen.append(i)
            rows -= len(self.chunks[i])
            tokens -= self.chunks[i].tokens
        return sorted(chosen)

    def evict(self, positions: Sequence[int]) -> npt.NDArray[np.bool_]:
        """Drop the chunks at `positions`; returns the keep mask over the former rows."""
        drop = set(positions)
        keep = ~np.isin(self.rows.chunk, np.asarray(sorted(drop), dtype=np.int64))
        renumber = np.cumsum([0 if i in drop else 1 for i in range(len(self.chunks))]) - 1
        for i in drop:
            self.tokens -= self.chunks[i].tokens
        self.evicted_rows += int((~keep).sum())
        self.chunks = [c for i, c in enumerate(self.chunks) if i not in drop]
        self.rows = self.rows.kept(keep)
        self.rows.chunk = renumber[self.rows.chunk].astype(np.int64)
        return keep

    def chunk_nbytes(self) -> int:
        """Memory held by stored token columns."""
        return sum(c.nbytes for c in self.chunks)

    def state_dict(self) -> dict[str, Any]:
        """Which files are held, in order; rows are re-read from them on load."""
        return {
            "version": STORAGE_STATE_VERSION,
            "files": [
                (
                    c.file.path,
                    c.file.version,
                    c.file.partition_values,
                    int(self.rows.seq[self.rows.chunk == i][0]),
                )
                for i, c in enumerate(self.chunks)
            ],
            "rows": len(self.rows),
            "next_seq": self._next_seq,
            "evicted_rows": self.evicted_rows,
        }
