"""The stream stage from topic to rows in Delta, against a plain consumer + write_deltalake, on a real broker.

Ours: `rollstream process` (a subprocess: Faust, scoring of math and extraction, groups, domain
statistics, state in the commit) on a topic holding `--trajectories` fleet messages, code tasks
turned into precomputed ones (`without_code`: this benchmark scores math and extraction; the
sandbox has its own benchmark, bench/score.py). Baseline, in
the same run on the same messages: a confluent-kafka consumer that decodes each message (no
validation, no scoring) and appends Arrow tables with plain `write_deltalake`, committing by the
same rule as ours (64 MiB of messages or 1 s). Both rates are steady state: rows written after
the first commit over the time from the first commit to the last.
ratio = ours / baseline throughput (higher is better; 1.0 = as fast as the baseline).

p99_latency_s: a second worker idles on a fresh topic; groups (POOL_GROUPS encoded fleet groups,
re-sent under new ids: the generator shares the machine) are published at half ours' rate for
WARMUP_S and then `--latency-seconds`; per group published after the warm-up (which covers the
start-up rebalances of the worker's two consumers: the broker delays a new group's first
assignment by 3 s), the time from the publish of its last sample to its rows visible in the table
(polled every 50 ms). peak_rss_mb: the worker's peak resident memory (children
included) while it works through a backlog of `--backlog` messages (e.g. 200,000:
`--backlog 200000`, several minutes here).

Needs a broker: `rollstream up` (or set ROLLSTREAM_BOOTSTRAP_SERVERS).

    python bench/process.py [--trajectories 60000] [--backlog 50000] [--latency-seconds 20] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
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
from fleet_stream import bench_producer, delta_rows, fleet_messages, publish

from producers import SyntheticFleet
from producers.fleet import without_code
from schemas import TrajectoryCodec
from schemas.tables import TIMESTAMP
from stream_processors.delta_sink import list_column

REPO = Path(__file__).resolve().parents[1]
PARTITIONS = 4
COMMIT_BYTES = 64 * 2**20
COMMIT_INTERVAL_S = 1.0
BATCH = 500
WARMUP_S = 5.0
POOL_GROUPS = 500
"""Distinct fleet groups the latency test re-sends under new ids (4,000 messages, about 31 MB)."""


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


def _worker(
    servers: str, topics: tuple[str, str, str], lake: Path, state: Path, tag: str
) -> subprocess.Popen:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        "ROLLSTREAM_BOOTSTRAP_SERVERS": servers,
        "ROLLSTREAM_STATE_DIR": str(state),
        "ROLLSTREAM_LAKE_DIR": str(lake),
        "ROLLSTREAM_RAW_TOPIC": topics[0],
        "ROLLSTREAM_ULTRA_TOPIC": topics[1],
        "ROLLSTREAM_DLQ_TOPIC": topics[2],
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


def _ours(servers: str, topics: tuple[str, str, str], n: int, work: Path, tag: str) -> dict[str, float]:
    """Run the worker over `n` waiting messages; steady-state seconds and peak RSS."""
    uri = str(work / "lake" / "trajectories")
    start = time.monotonic()
    proc = _worker(servers, topics, work / "lake", work / "state", tag)
    watch = psutil.Process(proc.pid)
    first: tuple[float, int] | None = None
    peak = 0.0
    try:
        while True:
            peak = max(peak, _rss_mb(watch))
            rows = delta_rows(uri)
            now = time.monotonic()
            if rows and first is None:
                first = (now, rows)
            if rows >= n:
                break
            if proc.poll() is not None:
                raise SystemExit(f"the worker exited with {proc.returncode}; see {work / 'state'}")
            if now - start > 1800:
                raise SystemExit(f"the worker wrote {rows}/{n} rows in 30 min")
            time.sleep(0.2)
    finally:
        _stop(proc)
    assert first is not None
    return {
        "steady_s": now - first[0],
        "steady_rows": n - first[1],
        "total_s": now - start,
        "peak_rss_mb": peak,
    }


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


def _baseline(servers: str, topic: str, n: int, work: Path) -> dict[str, float]:
    """Plain consumer, decode, write_deltalake with the same commit rule; steady-state seconds."""
    uri = str(work / "baseline")
    work.mkdir(parents=True, exist_ok=True)
    codec = TrajectoryCodec()
    start = time.monotonic()
    consumer = Consumer(
        {
            "bootstrap.servers": servers,
            "group.id": f"bench-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
    properties = WriterProperties(compression="ZSTD")
    records: list[dict[str, Any]] = []
    coords: list[tuple[str, int, int]] = []
    size, since, done = 0, time.monotonic(), 0
    first: tuple[float, int] | None = None
    try:
        while done < n:
            for msg in consumer.consume(BATCH, timeout=0.5):
                if msg.error() is None:
                    records.append(codec.decode(msg.value()))
                    coords.append((msg.topic(), msg.partition(), msg.offset()))
                    size += len(msg.value())
            now = time.monotonic()
            due = size >= COMMIT_BYTES or now - since >= COMMIT_INTERVAL_S or done + len(records) >= n
            if records and due:
                write_deltalake(
                    uri, _decoded_table(records, coords), mode="append", writer_properties=properties
                )
                done += len(records)
                records, coords, size, since = [], [], 0, time.monotonic()
                if first is None:
                    first = (time.monotonic(), done)
    finally:
        consumer.close()
    end = time.monotonic()
    assert first is not None
    return {"steady_s": end - first[0], "steady_rows": n - first[1], "total_s": end - start}


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


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--trajectories",
        type=int,
        default=60_000,
        help="messages of the throughput runs; fewer overstate ours, whose rows become visible a "
        "commit behind its work (the committer writes while the next commit fills)",
    )
    parser.add_argument(
        "--backlog", type=int, default=50_000, help="messages for peak_rss_mb (issue: 200000)"
    )
    parser.add_argument("--latency-seconds", type=float, default=20.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=2, help="alternating runs of each; the best counts")
    parser.add_argument(
        "--bootstrap-servers", default=os.environ.get("ROLLSTREAM_BOOTSTRAP_SERVERS", "127.0.0.1:9092")
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    servers = args.bootstrap_servers
    admin = AdminClient({"bootstrap.servers": servers})
    try:
        admin.list_topics(timeout=10)
    except Exception as exc:
        raise SystemExit(f"no broker at {servers} ({exc}): run `rollstream up` first") from exc

    tag = uuid.uuid4().hex[:6]
    messages = fleet_messages(args.trajectories, args.seed)
    megabytes = sum(len(v) for _, v in messages) / 1e6
    topics = _topics(admin, f"t-{tag}")
    publish(servers, topics[0], messages)
    with tempfile.TemporaryDirectory(prefix="bench-process-") as tmp:
        work = Path(tmp)
        # Alternating runs on the same messages, the best of each: the machine is shared.
        runs: dict[str, list[dict[str, float]]] = {"ours": [], "baseline": []}
        for i in range(args.repeats):
            runs["baseline"].append(_baseline(servers, topics[0], len(messages), work / f"base-{i}"))
            runs["ours"].append(_ours(servers, topics, len(messages), work / f"ours-{i}", f"ours-{i}"))
        ours = max(runs["ours"], key=lambda r: r["steady_rows"] / r["steady_s"])
        baseline = max(runs["baseline"], key=lambda r: r["steady_rows"] / r["steady_s"])
        ours_rate = ours["steady_rows"] / ours["steady_s"]
        base_rate = baseline["steady_rows"] / baseline["steady_s"]
        latencies = _latency(
            servers, _topics(admin, f"l-{tag}"), ours_rate / 2, args.latency_seconds, work / "lat"
        )
        backlog_topics = _topics(admin, f"b-{tag}")
        codec = TrajectoryCodec()
        stream = without_code(SyntheticFleet(seed=args.seed + 1).trajectories(args.backlog))
        publish(servers, backlog_topics[0], ((r["group_id"].encode(), codec.encode(r)) for r in stream))
        rss = _ours(servers, backlog_topics, args.backlog, work / "backlog", "backlog")
    admin.delete_topics(
        [*topics, *(f"bench-{k}-{s}-{tag}" for k in ("raw", "ultra", "dlq") for s in ("l", "b"))]
    )
    result = {
        "trajectories": len(messages),
        "message_mb": round(megabytes, 1),
        "ours_trajectories_per_s": round(ours_rate, 1),
        "ours_mb_per_s": round(megabytes * ours_rate / len(messages), 2),
        "ours_total_s": round(ours["total_s"], 2),
        "baseline_trajectories_per_s": round(base_rate, 1),
        "baseline_mb_per_s": round(megabytes * base_rate / len(messages), 2),
        "baseline_total_s": round(baseline["total_s"], 2),
        "ratio": round(ours_rate / base_rate, 3),
        "ours_runs_per_s": [round(r["steady_rows"] / r["steady_s"], 1) for r in runs["ours"]],
        "baseline_runs_per_s": [round(r["steady_rows"] / r["steady_s"], 1) for r in runs["baseline"]],
        "latency_rate_per_s": round(ours_rate / 2, 1),
        "latency_groups": len(latencies),
        "p50_latency_s": round(float(np.percentile(latencies, 50)), 3),
        "p99_latency_s": round(float(np.percentile(latencies, 99)), 3),
        "backlog": args.backlog,
        "peak_rss_mb": round(rss["peak_rss_mb"], 1),
        "backlog_trajectories_per_s": round(rss["steady_rows"] / rss["steady_s"], 1),
    }
    if not args.json:
        for key, value in result.items():
            print(f"{key:>30}  {value}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
