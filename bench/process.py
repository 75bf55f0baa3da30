"""The stream stage from topic to rows in Delta, against two plain consumer + write_deltalake programs.

Ours: `rollstream process` (a subprocess: Faust, scoring of math and extraction, groups, domain
statistics, state in the commit) on fleet messages whose code tasks are precomputed (the sandbox
has bench/score.py; `--code-messages` adds one run of ours on real sandboxed code tasks).

Baselines, on the same messages: a confluent-kafka consumer that decodes each message (no
validation, no scoring) into Arrow and appends with `write_deltalake`, using the stage's own
writer properties (`delta_sink.writer_properties()`: ZSTD, dictionary encoding only on the
low-cardinality strings) and the stage's commit rule: 32 MiB of messages
(`StreamDefaults.commit_mib`) or 1 s. Both consume with the worker's fetch settings
(`lanes.FETCH["raw"]`: 4 MiB per partition; `fetch.queue.backoff.ms` 10). With librdkafka's
1,000 ms default backoff a consumer whose queue filled waited up to a second for its next fetch:
the threaded baseline drained 13,726 to 14,225 messages/s against 19,273 to 20,722/s with 10 ms
(40,000 messages, 3 alternated runs each, load average 0.6 to 0.8); with 4 MiB per partition
instead of the default 1 MiB, 20,691 to 21,225/s against 15,551 to 20,595/s (3 runs each, load 0.4
to 1.3). With those settings 32 MiB commits are as fast as any: 22,123 (median of 3) against
19,856/s with 64 MiB and 13,358/s with 128; 25,019 against 26,641/s with 16 and 19,057 (of 2) with
8 (alternated, load 1.0 to 1.5). Before the backoff was set, 64 MiB had been the fastest.
`baseline-serial` consumes, decodes and writes one after another in one thread;
`baseline-threaded` decodes and builds each commit's table in one thread while a second thread
writes the previous one (a queue of two), so the write's Rust and ZSTD time overlaps the decode.
The old baseline form (dictionary encoding tried on every column) runs once beside them.

Window, the same on every side: each run gets a fresh topic holding `WARMUP_MESSAGES` warm-up
messages and, in an open Kafka transaction, the measured messages (read_committed consumers,
librdkafka's default, do not see them). The side starts, and once its warm-up rows are visible
(start-up, rebalances, the verifier pool's imports done) the transaction commits: from that
moment (first message available) to the last measured row visible in the table (polled every
0.1 s) is the window. Rounds alternate (bench/rounds.py); `ratio` is the median of ours /
the better baseline per round.

`ours_cpu_us_<thread>`: ours' CPU per trajectory by OS thread name over the window (the worker's
threads name themselves: stream_processors/thread_names.py; delta-rs's `tokio_rt_worker`,
librdkafka's `rdk_broker`; `python` is the event loop and any thread not named), medians over rounds.

p99_latency_s: groups published at half ours' median rate to an idle worker; per group, from the
publish of its last sample to its rows visible. peak_rss_mb: the worker's peak resident memory
(children included) over a backlog of `--backlog` messages.

`--only latency,rss` runs just those parts (of throughput, code, latency, rss); without the
throughput rounds the latency test publishes at `--latency-rate` (half the last measured median).

Needs a broker: `rollstream up` (or set ROLLSTREAM_KAFKA__BOOTSTRAP_SERVERS).

    python bench/process.py [--trajectories 30000] [--rounds 3] [--backlog 50000] [--json]
    python bench/process.py --only latency,rss --latency-rate 3575
"""

from __future__ import annotations

import argparse
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.parquet as pq
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from deltalake import DeltaTable, WriterProperties, write_deltalake
from fleet_stream import Staged, bench_producer, delta_rows, fleet_messages, publish
from rounds import Sample, alternate, cpu_seconds, emit, load_average, summary

from producers import SyntheticFleet
from producers.fleet import without_code
from schemas import TrajectoryCodec
from schemas.defaults import StreamDefaults
from schemas.tables import TIMESTAMP
from stream_processors.delta_sink import list_column, writer_properties
from stream_processors.lanes import FETCH, FETCH_QUEUE_BACKOFF_MS

