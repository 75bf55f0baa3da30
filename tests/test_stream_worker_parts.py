"""Each named part of the stream worker on its own, without a broker (real Delta tables on disk)."""

from __future__ import annotations

import ast
import asyncio
import json
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from producers.fleet import SyntheticFleet
from schemas import TrajectoryCodec
from schemas.metrics import Readiness, exposition, serve_metrics
from stream_processors import BatchProcessor, Coordinates, DeadLetters, DeltaSink, SourceMessage
from stream_processors.backpressure import Backpressure, Held
from stream_processors.committer import Committer
from stream_processors.exceptions import BrokerUnavailableError, SinkError
from stream_processors.groups import GroupBuffer
from stream_processors.intake import Taken
from stream_processors.lanes import Lane, consumer_config
from stream_processors.metrics import LagCollector, WorkerMetrics
from stream_processors.rebalance import RebalanceListener
from stream_processors.shielded import shielded
from stream_processors.shutdown import Shutdown
from stream_processors.sink_thread import SinkThread
from stream_processors.stage import Stage, StageObserver
from stream_processors.startup import Preflight
from stream_processors.thread_names import name_os_thread

pytestmark = pytest.mark.timeout(120)
REPO = Path(__file__).resolve().parents[1]
LONGEST_FUNCTION = 80


class FakeIntake:
    """The parts of `Intake` the worker's parts call, with what they were told."""

    def __init__(self, topic: str = "raw") -> None:
        self.topic = topic
        self.paused = False
        self.generation = 1
        self.assigned = {("raw", 0), ("raw", 1)}
        self.commits: list[dict] = []
        self.ends: dict = {}
        self.closed = False

    def pause(self, paused: bool) -> None:
        self.paused = paused

    def current(self, tp, generation) -> bool:
        return tp in self.assigned and generation == self.generation

    def commit(self, safe) -> None:
        self.commits.append(dict(safe))

    def take(self, size, within_s) -> Taken:
        return Taken()

    def subscribe(self) -> None: ...

    def close(self) -> None:
        self.closed = True

    def log_ends(self):
        return dict(self.ends)


def messages(n: int, partition: int = 0, seed: int = 3) -> list[SourceMessage]:
    codec = TrajectoryCodec()
    records = SyntheticFleet(seed=seed, group_size=2, num_domains=4).trajectories(n)
    return [
        SourceMessage(Coordinates("raw", partition, i), None, codec.encode(r)) for i, r in enumerate(records)
    ]


def make_stage(tmp_path: Path, **kwargs) -> Stage:
    stage = Stage(
        BatchProcessor(),
        DeltaSink(tmp_path / "trajectories", app_id="parts"),
        DeadLetters(tmp_path / "dead_letters", app_id="parts"),
        groups=GroupBuffer(event_timeout_s=1e9, wall_timeout_s=1e9),
        **kwargs,
    )
    stage.load([("raw", 0), ("raw", 1)], {"raw": "id-raw"})
    return stage


def test_shielded_finishes_the_work_when_cancelled_meanwhile():
    release = threading.Event()

    async def main() -> tuple[str, bool]:
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(None, lambda: release.wait(10) and "written")
        waiter = asyncio.ensure_future(shielded(future))
        await asyncio.sleep(0.05)
        waiter.cancel()  # a stop request while the work runs
        await asyncio.sleep(0.05)
        assert not waiter.done(), "the wait gave up on work still running"
        release.set()
        return await waiter

    assert asyncio.run(main()) == ("written", True)


def test_backpressure_pauses_above_its_bound_and_resumes_at_half():
    intake, held = FakeIntake(), Held()
    bound = Backpressure("raw", intake, bound_bytes=100, held=held)
    big = [SourceMessage(Coordinates("raw", 0, i), None, b"x" * 40) for i in range(3)]
    held.hold(big)
    bound.check()
    assert intake.paused and held.held_bytes("raw") == 120
    held.release({("raw", 0): 1})  # 80 held: above half the bound, still paused
    bound.check()
    assert intake.paused
    held.release({("raw", 0): 2})
    bound.check()
    assert not intake.paused and held.held_bytes("raw") == 40
    held.drop([("raw", 0)])
    assert held.held_bytes("raw") == 0


