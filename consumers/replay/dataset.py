"""`ReplayDataset`: the replay buffer as a torch IterableDataset, sharded by file.

Each (rank, DataLoader worker) pair builds its own buffer over its own share of the table's
data files (a stable hash of each file's path): under torch.distributed and with several
workers the shares are disjoint and together cover every file. Workers must be spawned, not
forked (HAZARDS.md: deltalake and polars do not survive fork); `replay_loader` does that.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import torch.distributed as dist
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from consumers.exceptions import BufferExhausted
from consumers.replay.buffer import ReplayBuffer
from consumers.replay.collate import PackedBatch, ReplayBatch
from consumers.replay.config import ReplayConfig


class ReplayDataset(IterableDataset[ReplayBatch | PackedBatch]):
    """Yields the batches of this rank x worker's buffer until it is exhausted or `max_batches`.

    The learner version that staleness is measured against is `learner_version.value` when a
    shared value is given (e.g. a spawn-context `multiprocessing.Value('q')` the training loop
    increments), else the number of batches this iterator has yielded.

    Args:
        config: the buffer's settings; `shard` / `num_shards` are set here per rank x worker.
        max_batches: stop after this many batches per shard; None until exhausted.
        rank / world_size: default from torch.distributed when it is initialized, else 0 / 1.
        learner_version: a shared integer value, or None.
    """

    def __init__(
        self,
        config: ReplayConfig,
        *,
        max_batches: int | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        learner_version: Any = None,
    ) -> None:
        super().__init__()
        initialized = dist.is_available() and dist.is_initialized()
        self.config = config
        self.max_batches = max_batches
        self.rank = rank if rank is not None else (dist.get_rank() if initialized else 0)
        self.world_size = (
            world_size if world_size is not None else (dist.get_world_size() if initialized else 1)
        )
        self.learner_version = learner_version

    def shard_config(self) -> ReplayConfig:
        """This process's share: shard rank * workers + worker of world_size * workers."""
        worker = get_worker_info()
        worker_id, workers = (worker.id, worker.num_workers) if worker is not None else (0, 1)
        return replace(
            self.config, shard=self.rank * workers + worker_id, num_shards=self.world_size * workers
        )

    def __iter__(self) -> Iterator[ReplayBatch | PackedBatch]:
        with ReplayBuffer(self.shard_config()) as buffer:
            yielded = 0
            while self.max_batches is None or yielded < self.max_batches:
                version = int(self.learner_version.value) if self.learner_version is not None else yielded
                try:
                    batch = buffer.sample(version)
                except BufferExhausted:
                    return
                yield batch
                yielded += 1


def replay_loader(
    dataset: ReplayDataset, *, num_workers: int = 0, timeout: float = 0, prefetch_factor: int | None = None
) -> DataLoader[ReplayBatch | PackedBatch]:
    """A DataLoader over `dataset` (it batches itself) whose workers are spawned, never forked."""
    return DataLoader(
        dataset,
        batch_size=None,
        num_workers=num_workers,
        multiprocessing_context="spawn" if num_workers > 0 else None,
        timeout=timeout,
        prefetch_factor=prefetch_factor if num_workers > 0 else None,
    )