REPO = Path(__file__).resolve().parents[1]
PARTITIONS = 4
BASELINE_COMMIT_BYTES = StreamDefaults.commit_mib * 2**20
"""The baselines' commit size: the stage's, as fast for them as any (the module doc)."""
COMMIT_INTERVAL_S = StreamDefaults.commit_interval_s
BATCH = 500
WARMUP_S = 5.0
POOL_GROUPS = 500
"""Distinct fleet groups the latency test re-sends under new ids (4,000 messages, about 31 MB)."""
WARMUP_MESSAGES = 2_000
"""Messages a side works through before its window opens (start-up, rebalances, pool imports)."""
PARTS = ("throughput", "code", "latency", "rss")
"""What `--only` chooses from: the rounds against the baselines, the run on code tasks, p99 latency, peak RSS."""


def _topics(admin: AdminClient, tag: str) -> tuple[str, str, str]:
    names = (f"bench-raw-{tag}", f"bench-ultra-{tag}", f"bench-dlq-{tag}")
    big = {"max.message.bytes": str(64 * 2**20)}
    futures = admin.create_topics(
        [
            NewTopic(names[0], PARTITIONS, 1, config={"max.message.bytes": str(4 * 2**20)}),
            NewTopic(names[1], 2, 1, config=big),
            NewTopic(names[2], 1, 1, config=big),
        ]
    )
    for f in futures.values():
        f.result(timeout=30)
    return names


def _worker(servers: str, topics: tuple[str, ...], lake: Path, state: Path, tag: str) -> subprocess.Popen:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        "ROLLSTREAM_KAFKA__BOOTSTRAP_SERVERS": servers,
        "ROLLSTREAM_STATE_DIR": str(state),
        "ROLLSTREAM_LAKE_URI": str(lake),
        "ROLLSTREAM_KAFKA__RAW_TOPIC": topics[0],
        "ROLLSTREAM_KAFKA__ULTRA_TOPIC": topics[1],
        "ROLLSTREAM_KAFKA__DLQ_TOPIC": topics[2],
    }
    state.mkdir(parents=True, exist_ok=True)
    log = (state / f"worker-{tag}.log").open("w")
    args = [
        sys.executable,
        "-m",
        "infra.cli",
        "process",
        "--app-id",
        f"bench-{tag}",
        "--loglevel",
        os.environ.get("BENCH_LOGLEVEL", "warning"),
        *os.environ.get("BENCH_WORKER_ARGS", "").split(),  # e.g. "--batch-size 1000" to compare settings
    ]
    return subprocess.Popen(args, cwd=state, env=env, stdout=log, stderr=subprocess.STDOUT)


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _rss_mb(proc: psutil.Process) -> float:
    try:
        total = proc.memory_info().rss + sum(c.memory_info().rss for c in proc.children(recursive=True))
    except psutil.Error:
        return 0.0
    return total / 2**20


def _decoded_table(records: list[dict[str, Any]], coords: list[tuple[str, int, int]]) -> pa.Table:
    def unpack(field: str, dtype: str) -> list[np.ndarray]:
        return [np.frombuffer(r[field], dtype) for r in records]

    return pa.table(
        {
            "trajectory_id": [r["trajectory_id"] for r in records],
            "group_id": [r["group_id"] for r in records],
            "sample_index": pa.array([r["sample_index"] for r in records], pa.int32()),
            "group_size": pa.array([r["group_size"] for r in records], pa.int32()),
            "domain": [r["domain"] for r in records],
            "task_type": [r["task_type"] for r in records],
            "policy_version": pa.array([r["policy_version"] for r in records], pa.int64()),
            "prompt_tokens": list_column(unpack("prompt_tokens", "<i4"), pa.int32()),
            "response_tokens": list_column(unpack("response_tokens", "<i4"), pa.int32()),
            "response_logprobs": list_column(unpack("response_logprobs", "<f4"), pa.float32()),
            "response_text": [r.get("response_text", "") for r in records],
            "finish_reason": [r["finish_reason"] for r in records],
            "worker_id": [r["worker_id"] for r in records],
            "created_at": pa.array([r["created_at"] for r in records], TIMESTAMP),
            "metadata": pa.array(
                [list(r["metadata"].items()) for r in records], pa.map_(pa.string(), pa.string())
            ),
            "topic": [c[0] for c in coords],
            "partition": pa.array([c[1] for c in coords], pa.int32()),
            "offset": pa.array([c[2] for c in coords], pa.int64()),
        }
    )


