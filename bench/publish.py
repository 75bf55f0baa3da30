"""Our publisher against a plain Java KafkaProducer sending the same bytes, at three record sizes.

Three sides send to fresh 4-partition topics on one broker with the same producer settings
(acks=all, idempotence, zstd, linger.ms and batch.size of our throughput lane, max.request.size
4 MiB, buffer.memory our byte budget), each clocked from its first send to its last
acknowledgement (start-up, producer creation and reading the input excluded on every side):

- ours: `Publisher.publish_many` per group of 8 trajectories (a group's samples; `--group 1`:
  `Publisher.publish` per trajectory), each validated, Avro-encoded, keyed by group and
  acknowledged through its batch's future (every future checked after the flush), from the
  records in memory.
- java: bench/java/PublishFile.java (compiled at run time with javac, kafka-clients 4.1.1 of the
  interop jars), a minimal `KafkaProducer<byte[], byte[]>`: the same records, encoded by our codec
  beforehand and written to a length-prefixed file, read into memory before its clock starts, then
  `send` with a counting callback per record and one `flush`. Nothing per record but the send: the
  floor of a JVM client on these bytes.
- ProducerPerformance (Kafka's own tool, from the cached Kafka jars): random letters of the same
  size, since it reads `--payload-file` as UTF-8 text and cannot send binary Avro; reported beside
  (letters compress better under zstd than token ids), not in the ratio.

Sides alternate over `--rounds` (bench/rounds.py); per size, ratio = our MB/s / java's MB/s, the
median over rounds. The top-level `ratio` is the 8 KB one. Per size, CPU µs per record (medians
over rounds): `ours_cpu_us_per_record` is our process's over the window (the caller's thread,
librdkafka's and the delivery thread), `ours_thread_cpu_us_per_record` the publishing thread's;
`java_cpu_us_per_record` the whole JVM's, its start-up included, `java_window_cpu_us_per_record`
the JVM's over the window only, `java_thread_cpu_us_per_record` its sending thread's. On a loaded
machine the sending thread's CPU per record is what bounds each side's rate.

Starts its own broker on free loopback ports unless ROLLSTREAM_KAFKA__BOOTSTRAP_SERVERS names one.

    python bench/publish.py [--json] [--mb 100] [--rounds 3] [--sizes 1024,8192,262144] [--group 8]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from confluent_kafka.admin import NewTopic
from rounds import Sample, alternate, cpu_seconds, emit, load_average, summary

from infra.install import interop_classpath
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
JAVA_SOURCE = Path(__file__).resolve().parent / "java" / "PublishFile.java"
GROUP = 8  # records per publish_many call: a group's samples (records_of_size makes groups of 8)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def broker() -> Iterator[str]:
    """A broker to measure against: ROLLSTREAM_KAFKA__BOOTSTRAP_SERVERS, or our own on free ports."""
    given = os.environ.get("ROLLSTREAM_KAFKA__BOOTSTRAP_SERVERS")
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
    template: dict[str, Any] = dict(next(SyntheticFleet(seed).trajectories(1)))
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


def java_props(servers: str) -> dict[str, str]:
    """The Java clients' settings: ours, plus the request size and queue room our publisher has."""
    return {
        **common_props(),
        "bootstrap.servers": servers,
        "max.request.size": str(TOPIC_LIMIT),
        "buffer.memory": str(DEFAULT_BUDGET_BYTES),  # the same room to queue as our byte budget
    }


def producer_performance(jars: Path, servers: str, topic: str, size: int, count: int) -> Sample:
    """Run Kafka's ProducerPerformance (random letters of `size`); timed by itself, send to ack."""
    props = java_props(servers)
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
    seconds = count / float(per_s)
    return Sample(items=count * size, seconds=seconds, extra={"avg_latency_ms": float(latency_ms)})


