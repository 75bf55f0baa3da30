"""Publishing throughput of `producers.Publisher` against raw confluent-kafka, on a real broker.

Both sides send the same fleet trajectories to fresh topics with the same producer settings
(idempotent, acks=all, zstd). The baseline produces bytes encoded beforehand; ours encodes each
record, keys it and tracks its delivery, so the ratio is the publisher's whole cost over raw Kafka.
ratio = ours / baseline seconds (lower is better; 1.0 means no overhead).

Needs a broker: `rollstream up` (or set ROLLSTREAM_BOOTSTRAP_SERVERS).

    python bench/publish.py [--trajectories 10000] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import time
import uuid

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from producers import Publisher, SyntheticFleet
from producers.publisher import default_config
from schemas import TrajectoryCodec


def _topic(admin: AdminClient, name: str) -> str:
    config = {"max.message.bytes": str(4 * 1024 * 1024), "compression.type": "producer"}
    admin.create_topics([NewTopic(name, 4, 1, config=config)])[name].result(timeout=30)
    return name


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trajectories", type=int, default=10_000)
    parser.add_argument(
        "--bootstrap-servers", default=os.environ.get("ROLLSTREAM_BOOTSTRAP_SERVERS", "127.0.0.1:9092")
    )
    parser.add_argument("--repeats", type=int, default=3, help="alternating runs of each; the best counts")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    admin = AdminClient({"bootstrap.servers": args.bootstrap_servers})
    try:
        admin.list_topics(timeout=10)
    except Exception as exc:
        raise SystemExit(f"no broker at {args.bootstrap_servers} ({exc}): run `rollstream up` first") from exc

    records = list(SyntheticFleet(seed=1).trajectories(args.trajectories))
    codec = TrajectoryCodec()
    encoded = [(r["group_id"].encode(), codec.encode(r)) for r in records]
    payload_mb = sum(len(v) for _, v in encoded) / 1e6
    run = uuid.uuid4().hex[:8]
    topics = [_topic(admin, f"bench-publish-raw-{run}"), _topic(admin, f"bench-publish-ours-{run}")]

    def baseline() -> float:
        producer = Producer(default_config(args.bootstrap_servers, topics[0]))
        start = time.perf_counter()
        for key, value in encoded:
            while True:
                try:
                    producer.produce(topics[0], value, key)
                    break
                except BufferError:
                    producer.poll(0.05)
            producer.poll(0)
        if producer.flush(120):
            raise SystemExit("baseline: messages left undelivered")
        return time.perf_counter() - start

    def ours() -> float:
        start = time.perf_counter()
        with Publisher(bootstrap_servers=args.bootstrap_servers, topic=topics[1]) as publisher:
            for record in records:
                publisher.publish(record)
        elapsed = time.perf_counter() - start
        if publisher.published != len(records):
            raise SystemExit(f"ours: {publisher.published} of {len(records)} acknowledged")
        return elapsed

    try:
        # Alternate the two and keep each one's best, so neither pays alone for a cold broker.
        baseline_s, ours_s = float("inf"), float("inf")
        for _ in range(args.repeats):
            baseline_s = min(baseline_s, baseline())
            ours_s = min(ours_s, ours())
    finally:
        for future in admin.delete_topics(topics).values():
            future.result(timeout=30)

    figures = {
        "ratio": ours_s / baseline_s,
        "ours_s": ours_s,
        "baseline_s": baseline_s,
        "ours_records_per_s": len(records) / ours_s,
        "baseline_records_per_s": len(records) / baseline_s,
        "payload_mb": payload_mb,
        "ours_mb_per_s": payload_mb / ours_s,
        "trajectories": len(records),
        "repeats": args.repeats,
    }
    print(
        f"raw confluent-kafka: {figures['baseline_records_per_s']:.0f} trajectories/s ({payload_mb / baseline_s:.0f} MB/s)"
    )
    print(
        f"Publisher:           {figures['ours_records_per_s']:.0f} trajectories/s ({figures['ours_mb_per_s']:.0f} MB/s)"
    )
    print(f"ratio (ours / baseline seconds): {figures['ratio']:.2f}")
    if args.json:
        print(json.dumps(figures))


if __name__ == "__main__":
    main()
