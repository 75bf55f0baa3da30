"""`ReplayBuffer`: a bounded, tailing replay buffer over the trajectories Delta table.

A background thread follows the table's log and reads only the files each new version added
into a `ChunkStorage` of bounded size. Files are read by a small thread pool (Arrow's Parquet
decoding runs without the GIL), up to `READ_AHEAD_VERSIONS` versions ahead of the rate limiter:
the prefetch.
`sample()` draws a pool of rows with the sampler stack, plans token-budget batches over it,
and hands them out one per call, checking the staleness limit again at delivery time. The
whole position (versions read, files held, sampler and limiter state) is `state_dict()`.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from consumers.exceptions import BufferExhausted, CheckpointError, RateLimitTimeout
from consumers.replay.chunk import Chunk, read_chunk
from consumers.replay.collate import (
    PackedBatch,
    ReplayBatch,
    RowSpans,
    kept_lengths,
    pack,
    padded_rows,
    plan_batches,
)
from consumers.replay.config import ReplayConfig, build_limiter, build_sampler
from consumers.replay.limiters import RateLimiter
from consumers.replay.log import DataFile, TableLog, check_table
from consumers.replay.samplers import SamplerStack
from consumers.replay.storage import ChunkStorage
from consumers.table import _normalize, _start_engines

BUFFER_STATE_VERSION = 1
READ_THREADS = 2
"""Files read at once by the reader's pool."""
READ_AHEAD_VERSIONS = 2
"""Versions whose files are being read or held, not yet inserted (the version inserted next included)."""