def test_a_lane_keeps_only_messages_of_partitions_still_assigned_and_judges_in_its_thread():
    intake = FakeIntake()
    lane = Lane("raw", intake, batch_size=4, within_s=0.1)  # type: ignore[arg-type]
    batch = messages(4)
    taken = Taken(messages=batch, generations={("raw", 0): 1})
    assert lane.fresh(taken) == batch and not lane.stale(taken)
    intake.generation = 2  # revoked and assigned again since the batch was read
    assert lane.fresh(taken) == [] and lane.stale(taken)
    seen: list[str] = []

    async def judge():
        return await lane.judge(lambda ms: seen.append(threading.current_thread().name) or len(ms), batch)

    assert asyncio.run(judge()) == (4, False)
    assert seen[0].startswith("rollstream-raw") and not lane.judging
    config = consumer_config(
        lane="ultra", bootstrap_servers="b:1", group="g", app_id="a", session_timeout_s=9,
        instance_id="w-0", kafka_client={"security.protocol": "SSL"},
    )  # fmt: skip
    assert config["group.instance.id"] == "w-0-ultra" and config["security.protocol"] == "SSL"
    assert config["heartbeat.interval.ms"] == 3000 and config["max.partition.fetch.bytes"] == 64 * 2**20
    assert config["fetch.queue.backoff.ms"] <= 10  # librdkafka's 1,000 ms default starves a full queue


def test_the_sink_thread_accepts_what_was_not_revoked_and_settles_a_revoked_partition(tmp_path):
    stage = make_stage(tmp_path)
    sink = SinkThread(stage)
    intake = FakeIntake()
    lane = Lane("raw", intake, batch_size=8, within_s=0.1)  # type: ignore[arg-type]
    batch = [
        *messages(4, partition=0),
        *(SourceMessage(Coordinates("raw", 1, i), None, m.value) for i, m in enumerate(messages(2, seed=4))),
    ]
    taken = Taken(
        messages=batch, generations={("raw", 0): 1, ("raw", 1): 0}
    )  # raw[1] was read in generation 0
    judged = stage.judge(batch)

    async def main():
        return await sink.accept(lane, judged, taken)

    stats, safe = asyncio.run(main())
    assert stats.records_in == 4  # raw[1]'s messages are its new owner's
    assert safe == {("raw", 0): 0}, "rows still in the outbox counted as safe"
    assert sink.call(lambda: sink.revoke([("raw", 0)])) == {("raw", 0): 4}  # committed, then safe
    assert stage.revoked == frozenset({("raw", 0)})


def test_the_committer_commits_safe_offsets_to_every_lane_and_counts_rows(tmp_path):
    stage = make_stage(tmp_path)
    sink, held = SinkThread(stage), Held()
    raw, ultra, counted = FakeIntake(), FakeIntake("ultra"), []
    batch = messages(4)
    held.hold(batch)
    committer = Committer(
        sink, [raw, ultra], held, Backpressure("raw", raw, 10**9, held), on_rows=counted.append
    )  # type: ignore[list-item, arg-type]

    async def main() -> tuple[bool, bool]:
        accepted = await committer.step(lambda: stage.accept(stage.judge(batch)))
        flushed = await committer.step(stage.flush)
        return accepted, flushed

    assert asyncio.run(main()) == (False, False)
    assert raw.commits[-1] == ultra.commits[-1] == {("raw", 0): 4}
    assert held.held_bytes("raw") == 0 and sum(counted) == 4 == committer.progress.rows_written


def test_the_rebalance_listener_settles_only_after_preflight(tmp_path):
    stage = make_stage(tmp_path)
    sink, held, passed, assigned = SinkThread(stage), Held(), [False], []
    listener = RebalanceListener(sink, held, lambda: passed[0], on_assigned=assigned.append)
    assert listener.on_revoke([("raw", 0)]) == {}  # nothing loaded yet: nothing to settle
    assert listener.stored_next(("raw", 0)) == 0 and listener.stored_next(("raw", 9)) is None
    batch = messages(4)
    held.hold(batch)
    stage.run(batch)

    async def main():
        listener.loop = asyncio.get_running_loop()
        passed[0] = True
        safe = await asyncio.to_thread(listener.on_revoke, [("raw", 0)])
        await asyncio.sleep(0)  # the drop was handed to the loop
        return safe

    assert asyncio.run(main()) == {("raw", 0): 4}
    assert held.held_bytes("raw") == 0 and ("raw", 0) in stage.revoked
    listener.for_lane("raw")([("raw", 0)])
    assert assigned == ["raw"] and stage.revoked == frozenset()


