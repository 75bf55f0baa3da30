"""Rollout workers against the real broker and a real `rollstream serve` over HTTP.

Tasks come from a fresh share group with a 5 s lock (rollout_support.RolloutEnv); the server is
the stand-in causal policy of backend_support, and its response log is what every published
sample is compared with.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import time
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
from backend_support import CausalMeanPolicy, CharTokenizer
from confluent_kafka.admin import AdminClient
from rollout_support import (
    MAX_LENGTH,
    RolloutEnv,
    Served,
    prompt_of,
    read_line,
    run_worker,
    start_rollout,
    start_server,
    stop_process,
    task_row,
)
from stream_support import (
    group_name_fixture,  # noqa: F401 (provides the group_name fixture)
    start_worker,
    stop_worker,
    wait_for,
)

from consumers.weights import publish_version
from producers.backends import GeneratedSample, ModelInfo, SamplingParams, VersionSpan
from producers.rollout import EnvironmentTurn, FixedVersion, RolloutWorker, group_id_of
from producers.tasks import read_status
from schemas import TrajectoryCodec
from schemas.task import Task

ENV_TOKENS = [26, 26]  # what the test environment inserts: "zz"
KILL_LOCK_MS = 10_000
"""The killed workers' locks must outlast their staggered starts, so each takes a different task."""


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    server = start_server(tmp_path_factory.mktemp("serve"))
    try:
        yield server
    finally:
        code = stop_process(server.process)
    assert code == 0, f"rollstream serve exited {code} on SIGTERM"


@pytest.fixture(params=[1])
def env(request: pytest.FixtureRequest, admin: AdminClient, bootstrap_servers: str) -> Iterator[RolloutEnv]:
    """Task topics of `request.param` partitions each (1 unless a test parametrizes it indirectly)."""
    rollout = RolloutEnv(admin, bootstrap_servers, task_partitions=request.param)
    yield rollout
    rollout.close()


def tokens(record: dict[str, Any], field: str, dtype: str = "<i4") -> list[Any]:
    return np.frombuffer(record[field], dtype=dtype).tolist()


