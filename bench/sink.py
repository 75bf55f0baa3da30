"""Cost of the stream stage from Kafka bytes to a Delta commit, against a raw Delta append.

Messages: the synthetic fleet with its code tasks made precomputed (`producers.fleet.without_code`,
same rewards), as bench/process.py's main figure: a code task's verdict is a sandboxed run of
its tests, tens of milliseconds each, which would make the ratio a measure of the sandbox
(bench/score.py measures it) rather than of the stage's own work.

Ours: `BatchProcessor.process` (decode, validate, verify, bucket, normalize) then `DeltaSink.write`
(Arrow build, append with the offsets as Delta txn versions in the same commit), batch by batch,
into a fresh table. Baseline: the very rows ours produced, built into Arrow tables beforehand
(untimed) and appended with plain `write_deltalake(mode="append", partition_by=["bucket"])` in
the same batches, no txn, into another fresh table, with the sink's own writer properties
(`delta_sink.writer_properties()`: ZSTD, dictionary encoding only on low-cardinality strings); the
old form (dictionary tried on every column) runs once beside it. So the ratio is what decoding,
validation, verification and offset bookkeeping add on top of the write. Rounds alternate
(bench/rounds.py); ratio = the median of our rows per second / the baseline's. No broker needed.
arrow_build_s: a warm, separate build of the baseline's tables, i.e. ours_write_s's share in Arrow.

Beside the ratio, not in it: ours_with_code_per_s, one run of ours on `--code-trajectories` fleet
messages with their code tasks kept (verified in the bubblewrap sandbox); 0 skips it.

    python bench/sink.py [--trajectories 20000] [--batch-size 500] [--rounds 3]
                         [--code-trajectories 200] [--json]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path

import polars as pl
from deltalake import WriterProperties, write_deltalake
from rounds import Sample, alternate, cpu_seconds, emit, load_average, summary

from producers import SyntheticFleet
from producers.fleet import without_code
from schemas import TrajectoryCodec, TrajectoryRecord
from schemas.profile import load_profile
from stream_processors.delta_sink import DeltaSink, trajectories_table, writer_properties
from stream_processors.offsets import Coordinates
from stream_processors.processing import BatchProcessor, SourceMessage

TOPIC = "rollouts.raw"
PARTITIONS = 4

PROFILE_ID = load_profile().id


def _count(uri: Path, what: str, expected: int) -> None:
    frame = pl.read_delta(str(uri), columns=["topic", "partition", "offset"])
    distinct = frame.unique().height
    if frame.height != expected or distinct != expected:
        raise SystemExit(
            f"{what}: table holds {frame.height} rows ({distinct} distinct offsets), expected {expected}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trajectories", type=int, default=20_000)
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--rounds", "--repeats", dest="repeats", type=int, default=3, help="alternated rounds"
    )
    parser.add_argument(
        "--code-trajectories",
        type=int,
        default=200,
        help="one run of ours on fleet messages with sandboxed code tasks, beside the ratio (0: skip)",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    codec = TrajectoryCodec()

    def encoded(records: Iterable[TrajectoryRecord]) -> list[SourceMessage]:
        return [
            SourceMessage(
                Coordinates(TOPIC, i % PARTITIONS, i // PARTITIONS), r["group_id"].encode(), codec.encode(r)
            )
            for i, r in enumerate(records)
        ]

    def batched(messages: list[SourceMessage]) -> list[list[SourceMessage]]:
        return [messages[i : i + args.batch_size] for i in range(0, len(messages), args.batch_size)]

    records = list(without_code(SyntheticFleet(seed=args.seed).trajectories(args.trajectories)))
    token_bytes = sum(
        len(r[f]) for r in records for f in ("prompt_tokens", "response_tokens", "response_logprobs")
    )
    messages = encoded(records)
    del records
    n = len(messages)
    batches = batched(messages)
    payload_mb, message_mb = token_bytes / 1e6, sum(len(m.value or b"") for m in messages) / 1e6

    processor = BatchProcessor()
    # Untimed: the Arrow tables the baseline appends, from the very rows the processor yields;
    # built twice so that arrow_build_s is a warm figure, like ours' second repeat.
    processed = [processor.process(batch) for batch in batches]
    if letters := [letter for p in processed for letter in p.dead_letters]:
        raise SystemExit(f"{len(letters)} fleet records dead-lettered, e.g.: {letters[0].reason}")
    now = datetime.now(UTC)
    tables = [trajectories_table(p.rows, p.coordinates, now, PROFILE_ID) for p in processed]
    start = time.perf_counter()
    tables = [trajectories_table(p.rows, p.coordinates, now, PROFILE_ID) for p in processed]
    build_s = time.perf_counter() - start
    del processed

    def ours(batches: list[list[SourceMessage]]) -> tuple[float, float, float]:
        n = sum(len(batch) for batch in batches)
        with tempfile.TemporaryDirectory(prefix="bench-sink-ours-") as tmp:
            uri = Path(tmp) / "trajectories"
            sink = DeltaSink(uri, app_id="bench")
            process_s = write_s = 0.0
            for batch in batches:
                start = time.perf_counter()
                out = processor.process(batch)
                processed_at = time.perf_counter()
                written = sink.write(out.rows, out.coordinates)
                process_s += processed_at - start
                write_s += time.perf_counter() - processed_at
                if written != len(batch):
                    raise SystemExit(f"ours: {written} of {len(batch)} rows written")
            _count(uri, "ours", n)
        return process_s + write_s, process_s, write_s

    def baseline(properties: WriterProperties) -> float:
        with tempfile.TemporaryDirectory(prefix="bench-sink-raw-") as tmp:
            uri = Path(tmp) / "trajectories"
            start = time.perf_counter()
            for table in tables:
                write_deltalake(
                    uri, table, mode="append", partition_by=["bucket"], writer_properties=properties
                )
            elapsed = time.perf_counter() - start
            _count(uri, "baseline", n)
        return elapsed

    load_before = load_average()
    parts: list[tuple[float, float]] = []

    def our_side(index: int) -> Sample:
        cpu0 = cpu_seconds()
        total, process_s, write_s = ours(batches)
        parts.append((process_s, write_s))
        return Sample(items=n, seconds=total, cpu_s=cpu_seconds() - cpu0)

    def base_side(index: int, props: WriterProperties) -> Sample:
        cpu0 = cpu_seconds()
        elapsed = baseline(props)
        return Sample(items=n, seconds=elapsed, cpu_s=cpu_seconds() - cpu0)

    samples = alternate(
        ("ours", our_side), [("baseline", lambda i: base_side(i, writer_properties()))], args.repeats
    )
    old = base_side(0, WriterProperties(compression="ZSTD"))
    result = summary(samples, "ours", load_before, unit="rows")
    result.update(
        ours_process_s=round(statistics.median(p for p, _ in parts), 3),
        ours_write_s=round(statistics.median(w for _, w in parts), 3),
        baseline_old_form_per_s=round(old.rate, 1),
        arrow_build_s=round(build_s, 3),
        payload_mb=round(payload_mb, 1),
        message_mb=round(message_mb, 1),
        trajectories=n,
        batch_size=args.batch_size,
        batches=len(batches),
    )
    if args.code_trajectories:
        with_code = list(SyntheticFleet(seed=args.seed + 2000).trajectories(args.code_trajectories))
        code_share = sum(r["task_type"] == "code" for r in with_code) / len(with_code)
        code_batches = batched(encoded(with_code))
        total, process_s, _ = ours(code_batches)
        result.update(
            ours_with_code_per_s=round(len(with_code) / total, 1),
            ours_with_code_process_s=round(process_s, 3),
            code_trajectories=len(with_code),
            code_share=round(code_share, 3),
        )
    emit(result, args.json)


if __name__ == "__main__":
    main()