def _group_pool(groups: int) -> list[tuple[str, list[tuple[str, bytes]]]]:
    """`groups` encoded fleet groups of 8: (group id, [(trajectory id, message)])."""
    codec = TrajectoryCodec()
    fleet = SyntheticFleet(seed=99)
    out = []
    for _ in range(groups):
        records = list(without_code(fleet.trajectories(8)))
        out.append((records[0]["group_id"], [(r["trajectory_id"], codec.encode(r)) for r in records]))
    return out


def _fresh(group: tuple[str, list[tuple[str, bytes]]]) -> tuple[str, list[bytes]]:
    """A pooled group under new ids: its uuids swapped in the encoded bytes for new ones of the same
    length (an Avro string is its length and its bytes), so the generator costs microseconds a
    message instead of the ~55 us of building and encoding one, which the worker would lose."""
    group_id, members = group
    new_group = str(uuid.uuid4())
    out = []
    for trajectory_id, value in members:
        value = value.replace(group_id.encode(), new_group.encode())
        out.append(value.replace(trajectory_id.encode(), str(uuid.uuid4()).encode()))
    return new_group, out


def _latency(
    servers: str, topics: tuple[str, str, str], rate: float, seconds: float, work: Path
) -> list[float]:
    """Publish whole groups at `rate` messages/s to an idle worker; per group, publish-to-visible seconds."""
    uri = str(work / "lake" / "trajectories")
    pool = _group_pool(POOL_GROUPS)
    proc = _worker(servers, topics, work / "lake", work / "state", "latency")
    producer = bench_producer(servers)
    try:
        warm_id, warm = _fresh(pool[0])
        for value in warm:
            producer.produce(topics[0], value=value, key=warm_id.encode())
        producer.flush(30)
        deadline = time.monotonic() + 180
        while delta_rows(uri) < 8:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the latency worker never wrote its warm-up group; see {work / 'state'}")
            time.sleep(0.1)
        table = DeltaTable(uri)  # one handle, brought up to date incrementally: the poll stays cheap
        seen_files: set[str] = set(pa.table(table.get_add_actions(flatten=True)).column("path").to_pylist())
        published: dict[str, float] = {}
        visible: dict[str, float] = {}
        start = time.monotonic()
        measured = start + WARMUP_S  # groups published before this are the warm-up
        sent = 0
        next_poll = start
        duration = WARMUP_S + seconds
        while time.monotonic() - start < duration or len(visible) < len(published):
            now = time.monotonic()
            if now - start < duration and sent < rate * (now - start):
                group_id, values = _fresh(pool[len(published) % len(pool)])
                for value in values:
                    producer.produce(topics[0], value=value, key=group_id.encode())
                    sent += 1
                published[group_id] = time.monotonic()
                producer.poll(0)
                continue
            if now >= next_poll:
                next_poll = now + 0.05
                table.update_incremental()
                for path in pa.table(table.get_add_actions(flatten=True)).column("path").to_pylist():
                    if path not in seen_files:
                        seen_files.add(path)
                        for group_id in (
                            pq.read_table(f"{uri}/{path}", columns=["group_id"]).column(0).to_pylist()
                        ):
                            visible.setdefault(group_id, time.monotonic())
            if now - start > duration + 120:
                raise SystemExit(f"{len(published) - len(visible)} groups never became visible")
            time.sleep(0.005)
        producer.flush(30)
    finally:
        _stop(proc)
    if os.environ.get("BENCH_LATENCY_TRACE"):
        # per second of the run (warm-up included): the worst latency, to see when tails happen
        for second in range(int(duration) + 1):
            worst = [visible[g] - t for g, t in published.items() if int(t - start) == second]
            print(f"{second} s: {len(worst)} groups, worst {max(worst, default=0):.2f} s", file=sys.stderr)
    return [visible[g] - t for g, t in published.items() if t >= measured]


Messages = list[tuple[bytes, bytes]]


def _tree_cpu(proc: psutil.Process) -> float:
    """CPU seconds of `proc` and its live children."""
    total = 0.0
    try:
        for p in [proc, *proc.children(recursive=True)]:
            times = p.cpu_times()
            total += times.user + times.system + times.children_user + times.children_system
    except psutil.Error:
        pass
    return total


