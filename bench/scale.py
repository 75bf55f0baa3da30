"""Scale-out of the stream stage: trajectories/s with 1 worker and with 2 workers in one group.

Each run starts `rollstream process --workers N` on a fresh 4-partition topic, app id, consumer
group and lake, waits until the group is stable with every partition assigned (so start-up and
the joins' rebalances stay out of the figure), then publishes the same `--trajectories` fleet
messages, encoded beforehand (code samples made precomputed, so the sandbox, which
bench/score.py measures, does not dominate). Throughput: the messages over the time from the
start of publishing to the last row in Delta (publishing overlaps processing; it is the same in
both runs). ratio = 2-worker throughput / 1-worker throughput (the baseline is 1 worker,
measured in the same run; higher is better). On a machine of 2 cores shared with the broker, the
broker's CPU share is reported beside it (`broker_cpu_share_*`: the broker's CPU seconds over
wall seconds x cores, over the same window), and the workers' (`worker_cpu_share_*`), since
a ratio near 1 there says "out of cores", not "does not scale".

Needs a broker: `rollstream up` (or set ROLLSTREAM_BOOTSTRAP_SERVERS).

    python bench/scale.py [--trajectories 10000] [--repeats 1] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
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
from fleet_stream import delta_rows, fleet_messages, publish

REPO = Path(__file__).resolve().parents[1]
PARTITIONS = 4


def _topics(admin: AdminClient, tag: str) -> tuple[str, str]:
    names = (f"scale-raw-{tag}", f"scale-dlq-{tag}")
    futures = admin.create_topics(
        [
            NewTopic(names[0], PARTITIONS, 1, config={"max.message.bytes": str(4 * 2**20)}),
            NewTopic(names[1], 1, 1, config={"max.message.bytes": str(64 * 2**20)}),
        ]
    )
    for f in futures.values():
        f.result(timeout=30)
    return names


def _delete(admin: AdminClient, topics: tuple[str, str]) -> None:
    for f in admin.delete_topics(list(topics)).values():
        with contextlib.suppress(Exception):  # a topic already gone is fine
            f.result(timeout=30)


def _broker(servers: str) -> psutil.Process | None:
    """The process listening on the first bootstrap port, when it runs on this machine."""
    port = int(servers.split(",")[0].rpartition(":")[2])
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid:
            return psutil.Process(conn.pid)
    return None


def _cpu_seconds(proc: psutil.Process | None, *, tree: bool = False) -> float:
    if proc is None:
        return 0.0
    try:
        procs = [proc, *proc.children(recursive=True)] if tree else [proc]
        total = 0.0
        for p in procs:
            times = p.cpu_times()
            total += times.user + times.system
        return total
    except psutil.Error:
        return 0.0


def _stable(admin: AdminClient, group: str, members: int) -> bool:
    """True when `group` is stable with `members` members holding all PARTITIONS between them."""
    try:
        described = admin.describe_consumer_groups([group])[group].result(timeout=10)
    except KafkaException:
        return False
    if described.state != ConsumerGroupState.STABLE or len(described.members) != members:
        return False
    held = [tp.partition for m in described.members for tp in m.assignment.topic_partitions]
    return sorted(held) == list(range(PARTITIONS))


def _run(
    servers: str, admin: AdminClient, messages: list[tuple[bytes, bytes]], workers: int, work: Path
) -> dict[str, float]:
    """`rollstream process --workers N`, stable, then `messages` published; steady-state rate and CPU shares."""
    n = len(messages)
    tag = f"{workers}w-{uuid.uuid4().hex[:6]}"
    topics = _topics(admin, tag)
    lake, state = work / tag / "lake", work / tag / "state"
    state.mkdir(parents=True)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        "ROLLSTREAM_BOOTSTRAP_SERVERS": servers,
        "ROLLSTREAM_STATE_DIR": str(state),
        "ROLLSTREAM_LAKE_DIR": str(lake),
        "ROLLSTREAM_RAW_TOPIC": topics[0],
        "ROLLSTREAM_DLQ_TOPIC": topics[1],
    }
    args = [sys.executable, "-m", "infra.cli", "process", "--app-id", f"scale-{tag}", "--no-ultra"]
    args += ["--workers", str(workers), "--loglevel", os.environ.get("BENCH_LOGLEVEL", "warning")]
    log = (state / "workers.log").open("w")
    proc = subprocess.Popen(args, cwd=state, env=env, stdout=log, stderr=subprocess.STDOUT)
    supervisor, broker = psutil.Process(proc.pid), _broker(servers)
    uri = str(lake / "trajectories")
    start = time.monotonic()
    try:
        while not _stable(admin, f"scale-{tag}", workers):
            if proc.poll() is not None:
                raise SystemExit(f"the workers exited with {proc.returncode}; see {state / 'workers.log'}")
            if time.monotonic() - start > 300:
                raise SystemExit(f"{workers} worker(s) did not form a stable group in 300 s")
            time.sleep(0.5)
        ready = time.monotonic()
        begin = (ready, _cpu_seconds(broker), _cpu_seconds(supervisor, tree=True))
        publish(servers, topics[0], messages)
        published = time.monotonic()
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
        broker_cpu, worker_cpu = _cpu_seconds(broker), _cpu_seconds(supervisor, tree=True)
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
    return {
        "rate": n / seconds,
        "broker_cpu_share": (broker_cpu - begin[1]) / (seconds * cores),
        "worker_cpu_share": (worker_cpu - begin[2]) / (seconds * cores),
        "startup_s": ready - start,
        "publish_s": published - ready,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trajectories", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=1, help="alternating runs of each; the best counts")
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument(
        "--bootstrap-servers", default=os.environ.get("ROLLSTREAM_BOOTSTRAP_SERVERS", "127.0.0.1:9092")
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object on the last line")
    args = parser.parse_args()

    admin = AdminClient({"bootstrap.servers": args.bootstrap_servers})
    messages = fleet_messages(args.trajectories, args.seed)
    best: dict[int, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="rollstream-scale-") as tmp:
        for _ in range(args.repeats):
            for workers in (1, 2):
                result = _run(args.bootstrap_servers, admin, messages, workers, Path(tmp))
                print(
                    f"{workers} worker(s): {result['rate']:.0f} trajectories/s; broker CPU "
                    f"{result['broker_cpu_share']:.0%}, workers CPU {result['worker_cpu_share']:.0%} "
                    f"of {psutil.cpu_count()} cores; stable group after {result['startup_s']:.1f} s, "
                    f"published in {result['publish_s']:.1f} s",
                    file=sys.stderr,
                )
                if workers not in best or result["rate"] > best[workers]["rate"]:
                    best[workers] = result
    one, two = best[1], best[2]
    figures = {
        "ratio": two["rate"] / one["rate"],
        "trajectories": args.trajectories,
        "one_worker_per_s": round(one["rate"], 1),
        "two_workers_per_s": round(two["rate"], 1),
        "broker_cpu_share_one": round(one["broker_cpu_share"], 3),
        "broker_cpu_share_two": round(two["broker_cpu_share"], 3),
        "worker_cpu_share_one": round(one["worker_cpu_share"], 3),
        "worker_cpu_share_two": round(two["worker_cpu_share"], 3),
        "publish_s_one": round(one["publish_s"], 2),
        "publish_s_two": round(two["publish_s"], 2),
        "cores": psutil.cpu_count(),
        "load_average_1m": round(os.getloadavg()[0], 1),
    }
    print(
        f"1 worker {figures['one_worker_per_s']:.0f}/s, 2 workers {figures['two_workers_per_s']:.0f}/s: "
        f"ratio {figures['ratio']:.2f} (broker CPU share {figures['broker_cpu_share_one']:.0%} / "
        f"{figures['broker_cpu_share_two']:.0%})"
    )
    if args.json:
        print(json.dumps(figures))


if __name__ == "__main__":
    main()