def compile_java(classpath: str, into: Path) -> None:
    """javac bench/java/PublishFile.java against the interop jars, into `into`."""
    command = ["javac", "-cp", classpath, "-d", str(into), str(JAVA_SOURCE)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    if done.returncode != 0:
        raise SystemExit(f"javac failed on {JAVA_SOURCE} (is a JDK installed?):\n{done.stderr[-3000:]}")


def write_payload(path: Path, keys: list[bytes], values: list[bytes]) -> None:
    """The length-prefixed file PublishFile reads: [int32 key length][key][int32 value length][value]."""
    with path.open("wb") as out:
        for key, value in zip(keys, values, strict=True):
            out.write(struct.pack(">i", len(key)) + key + struct.pack(">i", len(value)) + value)


def java_producer(
    classpath: str, classes: Path, payload: Path, servers: str, topic: str, total_bytes: float
) -> Sample:
    """Run PublishFile on `payload`; its own clock from the first send to the last acknowledgement."""
    command = [
        "java", "-Xmx2g", "-cp", f"{classpath}:{classes}", "PublishFile", str(payload), topic,
        *(f"{k}={v}" for k, v in java_props(servers).items()),
    ]  # fmt: skip
    cpu0 = cpu_seconds()
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise SystemExit(
            f"PublishFile failed (exit {done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
        )
    figures = json.loads(lines[-1])
    if figures["errors"]:
        raise SystemExit(f"PublishFile: {figures['errors']} sends failed")
    extra = {"thread_cpu_s": figures["thread_cpu_s"], "window_cpu_s": figures["window_cpu_s"]}
    return Sample(items=total_bytes, seconds=figures["seconds"], cpu_s=cpu_seconds() - cpu0, extra=extra)


def ours(
    servers: str, topic: str, records: list[TrajectoryRecord], value_bytes: float, group: int = GROUP
) -> Sample:
    """Publish `records` with our Publisher, `group` at a time with `publish_many` (one at a time
    with `publish` when `group` is 1); timed from the first publish to the last acknowledgement.
    Every result is checked after the flush."""
    with Publisher(bootstrap_servers=servers, topic=topic) as publisher:
        cpu0, thread0, start = cpu_seconds(), time.thread_time(), time.perf_counter()
        if group == 1:
            publish = publisher.publish
            singles = [publish(record) for record in records]
        else:
            publish_many = publisher.publish_many
            batches = [publish_many(records[i : i + group]) for i in range(0, len(records), group)]
        publisher.flush(300)
        elapsed = time.perf_counter() - start
        cpu, thread = cpu_seconds() - cpu0, time.thread_time() - thread0
    if group == 1:
        latencies = [f.result(0).latency_s for f in singles]
    else:
        latencies = [f.result(0).latency_s for f in batches]  # each batch's last acknowledgement
    if publisher.published != len(records):
        raise SystemExit(f"ours: {publisher.published} of {len(records)} acknowledged")
    return Sample(
        items=len(records) * value_bytes,
        seconds=elapsed,
        cpu_s=cpu,
        extra={
            "avg_latency_ms": 1000 * float(np.mean(latencies)),
            "thread_cpu_s": thread,
            "window_cpu_s": cpu,
        },
    )


def per_record(samples: list[Sample], figure: str, count: int) -> float:
    """The median over rounds of `figure` (CPU seconds in each sample's extra), in µs per record."""
    return round(1e6 * statistics.median(s.extra[figure] for s in samples) / count, 1)


def side_runs(
    servers: str,
    topic: Any,
    size: int,
    records: list[TrajectoryRecord],
    message_bytes: float,
    java: tuple[str, Path, Path],
    jars: Path,
    group: int = GROUP,
) -> list[tuple[str, Any]]:
    """The three contenders at one size, each on a fresh topic per round."""
    classpath, classes, payload = java
    count = len(records)
    return [
        ("ours", lambda i: ours(servers, topic(f"ours-{size}"), records, message_bytes, group)),
        (
            "java",
            lambda i: java_producer(
                classpath, classes, payload, servers, topic(f"java-{size}"), count * message_bytes
            ),
        ),
        (
            "pp",
            lambda i: producer_performance(jars, servers, topic(f"pp-{size}"), round(message_bytes), count),
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="1024,8192,262144", help="record sizes in bytes, comma-separated")
    parser.add_argument(
        "--mb", type=float, default=100.0, help="megabytes sent per size, per side, per round"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--group",
        type=int,
        default=GROUP,
        help="records per Publisher.publish_many call (1: Publisher.publish per record)",
    )
    parser.add_argument("--json", action="store_true", help="end with one JSON object")
    args = parser.parse_args()
    load_before = load_average()
    sizes = [int(s) for s in args.sizes.split(",")]
    settings = Settings.load()
    jars = ensure_jars(settings)
    classpath = interop_classpath(settings)
    codec = TrajectoryCodec()
    figures: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-publish-") as scratch, broker() as servers:
        classes = Path(scratch) / "classes"
        compile_java(classpath, classes)
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
                values = [codec.encode(r) for r in records]
                keys = [str(r["group_id"]).encode() for r in records]
                payload = Path(scratch) / f"payload-{size}.bin"
                write_payload(payload, keys, values)
                value_bytes = float(np.mean([len(v) for v in values]))
                key_bytes = float(np.mean([len(k) for k in keys]))
                record_bytes = round(value_bytes)
                sides = side_runs(
                    servers,
                    topic,
                    size,
                    records,
                    value_bytes + key_bytes,
                    (classpath, classes, payload),
                    jars,
                    args.group,
                )
                say = lambda m, size=size: print(f"[bench] {size} B {m}", file=sys.stderr)  # noqa: E731
                samples = alternate(sides[0], sides[1:], args.rounds, say)
                result = summary({k: samples[k] for k in ("ours", "java")}, "ours", load_before, unit="bytes")
                pp_rates = [s.rate for s in samples["pp"]]
                result.update(
                    record_bytes=record_bytes,
                    records=count,
                    ours_mb_per_s=round(result["ours_per_s"] / 1e6, 2),
                    java_mb_per_s=round(result["java_per_s"] / 1e6, 2),
                    pp_mb_per_s=round(statistics.median(pp_rates) / 1e6, 2),
                    pp_mb_per_s_rounds=[round(r / 1e6, 2) for r in pp_rates],
                    pp_avg_latency_ms=round(
                        statistics.median(s.extra["avg_latency_ms"] for s in samples["pp"]), 1
                    ),
                    ours_records_per_s=round(result["ours_per_s"] / (value_bytes + key_bytes), 1),
                    ours_cpu_us_per_record=round(
                        1e6 * statistics.median(x.cpu_s for x in samples["ours"]) / count, 1
                    ),
                    java_cpu_us_per_record=round(
                        1e6 * statistics.median(x.cpu_s for x in samples["java"]) / count, 1
                    ),
                    ours_thread_cpu_us_per_record=per_record(samples["ours"], "thread_cpu_s", count),
                    java_thread_cpu_us_per_record=per_record(samples["java"], "thread_cpu_s", count),
                    java_window_cpu_us_per_record=per_record(samples["java"], "window_cpu_s", count),
                    ours_zstd_fraction=zstd_fraction(b"".join(values[: max(200, 2_000_000 // size)])),
                    pp_zstd_fraction=zstd_fraction(letters(max(200, 2_000_000 // size) * size)),
                )
                figures[str(size)] = result
                print(
                    f"{record_bytes:>7} B: ours {result['ours_mb_per_s']:6.1f} MB/s, java KafkaProducer "
                    f"{result['java_mb_per_s']:6.1f} MB/s, ProducerPerformance (letters) {result['pp_mb_per_s']:6.1f} "
                    f"MB/s: ratio {result['ratio']} ({result['ratio_min']} to {result['ratio_max']})",
                    file=sys.stderr if args.json else sys.stdout,
                    flush=True,
                )
        finally:
            for future in admin.delete_topics(made).values() if made else ():
                with contextlib.suppress(Exception):
                    future.result(timeout=30)
    key = "8192" if "8192" in figures else next(iter(figures))
    top = {
        "ratio": figures[key]["ratio"],
        "ratio_min": figures[key]["ratio_min"],
        "ratio_max": figures[key]["ratio_max"],
        "rounds": args.rounds,
        "ours_records_per_call": args.group,
        "ratio_size_bytes": figures[key]["record_bytes"],
        **{f"ratio_{size}": f["ratio"] for size, f in figures.items()},
        "sizes": figures,
        "settings": common_props(),
        "load_before": load_before,
        "load_after": load_average(),
    }
    emit(
        top,
        args.json,
        lambda r: f"ratio (our MB/s / java KafkaProducer MB/s) at {r['ratio_size_bytes']} B: {r['ratio']}",
    )


if __name__ == "__main__":
    main()