def _thread_cpu(proc: psutil.Process) -> dict[tuple[int, int], tuple[str, float]]:
    """CPU seconds of each thread of `proc` and its live children, by (pid, tid), with the thread's
    OS name (stream_processors/thread_names.py) less any trailing digits (rdk:broker1). Linux
    only: elsewhere empty."""
    out: dict[tuple[int, int], tuple[str, float]] = {}
    tick = os.sysconf("SC_CLK_TCK")
    try:
        pids = [proc.pid, *(c.pid for c in proc.children(recursive=True))]
    except psutil.Error:
        return out
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").glob("*"):
            try:
                stat, name = (task / "stat").read_text(), (task / "comm").read_text().strip()
            except OSError:
                continue  # the thread ended
            fields = stat[stat.rindex(")") + 2 :].split()  # utime and stime are fields 14 and 15
            out[(pid, int(task.name))] = (
                name.rstrip("0123456789"),
                (int(fields[11]) + int(fields[12])) / tick,
            )
    return out


def _per_thread(
    before: dict[tuple[int, int], tuple[str, float]],
    after: dict[tuple[int, int], tuple[str, float]],
    items: int,
) -> dict[str, float]:
    """`cpu_us_<name>`: microseconds of CPU per item by thread name over the window (threads that
    started in it count from zero; one that ended in it is missing)."""
    per: dict[str, float] = {}
    for key, (name, seconds) in after.items():
        spent = seconds - before.get(key, (name, 0.0))[1]
        label = "cpu_us_" + "".join(ch if ch.isalnum() else "_" for ch in name).strip("_").lower()
        per[label] = per.get(label, 0.0) + spent * 1e6 / items
    return {k: round(v, 1) for k, v in per.items() if v >= 0.5}


def _wait_rows(uri: str, rows: int, alive: Any, what: str, limit_s: float = 1800) -> float:
    """Poll the table every 0.1 s until it holds `rows`; returns the moment it did."""
    start = time.monotonic()
    while delta_rows(uri) < rows:
        if not alive():
            raise SystemExit(f"{what} stopped before {rows} rows")
        if time.monotonic() - start > limit_s:
            raise SystemExit(f"{what} wrote fewer than {rows} rows in {limit_s:.0f} s")
        time.sleep(0.1)
    return time.monotonic()


def _ours_side(admin: AdminClient, servers: str, warm: Messages, measured: Messages, work: Path) -> Sample:
    staged = Staged(servers, _topics(admin, uuid.uuid4().hex[:8]), warm, measured)
    tag = uuid.uuid4().hex[:6]
    run = work / f"ours-{tag}"
    uri = str(run / "lake" / "trajectories")
    proc = _worker(servers, staged.topics, run / "lake", run / "state", tag)
    watch = psutil.Process(proc.pid)
    alive = lambda: proc.poll() is None  # noqa: E731
    try:
        _wait_rows(uri, len(warm), alive, "the worker (warm-up)")
        cpu0, threads0 = _tree_cpu(watch), _thread_cpu(watch)
        t0 = staged.release()
        t1 = _wait_rows(uri, len(warm) + len(measured), alive, "the worker")
        cpu1, threads1 = _tree_cpu(watch), _thread_cpu(watch)
    finally:
        _stop(proc)
        admin.delete_topics(list(staged.topics))
    extra = _per_thread(threads0, threads1, len(measured))
    return Sample(items=len(measured), seconds=t1 - t0, cpu_s=cpu1 - cpu0, extra=extra)


