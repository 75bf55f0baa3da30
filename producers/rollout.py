"""The rollout worker: take a task, generate its group through a backend, publish it, then ack.

A task is acknowledged only after Kafka acknowledged every sample of its group, so a worker that
dies at any point leaves the task to be delivered again (its lease runs out). A failed generation
or publication releases the task for a retry (`Lease.fail`, which dead-letters it after the last
attempt); a clean stop requeues what is in flight without using an attempt (`Lease.requeue`).
An attempt that outlasts its task's deadline fails, so the lease never runs out under it.

Every sample carries its `task_id`, the attempt, the policy version(s) that made it and the
worker id. The group id derives from (task id, attempt), so an attempt is one group and a group
never mixes attempts; the Kafka key is the task id, so every attempt lands on one partition.

Off-policy control at the source: with `max_lag` set, a task is started only while the
backend's weights lag the newest published version by less than `max_lag`, so its samples
arrive no staler than the replay buffer admits.

With an `Environment`, a sample is a multi-turn episode: the environment's tokens are inserted
between policy turns and masked out of the loss (`loss_mask` 0, logprob 0.0).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import json
import logging
import math
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Literal, NamedTuple, Protocol

from producers.aio import AsyncPublisher
from producers.backends.base import (
    GeneratedSample,
    GenerationBackend,
    SamplingParams,
    Tokenizer,
    VersionSpan,
)
from producers.backends.exceptions import TokenizerMismatchError
from producers.lanes import Lane
from producers.rollout_metrics import RolloutMetrics
from producers.tasks.lease import Lease
from producers.tasks.queue import TaskQueue
from schemas import pack_float32, pack_int32, pack_mask
from schemas.defaults import RolloutDefaults
from schemas.task import Task

log = logging.getLogger(__name__)

GROUP_NAMESPACE = uuid.UUID("6f1c0d52-6a53-4c38-9d0b-6c1a9e6a4f21")
WeightChange = Literal["finish", "abort"]
Step = Literal["taken", "publishing", "published"]
StepHook = Callable[[Step, Lease, int], None]
"""A test and debugging hook: ("taken", lease, 0) when a task is taken, ("publishing", lease, i)
before sample i is handed to the publisher, ("published", lease, n) once Kafka acknowledged all n,
before the task is acknowledged."""


class VersionSource(Protocol):
    """Where the newest published policy version is read (the policies table, or set by hand)."""

    def newest(self) -> int | None: ...


@dataclass
class FixedVersion:
    """A newest version set by hand (None: unknown, so no lag limit applies)."""

    version: int | None = None

    def newest(self) -> int | None:
        return self.version


@dataclass(frozen=True)
class EnvironmentTurn:
    """Tokens an environment inserts into an episode (never trained on), and their text if known."""

    token_ids: list[int]
    text: str | None = None


class Environment(Protocol):
    """The other side of a multi-turn episode (a tool, a user simulator, a game)."""

    async def reply(
        self, task: Task, sample_index: int, prompt: Sequence[int], response: Sequence[int]
    ) -> EnvironmentTurn | None:
        """The environment's turn after the policy's latest one, or None to end the episode.

        `response` holds every token of the episode so far (policy and environment turns).
        """
        ...


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
        take_timeout_s: how long one take waits for a task while none is in flight; with tasks in
            flight a take waits at most `busy_take_timeout_s`, so their settlements, which share
            the queue's thread, are not held up.
        busy_take_timeout_s: see `take_timeout_s`.
        lag_wait_s: how long to wait before looking at the versions again when at the limit.
        max_turns: policy turns per episode when the worker has an `Environment`; each turn
            generates at most the task's `max_tokens`.
    """

    worker_id: str
    concurrency: int = RolloutDefaults.concurrency
    max_lag: int | None = None
    on_weight_change: WeightChange = RolloutDefaults.on_weight_change
    vocab_size: int | None = None
    take_timeout_s: float = 1.0
    busy_take_timeout_s: float = 0.1
    lag_wait_s: float = 0.2
    max_turns: int = 4

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
        if self.max_turns < 1:
            raise ValueError(f"max_turns = {self.max_turns}; give at least 1 policy turn per episode")


