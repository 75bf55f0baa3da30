"""The two publishing lanes side by side: delivery latency (paced and flat out) against MB/s.

Each lane publishes the same ~8 KB trajectories twice to fresh topics: paced at `--rate`
messages/s (what a rollout worker does between generations) for the latency a message sees when
the pipe is not full, and flat out for the lane's throughput. Latency is from `publish` to the
delivery report (acks=all). Rounds alternate the lanes (bench/rounds.py); ratio = the median of
throughput-lane MB/s / latency-lane MB/s, flat out (`ours_*` is the throughput lane, `baseline_*`
the latency lane); the paced latencies are `*_paced_p50_latency_ms` and `*_paced_p99_latency_ms`.

Starts its own broker on free loopback ports unless ROLLSTREAM_KAFKA__BOOTSTRAP_SERVERS names one.

    python bench/lanes.py [--json] [--rate 500] [--seconds 5] [--flat-out 20000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
import uuid

import numpy as np
from confluent_kafka.admin import NewTopic
from publish import broker, records_of_size
from rounds import Sample, Side, alternate, cpu_seconds, emit, load_average, summary

from infra.topics import admin_client
from producers import Lane, Publisher
from schemas import TrajectoryCodec, TrajectoryRecord


def run(servers: str, topic: str, lane: Lane, records: list[TrajectoryRecord], rate: float | None) -> dict:
    latencies: list[float] = []
    wire: list[int] = []  # bytes sent to brokers (requests, after compression), from librdkafka's stats
    stats = {
        "statistics.interval.ms": 100,
        "stats_cb": lambda text: wire.append(json.loads(text)["tx_bytes"]),
    }
    with Publisher(bootstrap_servers=servers, topic=topic, lane=lane, extra_config=stats) as publisher:
        publisher.publish(records[0]).result(30)  # connected, producer id acquired
        start = time.perf_counter()
        for i, record in enumerate(records[1:]):
            if rate is not None and (ahead := start + i / rate - time.perf_counter()) > 0:
                time.sleep(ahead)
            publisher.publish(record, on_delivery=lambda r: latencies.append(r.latency_s))
        publisher.flush(300)
        elapsed = time.perf_counter() - start
        time.sleep(0.25)  # one more statistics report after the last acknowledgement
    sizes = TrajectoryCodec()
    value_bytes = len(sizes.encode(records[1]))
    ms = np.asarray(latencies) * 1000
    return {
        "p50_latency_ms": round(float(np.percentile(ms, 50)), 2),
        "p99_latency_ms": round(float(np.percentile(ms, 99)), 2),
        "mb_per_s": round((len(records) - 1) * value_bytes / elapsed / 1e6, 2),
        "records_per_s": round((len(records) - 1) / elapsed, 1),
        "wire_fraction": round(max(wire, default=0) / (len(records) * value_bytes), 3),
        "seconds": elapsed,
        "megabytes": (len(records) - 1) * value_bytes / 1e6,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", type=int, default=8192, help="record size in bytes")
    parser.add_argument("--rate", type=float, default=500.0, help="paced messages/s")
    parser.add_argument("--seconds", type=float, default=5.0, help="length of the paced run")
    parser.add_argument("--flat-out", type=int, default=20_000, help="messages of the flat-out run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="end with one JSON object")
    args = parser.parse_args()
    load_before = load_average()
    paced = records_of_size(args.size, int(args.rate * args.seconds) + 1, seed=2)
    flat = records_of_size(args.size, args.flat_out, seed=3)
    with broker() as servers:
        admin = admin_client(servers)
        made: list[str] = []

        def topic() -> str:
            name = f"bench-lanes-{uuid.uuid4().hex[:8]}"
            config = {"max.message.bytes": str(4 * 2**20), "compression.type": "producer"}
            admin.create_topics([NewTopic(name, 4, 1, config=config)])[name].result(timeout=30)
            made.append(name)
            return name

        def side(lane: Lane) -> Side:
            def measure(index: int) -> Sample:
                paced_run = run(servers, topic(), lane, paced, args.rate)
                cpu0 = cpu_seconds()
                flat_run = run(servers, topic(), lane, flat, None)
                return Sample(
                    items=flat_run["megabytes"],
                    seconds=flat_run["seconds"],
                    cpu_s=cpu_seconds() - cpu0,
                    extra={
                        "paced_p50_latency_ms": paced_run["p50_latency_ms"],
                        "paced_p99_latency_ms": paced_run["p99_latency_ms"],
                        "flat_out_p50_latency_ms": flat_run["p50_latency_ms"],
                        "flat_out_p99_latency_ms": flat_run["p99_latency_ms"],
                        "flat_out_records_per_s": flat_run["records_per_s"],
                        "wire_fraction": flat_run["wire_fraction"],
                    },
                )

            return measure

        try:
            run(servers, topic(), Lane.THROUGHPUT, flat[:2000], None)  # warm the broker up; not counted
            samples = alternate(
                ("ours", side(Lane.THROUGHPUT)),
                [("baseline", side(Lane.LATENCY))],
                args.rounds,
            )
        finally:
            for future in admin.delete_topics(made).values() if made else ():
                with contextlib.suppress(Exception):
                    future.result(timeout=30)
    result = summary(samples, "ours", load_before, unit="MB")
    result.update(
        record_bytes=args.size, paced_rate=args.rate, ours="throughput lane", baseline="latency lane"
    )
    emit(result, args.json)


if __name__ == "__main__":
    main()