def _baseline_run(
    servers: str, topic: str, total: int, uri: str, properties: WriterProperties, threaded: bool
) -> None:
    """Consume `total` messages, decode them and append them by the commit rule (one or two threads)."""
    codec = TrajectoryCodec()
    consumer = Consumer(
        {
            "bootstrap.servers": servers,
            "group.id": f"bench-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
            **FETCH["raw"],
            "fetch.queue.backoff.ms": FETCH_QUEUE_BACKOFF_MS,
        }
    )
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
    tables: queue.Queue[pa.Table | None] = queue.Queue(maxsize=2)
    failure: list[BaseException] = []

    def write(table: pa.Table) -> None:
        write_deltalake(uri, table, mode="append", writer_properties=properties)

    def writer() -> None:
        try:
            while (table := tables.get()) is not None:
                write(table)
        except BaseException as exc:  # surfaced by the consuming thread
            failure.append(exc)

    thread = threading.Thread(target=writer, daemon=True) if threaded else None
    if thread:
        thread.start()
    pending: list[Any] = []
    size, since, done = 0, time.monotonic(), 0
    try:
        while done < total:
            if failure:
                raise failure[0]
            for msg in consumer.consume(BATCH, timeout=0.1):
                if msg.error() is None:
                    pending.append(msg)
                    size += len(msg.value() or b"")
            now = time.monotonic()
            due = (
                size >= BASELINE_COMMIT_BYTES
                or now - since >= COMMIT_INTERVAL_S
                or done + len(pending) >= total
            )
            if pending and due:
                records = [codec.decode(m.value()) for m in pending]
                coords = [(m.topic(), m.partition(), m.offset()) for m in pending]
                table = _decoded_table(records, coords)
                if thread:
                    tables.put(table)
                else:
                    write(table)
                done += len(pending)
                pending, size, since = [], 0, time.monotonic()
    finally:
        if thread:
            tables.put(None)
            thread.join()
        consumer.close()
    if failure:
        raise failure[0]


def _baseline_side(
    admin: AdminClient,
    servers: str,
    warm: Messages,
    measured: Messages,
    work: Path,
    properties: WriterProperties,
    threaded: bool,
) -> Sample:
    staged = Staged(servers, _topics(admin, uuid.uuid4().hex[:8]), warm, measured)
    uri = str(work / f"base-{uuid.uuid4().hex[:6]}")
    total = len(warm) + len(measured)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            _baseline_run(servers, staged.topics[0], total, uri, properties, threaded)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    alive = lambda: thread.is_alive() or not errors  # noqa: E731
    try:
        _wait_rows(uri, len(warm), alive, "the baseline (warm-up)")
        cpu0 = cpu_seconds()
        t0 = staged.release()
        t1 = _wait_rows(uri, total, alive, "the baseline")
        cpu1 = cpu_seconds()
        thread.join()
    finally:
        admin.delete_topics(list(staged.topics))
    if errors:
        raise SystemExit(f"the baseline failed: {errors[0]!r}")
    return Sample(items=len(measured), seconds=t1 - t0, cpu_s=cpu1 - cpu0)


def _backlog_rss(servers: str, topics: tuple[str, str, str], n: int, work: Path) -> dict[str, float]:
    """Run the worker over `n` waiting messages; its peak RSS and rate (start-up included)."""
    uri = str(work / "lake" / "trajectories")
    start = time.monotonic()
    proc = _worker(servers, topics, work / "lake", work / "state", "backlog")
    watch = psutil.Process(proc.pid)
    peak = 0.0
    try:
        while (rows := delta_rows(uri)) < n:
            peak = max(peak, _rss_mb(watch))
            if proc.poll() is not None:
                raise SystemExit(f"the worker exited with {proc.returncode}; see {work / 'state'}")
            if time.monotonic() - start > 1800:
                raise SystemExit(f"the worker wrote {rows}/{n} rows in 30 min")
            time.sleep(0.2)
    finally:
        _stop(proc)
    return {"peak_rss_mb": peak, "per_s": n / (time.monotonic() - start)}


