"""Scale-out of the stream stage on a ready backlog: 1 worker against 2 workers in one group.

Each run starts `rollstream process --workers N` on a fresh 4-partition topic, app id, consumer
group and lake. The `--trajectories` fleet messages (encoded beforehand, code made precomputed:
the sandbox has bench/score.py) are published before the workers start, inside an open Kafka
transaction, so they wait on the broker unseen (read_committed). Once the group is stable with
every partition assigned, the transaction commits: the window runs from then (the whole backlog
available) to the last row in Delta, so publishing and start-up are outside it on both sides.
Rounds alternate 1 and 2 workers (bench/rounds.py); ratio = 2-worker / 1-worker throughput (the
1-worker run is the baseline, same data and window). The broker's CPU share over the window is
reported (`ours_broker_cpu_share`, `baseline_broker_cpu_share`: CPU seconds of every local broker
process over wall seconds x cores), and the workers' (`*_worker_cpu_share`): on a 2-core machine a
ratio near 1 says "out of cores", not "does not scale".

Needs a broker (`rollstream up`, or `rollstream up --brokers 3` with every address in
ROLLSTREAM_KAFKA__BOOTSTRAP_SERVERS).

    python bench/scale.py [--trajectories 10000] [--rounds 3] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psutil
from confluent_kafka import ConsumerGroupState, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic
from fleet_stream import Staged, delta_rows, fleet_messages
from rounds import Sample, alternate, emit, load_average, summary

REPO = Path(__file__).resolve().parents[1]
PARTITIONS = 4


def _topics(admin: AdminClient, tag: str) -> tuple[str, str]:
    names = (f"scale-raw-{tag}", f"scale-dlq-{tag}")
    futures = admin.create_topics(
        [
            # replication_factor -1: the cluster's default (1 on one broker, 3 with min.insync 2 on
            # `up --brokers 3`), as the pipeline's own topics get it
            NewTopic(names[0], PARTITIONS, -1, config={"max.message.bytes": str(4 * 2**20)}),
            NewTopic(names[1], 1, -1, config={"max.message.bytes": str(64 * 2**20)}),
        ]
    )
    for f in futures.values():
        f.result(timeout=30)
    return names


def _delete(admin: AdminClient, topics: tuple[str, str]) -> None:
    for f in admin.delete_topics(list(topics)).values():
        with contextlib.suppress(Exception):  # a topic already gone is fine
            f.result(timeout=30)


def _brokers(servers: str) -> list[psutil.Process]:
    """The processes listening on the bootstrap ports that run on this machine."""
    ports = {int(address.rpartition(":")[2]) for address in servers.split(",")}
    pids = {
        conn.pid
        for conn in psutil.net_connections(kind="tcp")
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port in ports and conn.pid
    }
    return [psutil.Process(pid) for pid in sorted(pids)]


def _cpu_seconds(procs: list[psutil.Process], *, tree: bool = False) -> float:
    total = 0.0
    for proc in procs:
        try:
            for p in [proc, *proc.children(recursive=True)] if tree else [proc]:
                times = p.cpu_times()
                total += times.user + times.system
        except psutil.Error:
            pass
    return total


def _stable(admin: AdminClient, group: str, members: int) -> bool:
    """True when `group` is stable with `members` members holding all PARTITIONS between them."""
    try:
        described = admin.describe_consumer_groups([group])[group].result(timeout=10)
    except (KafkaException, TimeoutError):  # no coordinator yet, or a slow answer: not stable yet
        return False
    if described.state != ConsumerGroupState.STABLE or len(described.members) != members:
        return False
    held = [tp.partition for m in described.members for tp in m.assignment.topic_partitions]
    return sorted(held) == list(range(PARTITIONS))


def _run(
    servers: str, admin: AdminClient, messages: list[tuple[bytes, bytes]], workers: int, work: Path
) -> Sample:
    """`rollstream process --workers N` on `messages` held back until the group is stable."""
    n = len(messages)
    tag = f"{workers}w-{uuid.uuid4().hex[:6]}"
    topics = _topics(admin, tag)
    staged = Staged(servers, topics, [], messages)
    lake, state = work / tag / "lake", work / tag / "state"
    state.mkdir(parents=True)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        "ROLLSTREAM_KAFKA__BOOTSTRAP_SERVERS": servers,
        "ROLLSTREAM_STATE_DIR": str(state),
        "ROLLSTREAM_LAKE_URI": str(lake),
        "ROLLSTREAM_KAFKA__RAW_TOPIC": topics[0],
        "ROLLSTREAM_KAFKA__DLQ_TOPIC": topics[1],
    }
    args = [sys.executable, "-m", "infra.cli", "process", "--app-id", f"scale-{tag}", "--no-ultra"]
    args += ["--workers", str(workers), "--loglevel", os.environ.get("BENCH_LOGLEVEL", "warning")]
    log = (state / "workers.log").open("w")
    proc = subprocess.Popen(args, cwd=state, env=env, stdout=log, stderr=subprocess.STDOUT)
    supervisor, brokers = psutil.Process(proc.pid), _brokers(servers)
    uri = str(lake / "trajectories")
    start = time.monotonic()
    try:
        while not _stable(admin, f"scale-{tag}", workers):
            if proc.poll() is not None:
                raise SystemExit(f"the workers exited with {proc.returncode}; see {state / 'workers.log'}")
            if time.monotonic() - start > 300:
                raise SystemExit(f"{workers} worker(s) did not form a stable group in 300 s")
            time.sleep(0.5)
        begin = (staged.release(), _cpu_seconds(brokers), _cpu_seconds([supervisor], tree=True))
        ready = begin[0]
        while True:
            rows = delta_rows(uri)
            now = time.monotonic()
            if rows >= n:
                break
            if proc.poll() is not None:
                raise SystemExit(f"the workers exited with {proc.returncode}; see {state / 'workers.log'}")
            if now - ready > 1800:
                raise SystemExit(f"{workers} worker(s) wrote {rows}/{n} rows in 30 min")
            time.sleep(0.1)
        broker_cpu, worker_cpu = _cpu_seconds(brokers), _cpu_seconds([supervisor], tree=True)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            for child in supervisor.children(recursive=True):
                child.kill()
            proc.kill()
            proc.wait()
        _delete(admin, topics)
    seconds, cores = max(now - begin[0], 1e-3), psutil.cpu_count() or 1
    return Sample(
        items=n,
        seconds=seconds,
        cpu_s=worker_cpu - begin[2],
        extra={
            "broker_cpu_share": (broker_cpu - begin[1]) / (seconds * cores),
            "worker_cpu_share": (worker_cpu - begin[2]) / (seconds * cores),
            "startup_s": ready - start,
            "brokers": len(brokers),
        },
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trajectories", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument(
        "--bootstrap-servers", default=os.environ.get("ROLLSTREAM_KAFKA__BOOTSTRAP_SERVERS", "127.0.0.1:9092")
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object on the last line")
    args = parser.parse_args()

    load_before = load_average()
    admin = AdminClient({"bootstrap.servers": args.bootstrap_servers})
    messages = fleet_messages(args.trajectories, args.seed)
    with tempfile.TemporaryDirectory(prefix="rollstream-scale-") as tmp:
        work = Path(tmp)
        samples = alternate(
            ("ours", lambda i: _run(args.bootstrap_servers, admin, messages, 2, work)),
            [("baseline", lambda i: _run(args.bootstrap_servers, admin, messages, 1, work))],
            args.rounds,
        )
    result = summary(samples, "ours", load_before, unit="trajectories")
    result.update(trajectories=args.trajectories, ours="2 workers", baseline="1 worker")
    emit(result, args.json)


if __name__ == "__main__":
    main()