class ReplayBuffer:
    """Tails `config.table_uri` into bounded memory and yields token-budget batches.

    Use as a context manager (or call `start()` / `close()`): the reader thread runs between.
    `sample(version)` blocks while the rate limiter or an empty buffer holds it, up to
    `config.sample_timeout_s`, then raises `RateLimitTimeout`; with an end version, once
    everything is read and nothing is left to draw, it raises `BufferExhausted`.
    """

    def __init__(
        self,
        config: ReplayConfig,
        *,
        sampler: SamplerStack | None = None,
        limiter: RateLimiter | None = None,
    ) -> None:
        _start_engines()
        self.config = config
        self.uri = _normalize(config.table_uri)
        self.log = TableLog(self.uri, storage_options=config.storage_options)
        self.profile = config.profile()
        self._bucket_names = np.asarray([*self.profile.names, "other"], dtype=object)  # by storage code
        self.storage = ChunkStorage(
            bucket_names=self.profile.names,
            max_rows=config.capacity_rows,
            max_tokens=config.capacity_tokens,
            eviction=config.eviction,
        )
        self.sampler = sampler if sampler is not None else build_sampler(config, self.profile)
        self.limiter = limiter if limiter is not None else build_limiter(config)
        latest = check_table(self.log)
        self.end_version = config.end_version if (config.end_version is not None or config.follow) else latest
        self.read_to = config.start_version - 1
        self.partial: set[str] = set()
        self.version = 0
        self.fleet_ahead = False
        self.latest_seen = latest
        self._cond = threading.Condition()
        self._pending: deque[npt.NDArray[np.int64]] = deque()
        self._starved = False
        self._finished = False
        self._error: BaseException | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pool: ThreadPoolExecutor | None = None
        self.first_version_read: int | None = None
        self.dropped_rows = {"stale": 0, "evicted": 0}

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> ReplayBuffer:
        """Start the reader thread (once)."""
        if self._thread is None:
            self._pool = ThreadPoolExecutor(READ_THREADS, thread_name_prefix="replay-read")
            self._thread = threading.Thread(target=self._read_loop, name="replay-reader", daemon=True)
            self._thread.start()
        return self

    def close(self) -> None:
        """Stop the reader thread and wait for it."""
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=60)
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> ReplayBuffer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- reading ---------------------------------------------------------------------------

    def _read_loop(self) -> None:
        ahead: deque[tuple[int, list[tuple[DataFile, Future[Chunk]]]]] = deque()
        try:
            while not self._stop.is_set():
                if self.end_version is not None and self.read_to >= self.end_version:
                    break
                latest = self.log.latest_version(known=max(self.latest_seen, self.read_to))
                if latest is not None:
                    self.latest_seen = max(self.latest_seen, latest)
                target = (
                    self.latest_seen if self.end_version is None else min(self.latest_seen, self.end_version)
                )
                if self.read_to >= target:
                    self._stop.wait(self.config.poll_interval_s)
                    continue
                following = ahead[-1][0] + 1 if ahead else self.read_to + 1
                while following <= target and len(ahead) < READ_AHEAD_VERSIONS:
                    ahead.append((following, self._submit(following)))
                    following += 1
                version, reads = ahead.popleft()
                self._insert_version(version, [(file, future.result()) for file, future in reads])
        except BaseException as exc:  # surfaced to the sampling caller
            self._error = exc
        finally:
            for _, reads in ahead:
                for _, future in reads:
                    future.cancel()
            with self._cond:
                self._finished = True
                self._cond.notify_all()

    def _submit(self, version: int) -> list[tuple[DataFile, Future[Chunk]]]:
        """Start reading this reader's files of `version` on the pool, in the log's order."""
        assert self._pool is not None
        files = [
            f
            for f in self.log.added_files(version)
            if f.shard(self.config.num_shards) == self.config.shard and f.path not in self.partial
        ]
        return [(file, self._pool.submit(self._read, file)) for file in files]

    def _insert_version(self, version: int, chunks: list[tuple[DataFile, Chunk]]) -> None:
        """Insert a version's chunks, in order, as the rate limiter allows; then mark it read."""
        # Every file of the version is read before any is inserted, and they are inserted under one
        # hold of the lock unless the limiter makes the reader wait: a version's files are often one
        # per bucket, and a sampler that saw only some of them would draw a mix the version lacks.
        with self._cond:
            for file, chunk in chunks:
                while not self._stop.is_set() and not (self._starved or self.limiter.can_insert(len(chunk))):
                    self.fleet_ahead = True
                    self._cond.wait(0.5)
                if self._stop.is_set():
                    return
                self.fleet_ahead = False
                self._insert(chunk)
                self.partial.add(file.path)
            self.read_to = version
            self.partial.clear()
            if self.first_version_read is None:
                self.first_version_read = version
            self._cond.notify_all()

    def _read(self, file: DataFile) -> Chunk:
        return read_chunk(
            self.uri,
            file,
            statuses=self.config.statuses,
            vocab_size=self.config.vocab_size,
            storage_options=self.config.storage_options,
            use_threads=self._pool is None,  # the pool reads files side by side; load_state_dict does not
        )

    def _insert(self, chunk: Chunk, *, first_seq: int | None = None) -> None:
        """Add a chunk and evict what no longer fits; the caller holds the lock."""
        if len(chunk) == 0:
            return
        count = self.storage.extend(chunk, first_seq=first_seq)
        self.sampler.extend(count, self.storage.rows)
        self.limiter.inserted(count)
        self._starved = False
        alive = self.sampler.eligible(self.storage.rows, self.version)
        if self.storage.over_capacity() or not alive.all():
            victims = self.storage.choose_evictions(alive)
            if victims:
                for i in victims:  # stale: no row of the chunk may be drawn; evicted: over capacity
                    reason = "evicted" if alive[self.storage.rows.chunk == i].any() else "stale"
                    self.dropped_rows[reason] += len(self.storage.chunks[i])
                keep = self.storage.evict(victims)
                self.sampler.keep(keep)
        self._cond.notify_all()

    # -- sampling --------------------------------------------------------------------------

    def sample(
        self, version: int | None = None, *, timeout: float | None = None
    ) -> ReplayBatch | PackedBatch:
        """The next batch at learner version `version` (default: the last one given).

        Raises:
            RateLimitTimeout: nothing could be delivered within the timeout.
            BufferExhausted: a bounded read is done and no row is left to draw.
        """
        wait_s = self.config.sample_timeout_s if timeout is None else timeout
        deadline = time.monotonic() + wait_s
        with self._cond:
            if version is not None:
                self.version = version
            while True:
                if self._error is not None:
                    raise self._error
                chosen = self._deliverable()
                if chosen is not None:
                    break
                if self._finished and not self._pending and (self._starved or not self.limiter.can_sample(1)):
                    raise BufferExhausted(
                        f"read {self.uri!r} to version {self.read_to} (end {self.end_version}) and no row is "
                        f"left to draw ({self.limiter.describe()}): raise max_uses or the end version, or follow"
                    )
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise RateLimitTimeout(self._timeout_message(wait_s))
                self._cond.wait(min(remaining, 1.0))
            positions = chosen
            rows = self.storage.rows
            chunks = list(self.storage.chunks)
            labels = self.storage.labels
            spans = RowSpans.of(rows, positions, self.config.max_length)
            keys = rows.seq[positions]
            policy_versions = rows.policy_version[positions]
            buckets = self._bucket_names[rows.bucket[positions]].tolist()
            self.sampler.delivered(positions, rows, self.version)
            self.limiter.sampled(len(positions))
            self._cond.notify_all()
        return self._collate(chunks, labels, spans, keys, policy_versions, buckets)

    def _deliverable(self) -> npt.NDArray[np.int64] | None:
        """The next planned batch that may go out now, as positions; plans a pool when none is left."""
        rows = self.storage.rows
        planned = False
        while True:
            if not self._pending:
                if planned or not self.limiter.can_sample(1):
                    return None
                self._plan()
                planned = True
                if not self._pending:
                    self._starved = True
                    self._cond.notify_all()
                    return None
            keys = self._pending[0]
            where = np.searchsorted(rows.seq, keys)
            if len(rows):
                # a key past the last row is compared with the last row's key, and differs
                present = rows.seq.take(where, mode="clip") == keys
            else:
                present = np.zeros(len(keys), dtype=bool)
            positions = where[present]
            if len(positions):
                positions = positions[self.sampler.eligible(rows, self.version, positions)]
            if len(positions) == 0:
                self._pending.popleft()  # its rows were evicted or went stale while it waited
                continue
            if not self.limiter.can_sample(len(positions)):
                return None
            self._pending.popleft()
            return positions

    def _plan(self) -> None:
        """Draw a pool of rows worth `pool_batches` batches and split it into batches."""
        rows = self.storage.rows
        if len(rows) == 0:
            return
        lengths = kept_lengths(rows.length, self.config.max_length)
        mean = max(float(lengths.mean()), 1.0)
        per_batch = self.config.token_budget / (
            mean if self.config.layout == "packed" else max(mean * 1.15, 1.0)
        )
        count = max(int(per_batch * self.config.pool_batches), 1)
        positions = self.sampler.draw(rows, self.version, count, drain=self._finished)
        if len(positions) == 0:
            return
        plan = plan_batches(
            lengths[positions], token_budget=self.config.token_budget, layout=self.config.layout
        )
        order = np.random.default_rng(int(rows.seq[positions[0]]) + self.limiter.samples).permutation(
            len(plan)
        )
        self._pending.extend(rows.seq[positions[plan[i]]] for i in order)

    def _collate(
        self,
        chunks: list[Chunk],
        labels: npt.NDArray[np.object_],
        spans: RowSpans,
        keys: npt.NDArray[np.int64],
        policy_versions: npt.NDArray[np.int64],
        buckets: list[str],
    ) -> ReplayBatch | PackedBatch:
        batch = padded_rows(chunks, spans)
        domains, task_types = labels[spans.domain].tolist(), labels[spans.task_type].tolist()
        extra: dict[str, Any] = {
            "keys": torch.from_numpy(keys),
            "policy_versions": torch.from_numpy(policy_versions),
            "buckets": buckets,
            "domains": domains,
            "task_types": task_types,
        }
        if self.config.layout == "packed":
            packed_batch = pack(batch)
            tokens = int(packed_batch["cu_seqlens"][-1])  # type: ignore[index]
            return PackedBatch(**packed_batch, **extra, padding_waste=0.0, tokens=tokens)  # type: ignore[typeddict-item]
        real = int(spans.total.sum())
        waste = 1.0 - real / max(batch["attention_mask"].numel(), 1)
        return ReplayBatch(**batch, **extra, padding_waste=waste, tokens=real)  # type: ignore[typeddict-item]

    def _timeout_message(self, wait_s: float) -> str:
        if len(self.storage) == 0 or self._starved:
            why = (
                f"no row may be drawn ({len(self.storage)} stored, read to version {self.read_to}, "
                f"latest {self.latest_seen}): the fleet is behind the learner, or every row is used up "
                "or past the staleness limit"
            )
        else:
            why = f"the rate limiter holds sampling ({self.limiter.describe()}): the learner is ahead of the fleet"
        return (
            f"waited {wait_s:.0f} s for a batch at learner version {self.version}: {why}; raise "
            "sample_timeout_s, samples_per_insert or max_lag, or let the fleet produce more"
        )

    # -- reporting and checkpoints ---------------------------------------------------------

    def stats(self) -> dict[str, float]:
        """Buffer figures for logging: fill, memory, counters, fleet lead and sampler reports."""
        with self._cond:
            return {
                "buffer_rows": float(len(self.storage)),
                "buffer_tokens": float(self.storage.tokens),
                "buffer_mb": self.storage.chunk_nbytes() / 1e6,
                "read_to_version": float(self.read_to),
                "versions_behind": float(max(self.latest_seen - self.read_to, 0)),
                "fleet_ahead": float(self.fleet_ahead),
                "inserts": float(self.limiter.inserts),
                "samples": float(self.limiter.samples),
                "evicted_rows": float(self.storage.evicted_rows),
                **self.sampler.report(),
            }

    def state_dict(self) -> dict[str, Any]:
        """The buffer's position: versions read, files held, sampler and limiter state."""
        with self._cond:
            return {
                "version": BUFFER_STATE_VERSION,
                "table_uri": self.uri,
                "shard": (self.config.shard, self.config.num_shards),
                "read_to": self.read_to,
                "partial": sorted(self.partial),
                "first_version_read": self.first_version_read,
                "learner_version": self.version,
                "storage": self.storage.state_dict(),
                "sampler": self.sampler.state_dict(),
                "limiter": self.limiter.state_dict(),
            }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a `state_dict()` before `start()`: re-reads the files it held, then the state."""
        if self._thread is not None:
            raise CheckpointError("load_state_dict must run before start(): the reader thread is running")
        if state.get("version") != BUFFER_STATE_VERSION:
            raise CheckpointError(
                f"replay buffer state has schema version {state.get('version')!r}, this rollstream "
                f"reads {BUFFER_STATE_VERSION}"
            )
        if state["table_uri"] != self.uri or tuple(state["shard"]) != (
            self.config.shard,
            self.config.num_shards,
        ):
            raise CheckpointError(
                f"the checkpoint read {state['table_uri']!r} as shard {tuple(state['shard'])}, this run "
                f"reads {self.uri!r} as shard {(self.config.shard, self.config.num_shards)}: resume "
                "with the same table and ranks x workers, or start a fresh checkpoint"
            )
        with self._cond:
            for path, version, partition_values, first_seq in state["storage"]["files"]:
                file = DataFile(
                    path=path, version=version, partition_values=tuple(map(tuple, partition_values))
                )
                self.storage.extend(self._read(file), first_seq=first_seq)
            if len(self.storage) != state["storage"]["rows"]:
                raise CheckpointError(
                    f"re-reading the checkpoint's {len(state['storage']['files'])} files gave "
                    f"{len(self.storage)} rows, the checkpoint held {state['storage']['rows']}: were "
                    "the statuses or the table changed? resume with the same settings"
                )
            self.storage._next_seq = int(state["storage"]["next_seq"])
            self.storage.evicted_rows = int(state["storage"]["evicted_rows"])
            self.sampler.extend(len(self.storage), self.storage.rows)
            self.sampler.load_state_dict(state["sampler"])
            self.limiter.load_state_dict(state["limiter"])
            self.read_to = int(state["read_to"])
            self.partial = set(state["partial"])
            self.first_version_read = state["first_version_read"]
            self.version = int(state["learner_version"])