def _code_messages(n: int, seed: int) -> Messages:
    """`n` fleet messages with their code tasks kept (judged in the sandbox)."""
    codec = TrajectoryCodec()
    return [(r["group_id"].encode(), codec.encode(r)) for r in SyntheticFleet(seed=seed).trajectories(n)]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trajectories", type=int, default=30_000, help="measured messages per run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--backlog", type=int, default=50_000, help="messages for peak_rss_mb (0: skip)")
    parser.add_argument("--latency-seconds", type=float, default=20.0, help="0: skip the latency test")
    parser.add_argument(
        "--code-messages", type=int, default=2_000, help="one run of ours with sandboxed code (0: skip)"
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--only",
        default=",".join(PARTS),
        help=f"comma-separated parts to run, of {','.join(PARTS)} (default all)",
    )
    parser.add_argument(
        "--latency-rate",
        type=float,
        default=None,
        help="messages/s of the latency test; default half ours' median rate (needed without throughput)",
    )
    parser.add_argument(
        "--bootstrap-servers", default=os.environ.get("ROLLSTREAM_KAFKA__BOOTSTRAP_SERVERS", "127.0.0.1:9092")
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    parts = {p.strip() for p in args.only.split(",") if p.strip()}
    if parts - set(PARTS):
        raise SystemExit(
            f"--only: unknown parts {sorted(parts - set(PARTS))}; choose from {', '.join(PARTS)}"
        )
    if "latency" in parts and "throughput" not in parts and args.latency_rate is None:
        raise SystemExit("--only without throughput: give --latency-rate (half ours' median rate, e.g. 3575)")
    servers = args.bootstrap_servers
    admin = AdminClient({"bootstrap.servers": servers})
    try:
        admin.list_topics(timeout=10)
    except Exception as exc:
        raise SystemExit(f"no broker at {servers} ({exc}): run `rollstream up` first") from exc

    load_before = load_average()
    measured = fleet_messages(args.trajectories, args.seed) if "throughput" in parts else []
    warm = fleet_messages(WARMUP_MESSAGES, args.seed + 1000) if parts & {"throughput", "code"} else []
    megabytes = sum(len(v) for _, v in measured) / 1e6
    new_props = writer_properties()
    old_props = WriterProperties(compression="ZSTD")
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-process-") as tmp:
        work = Path(tmp)
        if "throughput" in parts:
            samples = alternate(
                ("ours", lambda i: _ours_side(admin, servers, warm, measured, work)),
                [
                    (
                        "baseline-serial",
                        lambda i: _baseline_side(admin, servers, warm, measured, work, new_props, False),
                    ),
                    (
                        "baseline-threaded",
                        lambda i: _baseline_side(admin, servers, warm, measured, work, new_props, True),
                    ),
                ],
                args.rounds,
            )
            old = _baseline_side(admin, servers, warm, measured, work, old_props, False)
            result = summary(samples, "ours", load_before, unit="trajectories")
            result.update(
                trajectories=len(measured),
                message_mb=round(megabytes, 1),
                ours_mb_per_s=round(megabytes * result["ours_per_s"] / len(measured), 2),
                baseline_old_form_per_s=round(old.rate, 1),
            )
        else:
            result["load_before"] = load_before
        if args.code_messages and "code" in parts:
            code = _code_messages(args.code_messages, args.seed + 2000)
            try:
                with_code = _ours_side(admin, servers, warm, code, work)
                result["ours_with_code_per_s"] = round(with_code.rate, 1)
                result["code_messages"] = len(code)
            except (SystemExit, Exception) as exc:
                result["ours_with_code_error"] = str(exc)
        if args.latency_seconds and "latency" in parts:
            tag = uuid.uuid4().hex[:6]
            rate = args.latency_rate if args.latency_rate is not None else result["ours_per_s"] / 2
            latencies = _latency(
                servers, _topics(admin, f"l-{tag}"), rate, args.latency_seconds, work / "lat"
            )
            result.update(
                latency_rate_per_s=round(rate, 1),
                latency_groups=len(latencies),
                p50_latency_s=round(float(np.percentile(latencies, 50)), 3),
                p99_latency_s=round(float(np.percentile(latencies, 99)), 3),
            )
        if args.backlog and "rss" in parts:
            backlog_topics = _topics(admin, f"b-{uuid.uuid4().hex[:6]}")
            codec = TrajectoryCodec()
            stream = without_code(SyntheticFleet(seed=args.seed + 1).trajectories(args.backlog))
            publish(servers, backlog_topics[0], ((r["group_id"].encode(), codec.encode(r)) for r in stream))
            rss = _backlog_rss(servers, backlog_topics, args.backlog, work / "backlog")
            admin.delete_topics(list(backlog_topics))
            result.update(
                backlog=args.backlog,
                peak_rss_mb=round(rss["peak_rss_mb"], 1),
                backlog_per_s_with_start_up=round(rss["per_s"], 1),
            )
    result["load_after"] = load_average()
    emit(result, args.json)


if __name__ == "__main__":
    main()
