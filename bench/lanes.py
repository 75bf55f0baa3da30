"""The two publishing lanes side by side: delivery latency (paced and flat out) against MB/s.

Each lane publishes the same ~8 KB trajectories twice to fresh topics: paced at `--rate`
messages/s (what a rollout worker does between generations) for the latency a message sees when
the pipe is not full, and flat out for the lane's throughput. Latency is from `publish` to the
delivery report (acks=all). ratio = throughput-lane MB/s / latency-lane MB/s, flat out.

Starts its own broker on free loopback ports unless ROLLSTREAM_BOOTSTRAP_SERVERS names one.

    python bench/lanes.py [--json] [--rate 500] [--seconds 5] [--flat-out 20000]
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
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", type=int, default=8192, help="record size in bytes")
    parser.add_argument("--rate", type=float, default=500.0, help="paced messages/s")
    parser.add_argument("--seconds", type=float, default=5.0, help="length of the paced run")
    parser.add_argument("--flat-out", type=int, default=20_000, help="messages of the flat-out run")
    parser.add_argument("--json", action="store_true", help="end with one JSON object")
    args = parser.parse_args()
    paced = records_of_size(args.size, int(args.rate * args.seconds) + 1, seed=2)
    flat = records_of_size(args.size, args.flat_out, seed=3)
    figures: dict[str, dict[str, dict]] = {}
    with broker() as servers:
        admin = admin_client(servers)
        made: list[str] = []

        def topic() -> str:
            name = f"bench-lanes-{uuid.uuid4().hex[:8]}"
            config = {"max.message.bytes": str(4 * 2**20), "compression.type": "producer"}
            admin.create_topics([NewTopic(name, 4, 1, config=config)])[name].result(timeout=30)
            made.append(name)
            return name

        try:
            run(servers, topic(), Lane.THROUGHPUT, flat[:2000], None)  # warm the broker up; not counted
            for lane in (Lane.LATENCY, Lane.THROUGHPUT):
                figures[lane.value] = {
                    "paced": run(servers, topic(), lane, paced, args.rate),
                    "flat_out": run(servers, topic(), lane, flat, None),
                }
                p, f = figures[lane.value]["paced"], figures[lane.value]["flat_out"]
                print(
                    f"{lane.value:>10}: paced {args.rate:g}/s p50 {p['p50_latency_ms']:6.1f} ms p99 "
                    f"{p['p99_latency_ms']:6.1f} ms | flat out {f['mb_per_s']:6.1f} MB/s "
                    f"({f['records_per_s']:.0f}/s), p50 {f['p50_latency_ms']:.0f} ms p99 {f['p99_latency_ms']:.0f} ms, "
                    f"{f['wire_fraction']:.2f} of the bytes on the wire",
                    flush=True,
                )
        finally:
            for future in admin.delete_topics(made).values() if made else ():
                with contextlib.suppress(Exception):
                    future.result(timeout=30)
    summary = {
        "ratio": round(
            figures["throughput"]["flat_out"]["mb_per_s"] / figures["latency"]["flat_out"]["mb_per_s"], 3
        ),
        "record_bytes": args.size,
        "paced_rate": args.rate,
        "lanes": figures,
    }
    if args.json:
        print(json.dumps(summary))


if __name__ == "__main__":
    main()
