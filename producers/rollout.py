"""The rollout worker: take a task, generate its group through a backend, publish it, then ack.

A task is acknowledged only after Kafka acknowledged every sample of its group, so a worker that
dies at any point leaves the task to be delivered again (its lease runs out). A failed generation
or publication releases the task for a retry (`Lease.fail`, which dead-letters it after the last
attempt); a clean stop requeues what is in flight without using an attempt (`Lease.requeue`).

Every sample carries its `task_id`, the attempt, the policy version(s) that made it and the
worker id. The group id derives from (task id, attempt), so an attempt is one group and a group
never mixes attempts; the Kafka key is the task id, so every attempt lands on one partition.

Off-policy control at the source: with `max_lag` set, a task is started only while the
backend's weights lag the newest published version by less than `max_lag`, so its samples
arrive no staler than the replay buffer admits.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import math
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, Protocol

from producers.aio import AsyncPublisher
from producers.backends.base import GeneratedSample, GenerationBackend, SamplingParams, Tokenizer
from producers.tasks.lease import Lease
from producers.tasks.queue import TaskQueue
from schemas import pack_float32, pack_int32
from schemas.task import Task

log = logging.getLogger(__name__)

GROUP_NAMESPACE = uuid.UUID("6f1c0d52-6a53-4c38-9d0b-6c1a9e6a4f21")
WeightChange = Literal["finish", "abort"]


class VersionSource(Protocol):
    """Where the newest published policy version is read (the policies table, or set by hand)."""

    def newest(self) -> int | None: ...


@dataclass
class FixedVersion:
    """A newest version set by hand (None: unknown, so no lag limit applies)."""

    version: int | None = None

    def newest(self) -> int | None:
        return self.version


def group_id_of(task_id: str, attempt: int) -> str:
    """The group id of one attempt of a task: the same on every worker, different per attempt."""
    return str(uuid.uuid5(GROUP_NAMESPACE, f"{task_id}\x00{attempt}"))


@dataclass(frozen=True)
class RolloutOptions:
    """How a rollout worker runs.

    Attributes:
        worker_id: stamped on every sample and outcome.
        concurrency: tasks generated at once.
        max_lag: start a task only while newest - backend version < max_lag; None: no limit.
        on_weight_change: 'finish' keeps in-flight samples on the versions that made them (their
            spans say so); 'abort' requeues the task when a sample's weights changed mid-way.
        vocab_size: token ids must be below it; None: the backend's model says, else unchecked.
        take_timeout_s: how long one take waits for a task.
        lag_wait_s: how long to wait before looking at the versions again when at the limit.
    """

    worker_id: str
    concurrency: int = 4
    max_lag: int | None = None
    on_weight_change: WeightChange = "finish"
    vocab_size: int | None = None
    take_timeout_s: float = 1.0
    lag_wait_s: float = 0.2

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError(f"concurrency = {self.concurrency}; give at least 1")
        if self.max_lag is not None and self.max_lag < 1:
            raise ValueError(
                f"max_lag = {self.max_lag}; give at least 1 (a task is not started at the limit, so 0 "
                "would start none) or None for no limit"
            )
        if self.on_weight_change not in ("finish", "abort"):
            raise ValueError(f"on_weight_change = {self.on_weight_change!r}; give 'finish' or 'abort'")


@dataclass
class RolloutStats:
    """What a worker did so far."""

    started: int = 0
    done: int = 0
    failed: int = 0
    dead: int = 0
    requeued: int = 0
    samples: int = 0
    lag_waits: int = 0
    generate_s: list[float] = field(default_factory=list)


class BadGenerationError(Exception):
    """A group the backend returned cannot be published (ids outside the vocabulary, wrong count)."""


class RolloutWorker:
    """Takes tasks from a `TaskQueue`, generates through a `GenerationBackend`, publishes.

    Args:
        queue: the task queue (share groups); its calls run on one thread of their own.
        backend: generates a group of n samples for a prompt.
        publisher: an `AsyncPublisher` to rollouts.raw (ultra-long samples to rollouts.ultra).
        options: `RolloutOptions`.
        versions: the newest published version, for `max_lag`.
        tokenizer: turns a text prompt into ids once (and ids into text when the backend gives
            none); None: text prompts go to the backend's tokenize endpoint, if it has one.
        progress: called with one line per settled task.
    """

    def __init__(
        self,
        queue: TaskQueue,
        backend: GenerationBackend,
        publisher: AsyncPublisher,
        options: RolloutOptions,
        *,
        versions: VersionSource | None = None,
        tokenizer: Tokenizer | None = None,
        progress: Callable[[str], None] | None = None,
    ) -> None:
        self.queue, self.backend, self.publisher, self.options = queue, backend, publisher, options
        self.versions = versions or FixedVersion()
        self.tokenizer = tokenizer
        self.progress = progress
        self.stats = RolloutStats()
        self._queue_thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="task-queue")
        self._in_flight: set[asyncio.Task[None]] = set()
        self._vocab_size: int | None = options.vocab_size

    async def run(self, stop: asyncio.Event, *, max_tasks: int | None = None) -> RolloutStats:
        """Work until `stop` is set (or `max_tasks` were settled); then requeue what is in flight."""
        if self._vocab_size is None:
            self._vocab_size = (await self.backend.model_info()).vocab_size
        try:
            while not stop.is_set() and (max_tasks is None or self._taken() < max_tasks):
                room = self.options.concurrency - len(self._in_flight)
                if max_tasks is not None:
                    room = min(room, max_tasks - self._taken())
                if room < 1:
                    await self._wait_one(stop)
                    continue
                if not await self._may_start():
                    self.stats.lag_waits += 1
                    await _sleep_or_stop(stop, self.options.lag_wait_s)
                    continue
                leases = await self._call(self.queue.take, room, self.options.take_timeout_s)
                for lease in leases:
                    self.stats.started += 1
                    job = asyncio.create_task(self._work(lease, stop))
                    self._in_flight.add(job)
                    job.add_done_callback(self._in_flight.discard)
            for job in self._in_flight:  # a stop: generations end now, their tasks are requeued
                job.cancel()
            if self._in_flight:
                await asyncio.gather(*self._in_flight, return_exceptions=True)
        finally:
            self._queue_thread.shutdown(wait=True)
        return self.stats

    def _taken(self) -> int:
        return self.stats.started

    async def _wait_one(self, stop: asyncio.Event) -> None:
        stopped = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait({*self._in_flight, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()

    async def _may_start(self) -> bool:
        if self.options.max_lag is None:
            return True
        newest = self.versions.newest()
        if newest is None:
            return True
        return newest - await self.backend.current_version() < self.options.max_lag

    async def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._queue_thread, fn, *args)

    async def _work(self, lease: Lease, stop: asyncio.Event) -> None:
        task = lease.task
        try:
            prompt, samples = await self._generate(task)
        except asyncio.CancelledError:  # a stop while generating: back to the queue, no attempt used
            await self._settle(lease, "requeue")
            return
        except Exception as exc:  # this attempt failed: release it for a retry
            await self._settle(lease, "fail", _describe(exc))
            return
        if stop.is_set() or (self.options.on_weight_change == "abort" and _changed(samples)):
            await self._settle(lease, "requeue")
            return
        records = [self._record(task, lease.attempt, prompt, i, s) for i, s in enumerate(samples)]
        # Once a sample may be in Kafka the attempt is finished, never requeued: a requeued copy
        # would reuse this attempt's number and so its group id.
        publishing = asyncio.ensure_future(self._publish(records))
        try:
            await asyncio.shield(publishing)
        except asyncio.CancelledError:
            await asyncio.wait({publishing})
        if publishing.exception() is not None:
            await self._settle(lease, "fail", _describe(publishing.exception()))
        else:
            await self._settle(lease, "done")

    async def _generate(self, task: Task) -> tuple[list[int], list[GeneratedSample]]:
        prompt = await self._prompt_ids(task)
        started = time.monotonic()
        samples = await self.backend.generate(prompt, _sampling(task))
        self.stats.generate_s.append(time.monotonic() - started)
        self._check(task, samples)
        return prompt, samples

    async def _settle(self, lease: Lease, how: str, error: str = "") -> None:
        try:
            if how == "done":
                await self._call(lease.done)
                self.stats.done += 1
            elif how == "requeue":
                await self._call(lease.requeue)
                self.stats.requeued += 1
            else:
                state = await self._call(lease.fail, error)
                self.stats.dead += state == "dead"
                self.stats.failed += state != "dead"
        except Exception as exc:  # an expired lock: the broker delivers the task again
            log.warning("settling task %s (%s) failed: %s", lease.task_id, how, exc)
            self.stats.failed += 1
        if self.progress is not None:
            s = self.stats
            self.progress(
                f"task {lease.task_id} attempt {lease.attempt}: {how}; done {s.done}, failed {s.failed}, "
                f"dead {s.dead}, requeued {s.requeued}, in flight {len(self._in_flight) - 1}"
            )

    async def _prompt_ids(self, task: Task) -> list[int]:
        if task.prompt_text is None:
            return [int(t) for t in task.prompt_ids]
        if self.tokenizer is not None:
            return list(self.tokenizer.encode(task.prompt_text))
        tokenize = getattr(self.backend, "tokenize", None)
        if tokenize is None:
            raise BadGenerationError(
                f"task {task.task_id} has a text prompt, and neither a tokenizer file nor the backend's "
                "tokenize endpoint is available: give --tokenizer or submit token ids"
            )
        return list(await tokenize(task.prompt_text))

    def _check(self, task: Task, samples: Sequence[GeneratedSample]) -> None:
        if len(samples) != task.group_size:
            raise BadGenerationError(
                f"the backend returned {len(samples)} samples for a group of {task.group_size}"
            )
        for sample in samples:
            if len(sample.token_ids) != len(sample.logprobs):
                raise BadGenerationError(
                    f"{len(sample.token_ids)} token ids but {len(sample.logprobs)} logprobs: refusing a misaligned sample"
                )
            if len(sample.token_ids) > task.max_tokens:
                raise BadGenerationError(
                    f"{len(sample.token_ids)} tokens, over the task's max_tokens {task.max_tokens}"
                )
            if not all(math.isfinite(x) for x in sample.logprobs):
                raise BadGenerationError("a logprob is not finite")
            vocab = self._vocab_size
            if vocab is not None and any(not 0 <= t < vocab for t in sample.token_ids):
                raise BadGenerationError(f"a token id lies outside the model's vocabulary [0, {vocab})")

    def _record(
        self, task: Task, attempt: int, prompt: list[int], index: int, sample: GeneratedSample
    ) -> dict[str, Any]:
        group_id = group_id_of(task.task_id, attempt)
        spans = [{"start": s.start, "end": s.end, "version": s.version} for s in sample.weight_versions]
        text = sample.text
        if text is None and self.tokenizer is not None:
            text = self.tokenizer.decode(sample.token_ids)
        return {
            "trajectory_id": str(uuid.uuid5(uuid.UUID(group_id), str(index))),
            "group_id": group_id,
            "sample_index": index,
            "group_size": task.group_size,
            "domain": task.domain,
            "task_type": task.task_type,
            "policy_version": sample.policy_version,
            "prompt_tokens": pack_int32(prompt),
            "response_tokens": pack_int32(sample.token_ids),
            "response_logprobs": pack_float32(sample.logprobs),
            "response_text": text or "",
            "finish_reason": sample.finish_reason,
            "expected_answer": task.expected_answer,
            "unit_tests": task.unit_tests,
            "gold_fields": None if task.gold_fields is None else dict(task.gold_fields),
            "task_id": task.task_id,
            "attempt": attempt,
            "version_spans": spans if len(spans) > 1 else None,
            "logprob_mode": sample.logprob_mode,
            "worker_id": self.options.worker_id,
            "created_at": datetime.now(UTC),
            "metadata": {
                "priority": str(task.priority),
                "sampling": json.dumps(_sampling_fields(sample.sampling), sort_keys=True),
            },
        }

    async def _publish(self, records: list[dict[str, Any]]) -> None:
        futures = [await self.publisher.publish(record) for record in records]
        results = await asyncio.gather(*futures)
        failed = [r for r in results if not r.ok]
        if failed:
            raise BadGenerationError(
                f"{len(failed)} of {len(records)} samples were not acknowledged by Kafka: {failed[0].error}"
            )
        self.stats.samples += len(records)


def _sampling(task: Task) -> SamplingParams:
    return SamplingParams(
        temperature=task.temperature,
        top_p=task.top_p,
        top_k=task.top_k,
        max_tokens=task.max_tokens,
        seed=task.seed,
        n=task.group_size,
    )


def _sampling_fields(params: SamplingParams) -> dict[str, Any]:
    return {
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k,
        "max_tokens": params.max_tokens,
        "seed": params.seed,
    }


def _describe(exc: BaseException | None) -> str:
    return f"{type(exc).__name__}: {exc}"


def _changed(samples: Sequence[GeneratedSample]) -> bool:
    return any(len(s.weight_versions) > 1 for s in samples)


async def _sleep_or_stop(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)
