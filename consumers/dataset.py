"""`TrajectoryDataset`: padded torch batches from one version of the trajectories table.

This is the thin first step toward the replay buffer of ARCHITECTURE.md: it reads one pinned
table version, filters by verifier status, optionally shuffles, and shards rows across
DataLoader workers. Tailing new versions, samplers (staleness, profile mix, priority),
token-budget batches, bounded memory and checkpoints come later; today each worker holds the
columns it needs for the whole snapshot in memory.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import numpy as np
import numpy.typing as npt
import polars as pl
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from consumers.batching import TrajectoryBatch, TrajectoryColumns
from consumers.table import TableSnapshot, open_snapshot

LEARNER_COLUMNS = [
    "trajectory_id",
    "prompt_tokens",
    "response_tokens",
    "response_logprobs",
    "advantage",
    "reward",
]
_ORDER_COLUMNS = ["topic", "partition", "offset", "trajectory_id"]
_TOKEN_COLUMNS = ["prompt_tokens", "response_tokens", "response_logprobs"]


class TrajectoryDataset(IterableDataset[TrajectoryBatch]):
    """Yields `TrajectoryBatch` dicts of torch tensors from one trajectories table version.

    Rows are ordered by their Kafka coordinates (then shuffled with `shuffle_seed`, unless it is
    None), so every DataLoader worker computes the same order and takes every
    `num_workers`-th row of it: the workers' shares are disjoint and cover the snapshot. Use
    `trajectory_loader(dataset, num_workers=...)`, or a `DataLoader` with `batch_size=None` (the
    dataset batches itself) and `multiprocessing_context='spawn'`: deltalake and polars do not
    survive fork (consumers/table.py). Call `set_epoch` before each pass for a fresh shuffle.

    Args:
        table_uri: the trajectories table, e.g. `<lake>/trajectories`.
        batch_size: rows per batch (each worker's last batch may be smaller).
        max_length: prompt ++ response tokens are cut to this many.
        version: table version to read; None pins the latest at construction.
        statuses: keep only rows whose `verifier_status` is one of these.
        shuffle_seed: seed of the row permutation; None keeps Kafka order.
        storage_options: passed through to deltalake and polars (object stores).
    """

    def __init__(
        self,
        *,
        table_uri: str,
        batch_size: int = 16,
        max_length: int = 2048,
        version: int | None = None,
        statuses: Sequence[str] = ("ok", "fail"),
        shuffle_seed: int | None = 0,
        storage_options: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__()
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got batch_size={batch_size}")
        if max_length < 1:
            raise ValueError(f"max_length must be at least 1, got max_length={max_length}")
        if shuffle_seed is not None and shuffle_seed < 0:
            raise ValueError(f"shuffle_seed must be >= 0 or None, got shuffle_seed={shuffle_seed}")
        if isinstance(statuses, str) or not statuses:
            raise ValueError(
                f"statuses must be a non-empty sequence of verifier statuses such as "
                f"('ok', 'fail'), got statuses={statuses!r}"
            )
        self.snapshot: TableSnapshot = open_snapshot(
            table_uri, version=version, storage_options=storage_options
        )
        self.batch_size = batch_size
        self.max_length = max_length
        self.statuses = tuple(statuses)
        self.shuffle_seed = shuffle_seed
        self.epoch = 0

    @property
    def version(self) -> int:
        """The table version this dataset reads."""
        return self.snapshot.version

    def set_epoch(self, epoch: int) -> None:
        """Choose the shuffle of the next pass (same seed and epoch, same order)."""
        self.epoch = epoch

    def count_rows(self) -> int:
        """How many rows of the snapshot pass the status filter (reads one small column)."""
        counted = self.scan_rows().select(pl.len()).collect()
        return int(counted.item())

    def __iter__(self) -> Iterator[TrajectoryBatch]:
        frame = self.scan_rows().sort(_ORDER_COLUMNS, maintain_order=True).select(LEARNER_COLUMNS).collect()
        columns = TrajectoryColumns.from_frame(frame)
        order = self._shard(self._order(len(columns)))
        for start in range(0, len(order), self.batch_size):
            yield columns.batch(order[start : start + self.batch_size], self.max_length)

    def scan_rows(self) -> pl.LazyFrame:
        """The snapshot's rows that pass the status filter and carry tokens, lazily."""
        token_present = [pl.col(name).is_not_null() for name in _TOKEN_COLUMNS]
        return self.snapshot.scan().filter(
            pl.col("verifier_status").is_in(list(self.statuses)), *token_present
        )

    def _order(self, count: int) -> npt.NDArray[np.int64]:
        if self.shuffle_seed is None:
            return np.arange(count, dtype=np.int64)
        rng = np.random.default_rng([self.shuffle_seed, self.epoch])
        return rng.permutation(count).astype(np.int64)

    @staticmethod
    def _shard(order: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        worker = get_worker_info()
        if worker is None:
            return order
        return order[worker.id :: worker.num_workers]


def trajectory_loader(
    dataset: TrajectoryDataset, *, num_workers: int = 0, timeout: float = 0
) -> DataLoader[TrajectoryBatch]:
    """A DataLoader over `dataset` whose workers are spawned, never forked.

    Workers are started per pass (not persistent), so `set_epoch` in this process reaches them;
    each spawned worker pays an interpreter start and the torch/polars imports (seconds).
    """
    return DataLoader(
        dataset,
        batch_size=None,
        num_workers=num_workers,
        multiprocessing_context="spawn" if num_workers > 0 else None,
        timeout=timeout,
    )