@dataclass
class RolloutStats:
    """What a worker did so far; the ``_s`` fields are seconds summed over tasks (slots overlap).

    Attributes:
        generate_s: in the backend's `generate` (and the environment's turns).
        publish_s: from the first sample queued to the last acknowledged by Kafka.
        settle_s: settling leases on the queue (acknowledgement, commit, outcome event).
        take_s: in `TaskQueue.take` calls that returned tasks.
        idle_s: in `TaskQueue.take` calls that returned none (no task waiting).
    """

    started: int = 0
    done: int = 0
    failed: int = 0
    dead: int = 0
    requeued: int = 0
    samples: int = 0
    lag_waits: int = 0
    generate_s: float = 0.0
    publish_s: float = 0.0
    settle_s: float = 0.0
    take_s: float = 0.0
    idle_s: float = 0.0


class BadGenerationError(Exception):
    """A group the backend returned cannot be published (ids outside the vocabulary, wrong count)."""


class RolloutWorker:
    """Takes tasks from a `TaskQueue`, generates through a `GenerationBackend`, publishes.

    Args:
        queue: the task queue (share groups), with at least `options.concurrency` slots; its calls
            run on one thread of their own.
        backend: generates a group of n samples for a prompt.
        publisher: an `AsyncPublisher` to rollouts.raw (ultra-long samples to rollouts.ultra).
        options: `RolloutOptions`.
        versions: the newest published version, for `max_lag` (read in a thread: it may do I/O).
        tokenizer: turns a text prompt into ids once (and ids into text when the backend gives
            none); None: text prompts go to the backend's tokenize endpoint, if it has one.
        environment: makes each sample a multi-turn episode (`Environment`); None: one turn.
        progress: called with one line per settled task.
        metrics: `RolloutMetrics` to update; None: none kept.
        on_step: a `StepHook`, for tests and debugging.
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
        environment: Environment | None = None,
        progress: Callable[[str], None] | None = None,
        metrics: RolloutMetrics | None = None,
        on_step: StepHook | None = None,
    ) -> None:
        slots = getattr(queue, "slots", options.concurrency)
        if slots < options.concurrency:
            raise ValueError(
                f"the task queue has {slots} slots for a concurrency of {options.concurrency}; "
                "give the queue slots=concurrency"
            )
        self.queue, self.backend, self.publisher, self.options = queue, backend, publisher, options
        self.versions = versions or FixedVersion()
        self.tokenizer = tokenizer
        self.environment = environment
        self.progress = progress
        self.on_step = on_step
        self.metrics = metrics
        self.stats = RolloutStats()
        self._queue_thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="task-queue")
        self._in_flight: set[asyncio.Task[None]] = set()
        self._vocab_size: int | None = options.vocab_size

    async def run(self, stop: asyncio.Event, *, max_tasks: int | None = None) -> RolloutStats:
        """Work until `stop` is set, or until `max_tasks` were taken and settled.

        On a stop, generations in flight end and their tasks are requeued (no attempt used); a
        group already being published is published and acknowledged first.
        """
        if self._vocab_size is None:
            self._vocab_size = (await self.backend.model_info()).vocab_size
        try:
            while not stop.is_set() and (max_tasks is None or self.stats.started < max_tasks):
                room = self.options.concurrency - len(self._in_flight)
                if max_tasks is not None:
                    room = min(room, max_tasks - self.stats.started)
                if room < 1:
                    await self._wait_one(stop)
                    continue
                if not await self._may_start():
                    self.stats.lag_waits += 1
                    await _sleep_or_stop(stop, self.options.lag_wait_s)
                    continue
                taking = time.monotonic()
                wait = self.options.busy_take_timeout_s if self._in_flight else self.options.take_timeout_s
                leases = await self._call(self.queue.take, room, wait)
                if leases:
                    self.stats.take_s += time.monotonic() - taking
                else:
                    self.stats.idle_s += time.monotonic() - taking
                for lease in leases:
                    self.stats.started += 1
                    job = asyncio.create_task(self._work(lease))
                    self._in_flight.add(job)
                    job.add_done_callback(self._in_flight.discard)
            while self._in_flight and not stop.is_set():  # max_tasks taken: let them finish
                await self._wait_one(stop)
        finally:
            jobs = list(self._in_flight)
            for job in jobs:
                job.cancel()
            if jobs:
                await asyncio.gather(*jobs, return_exceptions=True)
            self._queue_thread.shutdown(wait=True)
        return self.stats

    async def _wait_one(self, stop: asyncio.Event) -> None:
        stopped = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait({*self._in_flight, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()

    async def _may_start(self) -> bool:
        if self.options.max_lag is None:
            return True
        newest = await asyncio.to_thread(self.versions.newest)
        if newest is None:
            return True
        return newest - await self.backend.current_version() < self.options.max_lag

    async def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._queue_thread, fn, *args)

    async def _settling(self, fn: Callable[..., Any], *args: Any) -> Any:
        """A settlement on the queue thread, awaited to its end even when a stop cancels the job."""
        future = asyncio.get_running_loop().run_in_executor(self._queue_thread, fn, *args)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            return await future

    def _step(self, step: Step, lease: Lease, count: int) -> None:
        if self.on_step is not None:
            self.on_step(step, lease, count)

    async def _work(self, lease: Lease) -> None:
        task = lease.task
        if self.metrics is not None:
            self.metrics.taken(lease.attempt)
        self._step("taken", lease, 0)
        try:
            prompt, episodes = await asyncio.wait_for(self._generate(task), max(lease.deadline_in(), 0.0))
        except asyncio.CancelledError:  # a stop while generating: back to the queue, no attempt used
            await self._settle(lease, "requeue")
            return
        except TimeoutError:
            await self._settle(
                lease,
                "fail",
                f"generation outlasted the task's deadline of {task.deadline_ms} ms",
                "deadline",
            )
            return
        except TokenizerMismatchError as exc:  # no attempt can mend it
            await self._settle(lease, "dead", _describe(exc), type(exc).__name__)
            return
        except Exception as exc:  # this attempt failed: release it for a retry
            await self._settle(lease, "fail", _describe(exc), type(exc).__name__)
            return
        if self.options.on_weight_change == "abort" and _changed(e.sample for e in episodes):
            await self._settle(lease, "requeue")
            return
        records = [self._record(task, lease.attempt, prompt, i, e) for i, e in enumerate(episodes)]
        # Once a sample may be in Kafka the attempt is finished, never requeued: a requeued copy
        # would reuse this attempt's number and so its group id.
        publishing = asyncio.ensure_future(self._publish(lease, records))
        try:
            await asyncio.shield(publishing)
        except asyncio.CancelledError:
            await asyncio.wait({publishing})
        if publishing.exception() is not None:
            await self._settle(
                lease, "fail", _describe(publishing.exception()), type(publishing.exception()).__name__
            )
        else:
            await self._settle(lease, "done")

    async def _generate(self, task: Task) -> tuple[list[int], list[_Episode]]:
        prompt = await self._prompt_ids(task)
        params = _sampling(task)
        started = time.monotonic()
        samples = await self.backend.generate(prompt, params)
        self._check(task, samples, task.group_size)
        if self.environment is None:
            episodes = [_Episode(s, None) for s in samples]
        else:
            episodes = list(
                await asyncio.gather(
                    *(self._episode(task, i, prompt, s, params) for i, s in enumerate(samples))
                )
            )
        self.stats.generate_s += time.monotonic() - started
        if self.metrics is not None:
            self.metrics.generated(time.monotonic() - started)
        return prompt, episodes

    async def _episode(
        self, task: Task, index: int, prompt: list[int], first: GeneratedSample, params: SamplingParams
    ) -> _Episode:
        """Policy turns and the environment's turns until it ends the episode or `max_turns`."""
        assert self.environment is not None
        parts: list[GeneratedSample | EnvironmentTurn] = [first]
        response = list(first.token_ids)
        for _ in range(1, self.options.max_turns):
            turn = await self.environment.reply(task, index, prompt, response)
            if turn is None:
                break
            self._check_ids(turn.token_ids, "the environment's tokens")
            parts.append(turn)
            response += turn.token_ids
            samples = await self.backend.generate(prompt + response, replace(params, n=1))
            self._check(task, samples, 1)
            parts.append(samples[0])
            response += samples[0].token_ids
        return self._join(parts) if len(parts) > 1 else _Episode(first, None)

    def _join(self, parts: Sequence[GeneratedSample | EnvironmentTurn]) -> _Episode:
        """One sample of an episode's turns: environment tokens get logprob 0.0 and mask 0."""
        tokens: list[int] = []
        logprobs: list[float] = []
        mask: list[int] = []
        spans: list[VersionSpan] = []
        texts: list[str | None] = []
        policy = [p for p in parts if isinstance(p, GeneratedSample)]
        for part in parts:
            start = len(tokens)
            tokens += part.token_ids
            if isinstance(part, GeneratedSample):
                logprobs += part.logprobs
                mask += [1] * len(part.token_ids)
                spans += [
                    VersionSpan(s.start + start, s.end + start, s.version) for s in part.weight_versions
                ]
                texts.append(part.text)
            else:  # the tokens belong to the version of the turn before them
                logprobs += [0.0] * len(part.token_ids)
                mask += [0] * len(part.token_ids)
                spans.append(VersionSpan(start, len(tokens), spans[-1].version))
                texts.append(part.text)
            if texts[-1] is None and self.tokenizer is not None:
                texts[-1] = self.tokenizer.decode(part.token_ids)
        sample = GeneratedSample(
            token_ids=tokens,
            logprobs=logprobs,
            finish_reason=policy[-1].finish_reason,
            weight_versions=_merged(spans),
            logprob_mode=policy[0].logprob_mode,
            sampling=policy[0].sampling,
            text=None if any(t is None for t in texts) else "".join(t or "" for t in texts),
            spans_exact=all(p.spans_exact for p in policy),
        )
        return _Episode(sample, mask)

    async def _settle(self, lease: Lease, how: str, error: str = "", reason: str = "") -> None:
        """Settle `lease` as `how` (done, requeue, fail, dead); `reason` names the error's kind."""
        started = time.monotonic()
        outcome = "unsettled"
        try:
            if how == "done":
                await self._settling(lease.done)
                self.stats.done += 1
                outcome = "done"
            elif how == "requeue":
                await self._settling(lease.requeue)
                self.stats.requeued += 1
                outcome = "requeued"
            else:
                fail = functools.partial(lease.fail, final=how == "dead")
                outcome = await self._settling(fail, error)
                self.stats.dead += outcome == "dead"
                self.stats.failed += outcome != "dead"
        except Exception as exc:  # an expired lock: the broker delivers the task again
            log.warning("settling task %s (%s) failed: %s", lease.task_id, how, exc)
            self.stats.failed += 1
        if self.metrics is not None:
            self.metrics.settled(outcome, reason)
        self.stats.settle_s += time.monotonic() - started
        if how in ("fail", "dead"):
            log.warning("task %s attempt %d failed: %s", lease.task_id, lease.attempt, error)
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
            name = getattr(self.tokenizer, "name", None)
            if task.tokenizer and isinstance(name, str) and task.tokenizer != name:
                raise TokenizerMismatchError(
                    f"task {task.task_id} is written for tokenizer {task.tokenizer!r}, but this worker's is "
                    f"{name!r}: give the model's tokenizer, or submit the task with its token ids"
                )
            ids = list(self.tokenizer.encode(task.prompt_text))
            if (back := self.tokenizer.decode(ids)) != task.prompt_text:
                raise TokenizerMismatchError(
                    f"task {task.task_id}: the worker's tokenizer turns the prompt into ids that decode to "
                    f"{back!r:.80}, not the prompt {task.prompt_text!r:.80}; give the model's tokenizer, "
                    "or submit the task with its token ids"
                )
            return ids
        tokenize = getattr(self.backend, "tokenize", None)
        if tokenize is None:
            raise BadGenerationError(
                f"task {task.task_id} has a text prompt, and neither a tokenizer file nor the backend's "
                "tokenize endpoint is available: give --tokenizer or submit token ids"
            )
        return list(await tokenize(task.prompt_text))

    def _check(self, task: Task, samples: Sequence[GeneratedSample], expected: int) -> None:
        if len(samples) != expected:
            raise BadGenerationError(f"the backend returned {len(samples)} samples for a group of {expected}")
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
            self._check_ids(sample.token_ids, "a token id")

    def _check_ids(self, ids: Sequence[int], what: str) -> None:
        vocab = self._vocab_size
        if vocab is not None and any(not 0 <= t < vocab for t in ids):
            raise BadGenerationError(f"{what} lies outside the model's vocabulary [0, {vocab})")

    def _record(
        self, task: Task, attempt: int, prompt: list[int], index: int, episode: _Episode
    ) -> dict[str, Any]:
        sample = episode.sample
        group_id = group_id_of(task.task_id, attempt)
        # A zero-length span (the version a non-exact sample ended on) is not a span of tokens.
        spans = [
            {"start": s.start, "end": s.end, "version": s.version}
            for s in _merged(sample.weight_versions)
            if s.end > s.start
        ]
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
            "loss_mask": None if episode.mask is None else pack_mask(episode.mask),
            "version_spans": spans if len(spans) > 1 else None,
            "logprob_mode": sample.logprob_mode,
            "worker_id": self.options.worker_id,
            "created_at": datetime.now(UTC),
            "metadata": {
                "priority": str(task.priority),
                "sampling": json.dumps(_sampling_fields(sample.sampling), sort_keys=True),
            },
        }

    async def _publish(self, lease: Lease, records: list[dict[str, Any]]) -> None:
        """Queue every sample, then wait for Kafka's acknowledgements; a failed one raises."""
        started = time.monotonic()
        futures = []
        for index, record in enumerate(records):
            self._step("publishing", lease, index)
            # The latency lane: the task is acknowledged only after the whole group is in Kafka.
            futures.append(await self.publisher.publish(record, lane=Lane.LATENCY))
        await asyncio.gather(*futures)
        self.stats.publish_s += time.monotonic() - started
        self.stats.samples += len(records)
        if self.metrics is not None:
            self.metrics.published(len(records))
        self._step("published", lease, len(records))


class _Episode(NamedTuple):
    """A sample to publish and its loss mask (None: every token trained on)."""

    sample: GeneratedSample
    mask: list[int] | None


def _merged(spans: Sequence[VersionSpan]) -> list[VersionSpan]:
    """Adjacent spans of one version joined into one."""
    out: list[VersionSpan] = []
    for span in spans:
        if out and out[-1].version == span.version and out[-1].end == span.start:
            out[-1] = VersionSpan(out[-1].start, span.end, span.version)
        else:
            out.append(span)
    return out


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


def _changed(samples: Iterable[GeneratedSample]) -> bool:
    return any(len(s.weight_versions) > 1 for s in samples)


async def _sleep_or_stop(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)
