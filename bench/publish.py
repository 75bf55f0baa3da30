"""Our publisher against Kafka's own ProducerPerformance, on one broker, at three record sizes.

Both send to fresh topics with the same settings: acks=all, idempotence, zstd, linger.ms and
batch.size of our throughput lane. ProducerPerformance (run from the cached Kafka jars, timed
by itself from its first send to its last acknowledgement) sends records of random letters of
the given size; ours sends trajectories whose encoded value is that size, each validated,
Avro-encoded, keyed by group and tracked by a future. The two alternate, best of `--repeats`.
ratio = our MB/s / ProducerPerformance MB/s at about 8 KB (higher is better).

Starts its own broker on free loopback ports unless ROLLSTREAM_BOOTSTRAP_SERVERS names one.

    python bench/publish.py [--json] [--mb 150] [--repeats 2] [--sizes 1024,8192,262144]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from confluent_kafka.admin import NewTopic

from infra.kafka_jars import ensure_jars
from infra.settings import Settings
from infra.topics import admin_client
from producers import Lane, Publisher, SyntheticFleet
from producers.core import DEFAULT_BUDGET_BYTES
from producers.lanes import lane_config
from schemas import TrajectoryCodec, TrajectoryRecord

REPO = Path(__file__).resolve().parents[1]
PP_MAIN = "org.apache.kafka.tools.ProducerPerformance"
PP_LINE = re.compile(r"(\d+) records sent, ([\d.]+) records/sec \(([\d.]+) MB/sec\), ([\d.]+) ms avg latency")
TOPIC_LIMIT = 4 * 1024 * 1024


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def broker() -> Iterator[str]:
    """A broker to measure against: ROLLSTREAM_BOOTSTRAP_SERVERS, or our own on free ports."""
    given = os.environ.get("ROLLSTREAM_BOOTSTRAP_SERVERS")
    if given:
        yield given
        return
    from infra import services

    with tempfile.TemporaryDirectory(prefix="bench-publish-") as state:
        kafka, controller = _free_port(), _free_port()
        settings = Settings.load(state_dir=Path(state), kafka_port=kafka, controller_port=controller)
        services.up(settings, progress=lambda m: print(f"[bench] {m}", file=sys.stderr))
        try:
            yield settings.bootstrap_servers
        finally:
            services.down(settings, progress=lambda m: None)


def records_of_size(size: int, count: int, seed: int = 1) -> list[TrajectoryRecord]:
    """`count` distinct trajectories whose encoded value is about `size` bytes."""
    codec = TrajectoryCodec()
    template = dict(next(SyntheticFleet(seed).trajectories(1)))
    template.update(response_text="", metadata={}, domain="math/bench", task_type="math")
    template["prompt_tokens"] = template["prompt_tokens"][: 64 * 4]
    template["response_tokens"], template["response_logprobs"] = b"\0" * 4, b"\0" * 4
    base = len(codec.encode(template)) - 8
    tokens = max(1, (size - base) // 8)
    rng = np.random.default_rng(seed)
    # A pool of distinct payloads, larger than a batch, so zstd finds no repeats within one.
    pool = max(64, min(count, (4 * 1024 * 1024) // size + 1))
    prompts = rng.integers(0, 32_000, size=(pool, 64), dtype=np.int32).astype("<i4")
    ids = rng.integers(0, 32_000, size=(pool, tokens), dtype=np.int32).astype("<i4")
    logprobs = (rng.standard_exponential((pool, tokens), dtype=np.float32) * -0.7).astype("<f4")
    out: list[TrajectoryRecord] = []
    for i in range(count):
        record = dict(template)
        record["trajectory_id"] = str(uuid.UUID(int=int(rng.integers(2**62)) << 64 | i, version=4))
        record["group_id"] = str(uuid.UUID(int=i // 8 + 1, version=4))
        record["sample_index"], record["group_size"] = i % 8, 8
        record["prompt_tokens"] = prompts[i % pool].tobytes()
        record["response_tokens"] = ids[i % pool].tobytes()
        record["response_logprobs"] = logprobs[i % pool].tobytes()
        out.append(record)  # type: ignore[arg-type]
    return out


def zstd_fraction(data: bytes) -> float | None:
    """Compressed / raw size with zstd (level 3), where cramjam (aiokafka's codecs) is installed."""
    try:
        import cramjam
    except ImportError:
        return None
    return round(len(bytes(cramjam.zstd.compress(data))) / len(data), 3)


def letters(size: int, seed: int = 0) -> bytes:
    """What ProducerPerformance sends: random uppercase ASCII letters."""
    return (np.random.default_rng(seed).integers(0, 26, size) + 65).astype(np.uint8).tobytes()


def common_props() -> dict[str, str]:
    """The settings both sides run with (our throughput lane's linger and batch size)."""
    lane = lane_config(Lane.THROUGHPUT)
    return {
        "acks": "all",
        "enable.idempotence": "true",
        "compression.type": "zstd",
        "linger.ms": str(lane["linger.ms"]),
        "batch.size": str(lane["batch.size"]),
    }


def producer_performance(jars: Path, servers: str, topic: str, size: int, count: int) -> dict[str, float]:
    """Run Kafka's ProducerPerformance; returns its own records/s and MB/s (10^6 bytes)."""
    props = {
        **common_props(),
        "bootstrap.servers": servers,
        "max.request.size": str(TOPIC_LIMIT),
        "buffer.memory": str(DEFAULT_BUDGET_BYTES),  # the same room to queue as our byte budget
    }
    logs = Path(tempfile.gettempdir()) / "rollstream-bench-publish-logs"
    command = [
        "java", "-Xmx1g", f"-Dlog4j2.configurationFile={REPO / 'infra' / 'kafka' / 'log4j2.properties'}",
        f"-Dkafka.logs.dir={logs}",
        "-cp", str(jars / "*"), PP_MAIN, "--topic", topic, "--num-records", str(count),
        "--record-size", str(size), "--throughput", "-1",
        "--producer-props", *(f"{k}={v}" for k, v in props.items()),
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    found = PP_LINE.findall(result.stdout)
    if result.returncode != 0 or not found:
        raise SystemExit(
            f"ProducerPerformance failed (exit {result.returncode}):\n{result.stdout[-2000:]}{result.stderr[-2000:]}"
        )
    sent, per_s, _, latency_ms = found[-1]
    if int(sent) != count:
        raise SystemExit(f"ProducerPerformance sent {sent} of {count}")
    rate = float(per_s)
    return {"records_per_s": rate, "mb_per_s": rate * size / 1e6, "avg_latency_ms": float(latency_ms)}


def ours(servers: str, topic: str, records: list[TrajectoryRecord], value_bytes: int) -> dict[str, float]:
    """Publish `records` with our Publisher; timed from the first publish to the last result."""
    latencies: list[float] = []
    with Publisher(bootstrap_servers=servers, topic=topic) as publisher:
        publisher.publish(records[0], on_delivery=lambda r: latencies.append(r.latency_s)).result(30)
        start = time.perf_counter()
        for record in records[1:]:
            publisher.publish(record, on_delivery=lambda r: latencies.append(r.latency_s))
        publisher.flush(300)
        elapsed = time.perf_counter() - start
    if publisher.published != len(records):
        raise SystemExit(f"ours: {publisher.published} of {len(records)} acknowledged")
    rate = (len(records) - 1) / elapsed
    return {
        "records_per_s": rate,
        "mb_per_s": rate * value_bytes / 1e6,
        "avg_latency_ms": 1000 * float(np.mean(latencies[1:])),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="1024,8192,262144", help="record sizes in bytes, comma-separated")
    parser.add_argument("--mb", type=float, default=150.0, help="megabytes sent per size, per side, per run")
    parser.add_argument("--repeats", type=int, default=2, help="alternating runs of each; the best counts")
    parser.add_argument("--json", action="store_true", help="end with one JSON object")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    jars = ensure_jars(Settings.load())
    codec = TrajectoryCodec()
    figures: dict[str, dict[str, float]] = {}
    with broker() as servers:
        admin = admin_client(servers)
        made: list[str] = []

        def topic(name: str) -> str:
            full = f"bench-publish-{name}-{uuid.uuid4().hex[:8]}"
            config = {"max.message.bytes": str(TOPIC_LIMIT), "compression.type": "producer"}
            admin.create_topics([NewTopic(full, 4, 1, config=config)])[full].result(timeout=30)
            made.append(full)
            return full

        try:
            for size in sizes:
                count = max(200, int(args.mb * 1e6 / size))
                records = records_of_size(size, count)
                sample = [codec.encode(r) for r in records[: max(200, 2_000_000 // size)]]
                value_bytes = float(np.mean([len(v) for v in sample]))
                best_pp: dict[str, float] = {"mb_per_s": 0.0}
                best_ours: dict[str, float] = {"mb_per_s": 0.0}
                for _ in range(args.repeats):
                    pp = producer_performance(jars, servers, topic(f"pp-{size}"), round(value_bytes), count)
                    best_pp = max(best_pp, pp, key=lambda f: f["mb_per_s"])
                    mine = ours(servers, topic(f"ours-{size}"), records, round(value_bytes))
                    best_ours = max(best_ours, mine, key=lambda f: f["mb_per_s"])
                ratio = best_ours["mb_per_s"] / best_pp["mb_per_s"]
                figures[str(size)] = {
                    "record_bytes": round(value_bytes),
                    "records": count,
                    "ours_mb_per_s": round(best_ours["mb_per_s"], 2),
                    "ours_records_per_s": round(best_ours["records_per_s"], 1),
                    "ours_avg_latency_ms": round(best_ours["avg_latency_ms"], 1),
                    "pp_mb_per_s": round(best_pp["mb_per_s"], 2),
                    "pp_records_per_s": round(best_pp["records_per_s"], 1),
                    "pp_avg_latency_ms": round(best_pp["avg_latency_ms"], 1),
                    "ratio": round(ratio, 3),
                    "ours_zstd_fraction": zstd_fraction(b"".join(sample)),
                    "pp_zstd_fraction": zstd_fraction(letters(len(sample) * size)),
                }
                print(
                    f"{round(value_bytes):>7} B: ours {best_ours['mb_per_s']:6.1f} MB/s "
                    f"({best_ours['records_per_s']:8.0f} rec/s), ProducerPerformance {best_pp['mb_per_s']:6.1f} MB/s "
                    f"({best_pp['records_per_s']:8.0f} rec/s), ratio {ratio:.2f}",
                    flush=True,
                )
        finally:
            for future in admin.delete_topics(made).values() if made else ():
                with contextlib.suppress(Exception):
                    future.result(timeout=30)
    key = "8192" if "8192" in figures else next(iter(figures))
    summary = {
        "ratio": figures[key]["ratio"],
        "ratio_size_bytes": figures[key]["record_bytes"],
        "sizes": figures,
        "settings": common_props(),
        "repeats": args.repeats,
    }
    print(
        f"ratio (our MB/s / ProducerPerformance MB/s) at {figures[key]['record_bytes']} B: {summary['ratio']:.2f}"
    )
    if args.json:
        print(json.dumps(summary))


if __name__ == "__main__":
    main()