def test_preflight_runs_once_for_every_lane_and_retries_brokers_that_do_not_answer(tmp_path):
    calls, passed = [], []

    class Flaky(Preflight):
        def check_and_load(self) -> None:
            calls.append(1)
            if len(calls) < 3:
                raise BrokerUnavailableError("no answer")

    preflight = Flaky(
        make_stage(tmp_path), bootstrap_servers="x:1", topics=["raw"], stores=[],
        executor=ThreadPoolExecutor(1), on_passed=lambda: passed.append(1),
    )  # fmt: skip

    async def main() -> None:
        await asyncio.gather(preflight.ensure(), preflight.ensure())
        await asyncio.sleep(0)

    asyncio.run(main())
    assert len(calls) == 3 and preflight.passed and passed == [1]


class CommitSizes(StageObserver):
    """Records each commit's rows and message bytes."""

    def __init__(self) -> None:
        self.commits: list[tuple[int, int]] = []

    def committed(self, rows: int, nbytes: int, seconds: float) -> None:
        self.commits.append((rows, nbytes))


def test_a_full_outbox_waits_for_the_commit_under_way_instead_of_growing(tmp_path):
    sizes = CommitSizes()
    batch_size, commit_rows = 8, 16
    stream = messages(96)
    commit_bytes = sum(len(m.value or b"") for m in stream[:commit_rows])
    stage = make_stage(tmp_path, background_commits=True, commit_bytes=commit_bytes, observer=sizes)
    table = stage.sink.table
    slow_commit, first = table.commit, threading.Event()

    def commit(*args, **kwargs):  # the first commit is slow: batches keep coming meanwhile
        if not first.is_set():
            first.set()
            time.sleep(0.5)
        return slow_commit(*args, **kwargs)

    table.commit = commit  # type: ignore[method-assign]
    processor = stage.processor
    for i in range(0, len(stream), batch_size):
        stage.accept(processor.judge(stream[i : i + batch_size]))
    stage.flush()
    assert first.is_set() and sum(rows for rows, _ in sizes.commits) == len(stream)
    one_batch = max(len(m.value or b"") for m in stream) * batch_size
    assert len(sizes.commits) >= len(stream) // (commit_rows + batch_size)
    assert all(nbytes < commit_bytes + one_batch for _, nbytes in sizes.commits), sizes.commits
    assert stage.sink.table.refresh().to_pyarrow_dataset().count_rows() == len(stream)


def test_stage_retries_a_failing_write_with_its_attempt_wait_and_error_in_the_log(tmp_path, caplog):
    stage = make_stage(tmp_path, write_retries=2, retry_backoff_s=0.01)
    failures = iter([SinkError("disk full"), SinkError("disk full")])

    def write() -> int:
        error = next(failures, None)
        if error is not None:
            raise error
        return 7

    assert stage._retrying("trajectories", write) == 7
    lines = [r.getMessage() for r in caplog.records if "retrying in" in r.getMessage()]
    assert lines == [
        "writing trajectories failed (attempt 1 of 3): disk full; retrying in 0.0s",
        "writing trajectories failed (attempt 2 of 3): disk full; retrying in 0.0s",
    ]
    with pytest.raises(SinkError, match="disk full"):
        stage._retrying("trajectories", lambda: (_ for _ in ()).throw(SinkError("disk full")))


def test_shutdown_closes_the_shared_parts_after_the_last_lane_and_crashes_on_a_failed_step(tmp_path):
    stage = make_stage(tmp_path)
    closed, crashed = [], []
    readiness = Readiness(["preflight"])
    readiness.mark("preflight")
    committer = Committer(SinkThread(stage), [], Held())

    async def crash(exc: BaseException) -> None:
        crashed.append(exc)

    shutdown = Shutdown(committer, crash, readiness, lambda: closed.append(1))
    raw, ultra = (Lane(n, FakeIntake(n), 1, 0.1) for n in ("raw", "ultra"))  # type: ignore[arg-type]

    async def main() -> None:
        shutdown.started()
        shutdown.started()
        await shutdown.lane_stopped(raw, None, stopping=True)
        assert not closed and raw.intake.closed and not readiness.ready
        await shutdown.lane_stopped(ultra, None, stopping=True)
        failed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        failed.set_exception(SinkError("gone"))
        shutdown.crash_on_failure(failed)
        await asyncio.sleep(0.01)

    asyncio.run(main())
    assert closed == [1] and [str(e) for e in crashed] == ["gone"]