def groups_by_task(samples: Sequence[dict[str, Any]]) -> dict[str, dict[str, list[dict[str, Any]]]]:
    out: dict[str, dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for sample in samples:
        out[sample["task_id"]][sample["group_id"]].append(sample)
    return out


@pytest.mark.parametrize("env", [4], indirect=True)  # one queue of 8 slots over 8 task partitions
def test_200_tasks_of_two_priorities_become_one_group_each_exactly_as_the_server_answered(
    env: RolloutEnv, served: Served
) -> None:
    rows = [
        task_row(f"t{i:03d}", prompt_of(1, i), priority=i % 2, group_size=2 + i % 3, seed=i)
        for i in range(200)
    ]
    report = env.submit(rows)
    assert report.submitted == {"low": 100, "high": 100}
    stats = run_worker(
        env, served.url, until=lambda s: s.done + s.dead >= 200, within_s=90, concurrency=8, worker_id="w-200"
    )
    assert (stats.done, stats.dead) == (200, 0), stats

    sizes = {row["task_id"]: row["group_size"] for row in rows}
    samples = env.samples(sum(sizes.values()))
    assert len(samples) == sum(sizes.values())
    logged = served.requests()
    for task_id, groups in groups_by_task(samples).items():
        (group,) = groups.values()  # one group per task: no attempt published twice
        group.sort(key=lambda s: s["sample_index"])
        attempt = group[0]["attempt"]
        assert [s["sample_index"] for s in group] == list(range(sizes[task_id]))
        assert group[0]["group_id"] == group_id_of(task_id, attempt)
        assert {(s["attempt"], s["group_size"], s["policy_version"], s["worker_id"]) for s in group} == {
            (attempt, sizes[task_id], 0, "w-200")
        }
        assert len({s["_partition"] for s in group}) == 1
        prompt = tuple(tokens(group[0], "prompt_tokens"))
        answered = [[(line["token_ids"], line["logprobs"]) for line in request] for request in logged[prompt]]
        published = [(tokens(s, "response_tokens"), tokens(s, "response_logprobs", "<f4")) for s in group]
        assert published in answered, f"task {task_id}: no request of the server's log returned {published}"
        assert all(s["logprob_mode"] == "processed" and s["version_spans"] is None for s in group)
    assert len(groups_by_task(samples)) == 200

    status = read_status(bootstrap_servers=env.bootstrap_servers, topics=env.topics, lock_ms=env.lock_ms)
    assert {name: (c.done, c.pending, c.in_flight) for name, c in status.classes.items()} == {
        "low": (100, 0, 0),
        "high": (100, 0, 0),
    }


@pytest.mark.slow(34)
@pytest.mark.timeout(240)
def test_a_worker_killed_at_each_moment_loses_no_task_and_the_table_keeps_one_group_per_task(
    admin: AdminClient, bootstrap_servers: str, served: Served, tmp_path: Path, group_name: Any
) -> None:
    env = RolloutEnv(admin, bootstrap_servers, lock_ms=KILL_LOCK_MS)
    try:
        killed_at_each_moment(env, served, tmp_path, group_name)
    finally:
        env.close()


def killed_at_each_moment(env: RolloutEnv, served: Served, tmp_path: Path, group_name: Any) -> None:
    size = 4
    task_ids = [f"k{i}" for i in range(4)]
    env.submit([task_row(t, prompt_of(2, i), group_size=size) for i, t in enumerate(task_ids)])
    # Three workers at once, each to pause at its moment: each holds a different task's lock.
    moments = ("taken", "publishing", "published")
    workers = {}
    for moment in moments:
        args = ("--concurrency", "1", "--worker-id", f"killed-{moment}", "--test-pause-at", moment)
        workers[moment] = start_rollout(env, served.url, tmp_path / moment, *args)
    killed: dict[str, tuple[str, int]] = {}
    try:
        for moment, process in workers.items():
            line = read_line(process, 90)
            found = re.fullmatch(rf"paused at {moment} \d+: task (\S+) attempt (\d+)", line)
            errors = "\n".join(p.read_text()[-2000:] for p in (tmp_path / moment).glob("*.err"))
            assert found, f"the worker did not pause at {moment}: {line!r}\n{errors}"
            killed[moment] = (found[1], int(found[2]))
        group = group_id_of(*killed["publishing"])
        end = time.monotonic() + 30
        while sum(s["group_id"] == group for s in env.samples(size // 2, 1.0)) < size // 2:
            assert time.monotonic() < end, "the first half of the group never reached Kafka"
    finally:
        for process in workers.values():
            stop_process(process, signal.SIGKILL)
    assert len({task for task, _ in killed.values()}) == 3 and {a for _, a in killed.values()} == {1}

    # The retries run on another worker of the fleet: the CLI on the in-process torch backend,
    # following the lake's newest version (3; with --max-lag 2 it would not start on version 0).
    lake = tmp_path / "lake"
    publish_version(CausalMeanPolicy(27, seed=1).state_dict(), lake_uri=str(lake), number=3, step=30)
    torch_args = ["--policy", "backend_support:causal_policy", "--vocab-size", "27", "--lake", str(lake)]
    torch_args += ["--tokenizer", "backend_support:CharTokenizer", "--max-lag", "2", "--concurrency", "2"]
    final = start_rollout(env, "torch", tmp_path / "final", *torch_args, "--worker-id", "final")
    try:
        published = groups_by_task(env.samples(4 * size + size // 2 + size, 90.0))
    finally:
        code = stop_process(final, signal.SIGTERM)
    assert final.stdout is not None
    stats = json.loads(final.stdout.read().splitlines()[-1])
    assert code == 0 and (stats["done"], stats["dead"], stats["requeued"]) == (4, 0, 0), stats
    (taken_task, _), (partial_task, partial_attempt), (twice_task, twice_attempt) = killed.values()
    expected = {partial_task: [(1, size // 2), (2, size)], twice_task: [(1, size), (2, size)]}
    for task_id in task_ids:  # each killed task was delivered again after the lock, one attempt higher
        groups = published[task_id].values()
        assert all(len({s["attempt"] for s in g}) == 1 for g in groups)  # a group never mixes attempts
        seen = sorted((g[0]["attempt"], len(g)) for g in groups)
        assert seen == expected.get(task_id, [(2 if task_id == taken_task else 1, size)]), task_id
        last = max(groups, key=lambda g: g[0]["attempt"])
        assert {(s["worker_id"], s["policy_version"]) for s in last} == {("final", 3)}
        assert all(s["response_text"] == CharTokenizer().decode(tokens(s, "response_tokens")) for s in last)

    log = tmp_path / "process.log"
    extra = ["--group-timeout", "2", "--group-wall-timeout", "2"]
    process = start_worker(
        env.bootstrap_servers,
        lake,
        env.raw,
        env.dlq,
        "rollout-kill",
        group_name("rollout-kill"),
        log,
        extra=extra,
    )
    expected_rows = 4 * size + size // 2

    def landed() -> bool:
        if not (lake / "trajectories" / "_delta_log").is_dir() or not (lake / "dead_letters").is_dir():
            return False
        rows = pl.read_delta(str(lake / "trajectories")).height
        return rows >= expected_rows and pl.read_delta(str(lake / "dead_letters")).height >= size

    try:
        wait_for(landed, 90, process, log, f"{expected_rows} rows and {size} dead letters")
    finally:
        assert stop_worker(process, log) == 0
    table = pl.read_delta(str(lake / "trajectories"))
    assert table.height == expected_rows
    complete = table.filter(pl.col("group_status") == "complete")
    per_task = complete.group_by("task_id").agg(pl.len(), pl.col("group_id").n_unique().alias("groups"))
    assert sorted(per_task.rows()) == [(t, size, 1) for t in task_ids]
    timed_out = table.filter(pl.col("group_status") == "timed_out")
    assert timed_out.height == size // 2
    assert set(zip(timed_out["task_id"], timed_out["attempt"], strict=True)) == {
        (partial_task, partial_attempt)
    }
    kept_twice = complete.filter(pl.col("task_id") == twice_task)
    assert set(kept_twice["attempt"]) == {twice_attempt}  # the first complete group is the one kept
    letters = pl.read_delta(str(lake / "dead_letters"))
    assert letters.height == size and set(letters["error_type"]) == {"duplicate_attempt"}
    lettered = {(r["task_id"], r["attempt"]) for r in map(TrajectoryCodec().decode, letters["raw"])}
    assert lettered == {(twice_task, twice_attempt + 1)}


def test_a_task_whose_generation_always_fails_becomes_a_task_dead_letter_after_n_attempts(
    env: RolloutEnv, served: Served
) -> None:
    env.submit([task_row("too-long", [1] * (MAX_LENGTH - 1), max_tokens=3, priority="high")])
    stats = run_worker(env, served.url, max_tasks=3, within_s=45, queue_options={"max_attempts": 3})
    assert (stats.started, stats.failed, stats.dead, stats.done) == (3, 2, 1, 0)
    (letter,) = env.dead_letters(1)
    assert (letter.reason, letter.attempts, letter.task_id) == ("failed", 3, "too-long")
    assert "HTTP 400" in letter.error and f"max length {MAX_LENGTH}" in letter.error
    assert env.samples(0, 1.0) == []


class Echo:
    """A test environment: after the first policy turn it inserts ENV_TOKENS, then ends the episode."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, int]] = []

    async def reply(
        self, task: Task, sample_index: int, prompt: Sequence[int], response: Sequence[int]
    ) -> EnvironmentTurn | None:
        self.calls.append((task.task_id, sample_index, len(response)))
        return EnvironmentTurn(list(ENV_TOKENS), "zz") if len(self.calls) <= 2 else None


def test_a_multi_turn_episode_masks_the_environments_tokens_out_of_the_loss(
    env: RolloutEnv, served: Served
) -> None:
    prompt = prompt_of(3, 0)
    env.submit([task_row("episode", prompt, group_size=2, max_tokens=3)])
    echo = Echo()
    stats = run_worker(
        env, served.url, until=lambda s: s.done >= 1, within_s=30, environment=echo, max_turns=2
    )
    assert stats.done == 1
    samples = sorted(env.samples(2), key=lambda s: s["sample_index"])
    logged = served.requests()
    (first_turns,) = logged[tuple(prompt)]
    for sample, first in zip(samples, first_turns, strict=True):
        response, logprobs = tokens(sample, "response_tokens"), tokens(sample, "response_logprobs", "<f4")
        mask = np.frombuffer(sample["loss_mask"], dtype=np.uint8).tolist()
        turn = len(first["token_ids"])
        # The next turn's request; two samples whose first turns drew the same tokens share its prompt.
        seconds = [request[0] for request in logged[(*prompt, *first["token_ids"], *ENV_TOKENS)]]
        second = next(s for s in seconds if response == first["token_ids"] + ENV_TOKENS + s["token_ids"])
        assert logprobs == first["logprobs"] + [0.0, 0.0] + second["logprobs"]
        assert mask == [1] * turn + [0, 0] + [1] * len(second["token_ids"])
        assert sample["version_spans"] is None and sample["policy_version"] == 0
    assert sorted(call[1] for call in echo.calls) == [0, 1]


class Scripted:
    """A backend at a settable version: answers the prompt [1] with spans that are not exact (its
    version changed during the request), and never answers any other prompt."""

    def __init__(self, version: int) -> None:
        self.version = version
        self.hanging = 0

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> list[GeneratedSample]:
        if list(prompt_ids) != [1]:
            self.hanging += 1
            await asyncio.Event().wait()
        spans = [VersionSpan(0, 3, self.version), VersionSpan(3, 3, self.version + 1)]
        sample = GeneratedSample([4, 5, 6], [-0.5] * 3, "length", spans, "processed", params, "def", False)
        return [sample] * params.n

    async def current_version(self) -> int:
        return self.version

    async def model_info(self) -> ModelInfo:
        return ModelInfo(vocab_size=27, weight_version=self.version)

    async def close(self) -> None:
        pass


def test_max_lag_gates_starts_and_a_stop_requeues_the_generation_in_flight(env: RolloutEnv) -> None:
    env.submit([task_row("spans", [1]), task_row("hangs", [2])])
    backend = Scripted(version=3)
    seen: dict[str, Any] = {}

    def behind_then_caught_up(worker: RolloutWorker) -> None:
        if worker.stats.lag_waits >= 3 and "waited" not in seen:
            seen["waited"] = worker.stats.started  # newest 5 - served 3 = 2: not below max_lag 2
            backend.version = 4

    stats = run_worker(
        env,
        backend,
        until=lambda s: backend.hanging > 0,
        within_s=30,
        on_running=behind_then_caught_up,
        versions=FixedVersion(5),
        max_lag=2,
    )
    assert seen["waited"] == 0
    assert (stats.started, stats.done, stats.requeued, stats.failed) == (2, 1, 1, 0)
    (lease,) = env.queue().take(1, timeout=10)
    assert (lease.task_id, lease.attempt) == ("hangs", 1), env.outcomes("hangs")  # no attempt used
    lease.done()
    samples = env.samples(2)
    assert [s["task_id"] for s in samples] == ["spans", "spans"]
    # The zero-length span of a non-exact sample is left out; its tokens belong to the older version.
    assert {(s["policy_version"], s["version_spans"] is None) for s in samples} == {(4, True)}
    assert Counter(s["response_text"] for s in samples) == {"def": 2}


def test_text_prompts_go_through_the_servers_tokenizer_and_a_disagreeing_one_is_a_dead_letter(
    env: RolloutEnv, served: Served
) -> None:
    text = {"prompt_tokens": None, "tokenizer": "char"}
    env.submit(
        [
            task_row("text-ok", [], prompt_text="cab", **text),
            task_row("text-bad", [], prompt_text="ca`b", priority="high", **text),  # "`" is id 0: eos
        ]
    )
    stats = run_worker(
        env, served.url, until=lambda s: s.done + s.dead >= 2, within_s=45, queue_options={"max_attempts": 3}
    )
    assert (stats.started, stats.done, stats.dead, stats.failed) == (2, 1, 1, 0)  # dead on attempt 1
    (letter,) = env.dead_letters(1)
    assert (letter.reason, letter.attempts, letter.task_id) == ("failed", 1, "text-bad")
    assert "detokenize to 'cab'" in letter.error
    samples = env.samples(2)
    assert {s["task_id"] for s in samples} == {"text-ok"}
    assert all(tokens(s, "prompt_tokens") == CharTokenizer().encode("cab") for s in samples)


class Updating:
    """A backend whose weights move from `version` to `version + 1` during its first request."""

    def __init__(self, version: int) -> None:
        self.version = version
        self.calls = 0

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> list[GeneratedSample]:
        self.calls += 1
        if self.calls == 1:
            spans = [VersionSpan(0, 2, self.version), VersionSpan(2, 3, self.version + 1)]
            self.version += 1
        else:
            spans = [VersionSpan(0, 3, self.version)]
        sample = GeneratedSample([4, 5, 6], [-0.5] * 3, "length", spans, "processed", params, "def", True)
        return [sample] * params.n

    async def current_version(self) -> int:
        return self.version

    async def model_info(self) -> ModelInfo:
        return ModelInfo(vocab_size=27, weight_version=self.version)

    async def close(self) -> None:
        pass


def test_abort_on_a_weight_change_requeues_the_task_without_using_an_attempt(env: RolloutEnv) -> None:
    env.submit([task_row("moved", [1])])
    backend = Updating(version=3)
    stats = run_worker(env, backend, until=lambda s: s.done >= 1, within_s=30, on_weight_change="abort")
    assert (stats.started, stats.requeued, stats.done, stats.failed) == (2, 1, 1, 0)
    events = [(e["event"], e["attempt"]) for e in env.outcomes("moved")]
    assert events == [("started", 1), ("requeued", 1), ("started", 1), ("done", 1)], events
    samples = env.samples(2)
    assert {(s["task_id"], s["attempt"], s["policy_version"]) for s in samples} == {("moved", 1, 4)}
    assert all(s["version_spans"] is None for s in samples)  # only the retry's one-version samples