def test_worker_metrics_count_what_the_stage_reports_and_lag_follows_the_stored_offsets(tmp_path):
    metrics = WorkerMetrics()
    stage = make_stage(tmp_path, observer=metrics)
    stage.dead_letters.on_stored = metrics.stored_letters
    ends = {("raw", 0): 7}
    metrics.follow_lag(LagCollector(lambda: ends.items(), lambda tp: stage.state.partitions[tp].next))
    metrics.follow_pending(lambda: stage.pending_groups)
    junk = [SourceMessage(Coordinates("raw", 0, i), None, b"junk") for i in (4, 5)]
    batch = [*messages(4), *junk]
    judged = stage.judge(batch)
    metrics.judged("raw", judged)
    stats = stage.accept(judged)
    metrics.stored_rows(stats.rows_written + stage.flush())
    body, content_type = exposition(metrics.registry)
    assert content_type.startswith("text/plain")
    values = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(body.decode())
        for s in f.samples
    }
    assert values[("rollstream_stream_rows_total", ())] == 4
    assert values[("rollstream_stream_dead_letters_total", (("reason", "DecodeError"),))] == 2
    assert values[("rollstream_stream_groups_decided_total", (("status", "complete"),))] == 2
    assert values[("rollstream_stream_commit_rows_count", ())] == 1
    assert values[("rollstream_stream_messages_total", (("lane", "raw"),))] == 6
    assert values[("rollstream_stream_lag_messages", (("partition", "0"), ("topic", "raw")))] == 7 - 6
    assert values[("rollstream_stream_groups_pending", ())] == 0


def test_readiness_and_the_metrics_server_of_processes_without_a_web_server():
    readiness = Readiness(["loaded"])
    metrics = WorkerMetrics()
    with serve_metrics(metrics.registry, readiness) as server:

        def get(path: str) -> tuple[int, bytes]:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{server.port}{path}", timeout=10) as r:
                    return r.status, r.read()
            except urllib.error.HTTPError as error:
                return error.code, error.read()

        status, body = get("/health")
        assert status == 503 and json.loads(body) == {"status": "starting", "loaded": False}
        readiness.mark("loaded")
        assert get("/health")[0] == 200
        assert b"rollstream_stream_rows_total 0.0" in get("/metrics")[1]
        readiness.stop()
        assert json.loads(get("/health")[1])["status"] == "stopping"
    with pytest.raises(KeyError, match="unknown readiness condition"):
        readiness.mark("typo")


def _os_name() -> str:
    """The calling thread's kernel name, as `top -H` and /proc show it."""
    return Path(f"/proc/self/task/{threading.get_native_id()}/comm").read_text().strip()


def test_the_worker_threads_carry_their_names_to_the_os(tmp_path):
    lane = Lane("ultra", FakeIntake("ultra"), 1, 0.1)  # type: ignore[arg-type]
    stage = make_stage(tmp_path, background_commits=True)
    sink = SinkThread(stage)
    try:
        assert lane.reader.submit(_os_name).result() == "rs-ultra-intake"
        assert lane.judge_thread.submit(_os_name).result() == "rs-ultra-judge"
        assert sink.executor.submit(_os_name).result() == "rs-sink"
        assert stage._committer is not None
        assert stage._committer.submit(_os_name).result() == "rs-commit"
        assert set(stage.processor.pool.map(lambda _: _os_name(), range(4))) == {"rs-sandbox"}
        names: list[str] = []
        named = threading.Thread(target=lambda: (name_os_thread("n" * 40), names.append(_os_name())))
        named.start()
        named.join()
        assert names == ["n" * 15], "Linux keeps 15 bytes of a name; a longer one is cut, not refused"
    finally:
        for executor in (lane.reader, lane.judge_thread, sink.executor):
            executor.shutdown()
        stage.flush()


def test_no_function_in_stream_processors_is_longer_than_80_lines():
    too_long = []
    for path in sorted((REPO / "stream_processors").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                where = f"{path.relative_to(REPO)}:{node.name}"
                if length > LONGEST_FUNCTION:
                    too_long.append(f"{where} ({length} lines)")
    assert not too_long, f"functions longer than {LONGEST_FUNCTION} lines: {too_long}"
