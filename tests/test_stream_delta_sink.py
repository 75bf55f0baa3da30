"""The Delta sinks: exact schemas, list columns from packed buffers, exactly once per offset."""

from __future__ import annotations

import dataclasses
import time
import uuid
from datetime import UTC, datetime

import numpy as np
import polars as pl
import pyarrow as pa
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from deltalake import DeltaTable

from producers.fleet import SyntheticFleet
from schemas import TrajectoryCodec
from schemas.tables import EXECUTIONS_SCHEMA
from stream_processors import (
    DEAD_LETTERS_SCHEMA,
    TRAJECTORIES_SCHEMA,
    BatchProcessor,
    Coordinates,
    DeadLetter,
    DeadLetters,
    DeltaSink,
    SourceMessage,
    Stage,
    table_uri,
    txn_app_id,
)
from stream_processors import executions as executions_module
from stream_processors.delta_sink import list_column, map_column, packed_column, trajectories_table
from stream_processors.executions import ExecutionLog, ExecutionRecord
from stream_processors.sandbox import Execution, Limits

pytestmark = pytest.mark.timeout(120)
APP = "sink-test"


@pytest.fixture(scope="module")
def records():
    return list(SyntheticFleet(seed=3, group_size=4).trajectories(120))


@pytest.fixture(scope="module")
def batch(records):
    codec = TrajectoryCodec()
    messages = [
        SourceMessage(Coordinates("raw", i % 3, i // 3), r["group_id"].encode(), codec.encode(r))
        for i, r in enumerate(records)
    ]
    out = BatchProcessor().process(messages)
    assert len(out.rows) == len(records) and not out.dead_letters
    return out


def test_list_column_is_built_by_offsets():
    arrays = [np.array([1, 2, 3], "<i4"), np.array([], "<i4"), np.array([7], "<i4")]
    column = list_column(arrays, pa.int32())
    assert column.type == pa.list_(pa.int32())
    assert column.to_pylist() == [[1, 2, 3], [], [7]]
    assert column.offsets.to_pylist() == [0, 3, 3, 4]


def test_packed_column_joins_the_buffers_and_takes_list_column_for_anything_else():
    packed = [np.frombuffer(np.array(v, "<i4").tobytes(), "<i4") for v in ([1, 2, 3], [], [7])]
    column = packed_column(packed, pa.int32())
    assert column.equals(list_column(packed, pa.int32()))
    assert column.offsets.to_pylist() == [0, 3, 3, 4]
    assert packed_column([], pa.float32()).equals(list_column([], pa.float32()))
    # int64 values, or a strided view, are not in int32's layout: converted value by value instead
    assert packed_column([np.array([5, 6]), packed[0]], pa.int32()).to_pylist() == [[5, 6], [1, 2, 3]]
    assert packed_column([np.arange(6, dtype="<i4")[::2]], pa.int32()).to_pylist() == [[0, 2, 4]]


def test_rows_of_records_without_the_optional_fields_store_their_defaults(batch):
    rows = batch.rows[:2]
    fields = ("response_text", "metadata", "task_id", "attempt", "version_spans", "logprob_mode")
    bare = [
        dataclasses.replace(r, record={k: v for k, v in r.record.items() if k not in fields}) for r in rows
    ]
    table = trajectories_table(bare, batch.coordinates[:2], datetime.now(UTC), "test-profile")
    assert table.column("response_text").to_pylist() == ["", ""]
    assert table.column("metadata").to_pylist() == [[], []]
    assert table.column("attempt").to_pylist() == [0, 0]
    assert table.column("task_id").null_count == table.column("version_spans").null_count == 2
    whole = trajectories_table(rows, batch.coordinates[:2], datetime.now(UTC), "test-profile")
    assert table.column("length").equals(whole.column("length"))
    assert table.column("prompt_tokens").equals(whole.column("prompt_tokens"))


def test_sink_writes_the_exact_schema_and_polars_reads_lists_back(tmp_path, records, batch):
    uri = tmp_path / "trajectories"
    sink = DeltaSink(uri, app_id=APP)
    assert sink.write(batch.rows, batch.coordinates) == len(records)
    assert pa.schema(DeltaTable(str(uri)).schema().to_arrow()).remove_metadata() == TRAJECTORIES_SCHEMA
    assert DeltaTable(str(uri)).metadata().partition_columns == ["bucket"]

    df = pl.read_delta(str(uri))
    assert df.columns == TRAJECTORIES_SCHEMA.names
    assert df.schema["prompt_tokens"] == pl.List(pl.Int32)
    assert df.schema["response_logprobs"] == pl.List(pl.Float32)
    assert df.schema["bucket"] == pl.String
    assert df.schema["created_at"] == pl.Datetime("us", "UTC")
    by_id = {row["trajectory_id"]: row for row in df.iter_rows(named=True)}
    for record, coords in zip(records, batch.coordinates, strict=True):
        row = by_id[record["trajectory_id"]]
        assert row["prompt_tokens"] == np.frombuffer(record["prompt_tokens"], "<i4").tolist()
        assert row["response_tokens"] == np.frombuffer(record["response_tokens"], "<i4").tolist()
        assert np.array_equal(
            np.asarray(row["response_logprobs"], np.float32),
            np.frombuffer(record["response_logprobs"], "<f4"),
        )
        assert row["length"] == len(row["prompt_tokens"]) + len(row["response_tokens"])
        assert row["created_at"] == record["created_at"]
        assert dict(row["metadata"]) == record["metadata"]
        assert (row["topic"], row["partition"], row["offset"]) == (
            coords.topic,
            coords.partition,
            coords.offset,
        )


def test_same_offsets_twice_write_once(tmp_path, batch):
    uri = tmp_path / "trajectories"
    sink = DeltaSink(uri, app_id=APP)
    half = len(batch.rows) // 2
    assert sink.write(batch.rows[:half], batch.coordinates[:half]) == half
    version = DeltaTable(str(uri)).version()
    assert sink.write(batch.rows[:half], batch.coordinates[:half]) == 0
    assert DeltaTable(str(uri)).version() == version  # a full replay commits nothing at all
    # An overlapping batch, through a second sink instance (a restarted worker): only the new half lands.
    assert DeltaSink(uri, app_id=APP).write(batch.rows, batch.coordinates) == len(batch.rows) - half
    df = pl.read_delta(str(uri))
    assert df.height == len(batch.rows)
    assert df["trajectory_id"].n_unique() == len(batch.rows)
    table = DeltaTable(str(uri))
    for partition in range(3):
        highest = max(c.offset for c in batch.coordinates if c.partition == partition)
        assert table.transaction_version(txn_app_id(APP, "raw", partition)) == highest
        assert sink.stored_offset("raw", partition) == highest
    assert sink.stored_offset("other-topic", 0) is None
    # Another app id is another pipeline: it does not see these offsets.
    assert DeltaSink(uri, app_id="other-app").stored_offset("raw", 0) is None


def test_a_concurrent_writer_of_the_same_offsets_loses_and_writes_nothing(tmp_path, batch, caplog):
    uri = str(tmp_path / "trajectories")
    DeltaSink(uri, app_id=APP).write(batch.rows[:1], batch.coordinates[:1])  # the table exists
    winner, loser = DeltaSink(uri, app_id=APP), DeltaSink(uri, app_id=APP)
    rows, coords = batch.rows[1:], batch.coordinates[1:]

    def build_after_the_winner_committed(keep):
        # The loser read the stored offsets already; the winner commits the same offsets now.
        assert winner.write(rows, coords) == len(rows)
        return trajectories_table(
            [rows[i] for i in keep], [coords[i] for i in keep], datetime.now(UTC), "test-profile"
        )

    assert loser.table.append(coords, build_after_the_winner_committed) == 0
    assert "concurrent commit" in caplog.text  # delta-rs refused the loser's txn, it reloaded and filtered
    df = pl.read_delta(uri)
    assert df.height == len(batch.rows)
    assert df["trajectory_id"].n_unique() == len(batch.rows)


def test_dead_letters_table_only_exactly_once(tmp_path):
    uri = tmp_path / "dead_letters"
    letters = [
        DeadLetter(
            f"reason {i}", "DecodeError", bytes([i]) * 5, None if i % 2 else b"k", Coordinates("raw", 0, i)
        )
        for i in range(6)
    ]
    sink = DeadLetters(uri, app_id=APP)
    assert sink.write(letters[:4]) == 4
    assert sink.write(letters) == 2
    assert sink.write(letters) == 0
    df = pl.read_delta(str(uri)).sort("offset")
    assert pa.schema(DeltaTable(str(uri)).schema().to_arrow()).remove_metadata() == DEAD_LETTERS_SCHEMA
    assert df["raw"].to_list() == [d.raw for d in letters]
    assert df["key"].to_list() == [d.key for d in letters]
    assert df["reason"].to_list() == [d.reason for d in letters]
    assert sink.stored_offset("raw", 0) == 5


def _execution_record(i: int) -> ExecutionRecord:
    execution = Execution(
        outcome="exited", exit_code=0, signal=None, stdout="", stderr="", stdout_bytes=0,
        stderr_bytes=0, cpu_s=0.01, wall_s=0.05, start_s=0.02 + i / 1000, peak_memory_bytes=1 << 20,
        limits=Limits(), environment_id="",
    )  # fmt: skip
    return ExecutionRecord(f"t-{i}", 0, "code/x", "code_tests", "1.0.0", "ok", execution)


def test_an_executions_table_without_start_s_gains_it_and_every_reader_still_reads_it(tmp_path, monkeypatch):
    uri, old_names = tmp_path / "executions", [n for n in EXECUTIONS_SCHEMA.names if n != "start_s"]
    build = executions_module.executions_table
    monkeypatch.setattr(executions_module, "executions_table", lambda *a: build(*a).select(old_names))
    log = ExecutionLog(uri, app_id=APP)
    assert log.write([_execution_record(0)], [Coordinates("raw", 0, 0)]) == 1  # an older rollstream
    assert DeltaTable(str(uri)).schema().to_arrow().names == old_names
    monkeypatch.undo()

    assert log.write([_execution_record(1)], [Coordinates("raw", 0, 1)]) == 1
    table = DeltaTable(str(uri))
    assert pa.schema(table.schema().to_arrow()).remove_metadata() == EXECUTIONS_SCHEMA
    assert table.history(limit=2)[1]["operation"] == "ADD COLUMN"
    frame = pl.read_delta(str(uri)).sort("offset")
    assert frame["start_s"].to_list() == [None, 0.021]
    assert pl.read_delta(str(uri), version=0).columns == old_names  # time travel reads the old version


def test_dead_letters_go_to_the_topic_once(bootstrap_servers, make_topic, tmp_path):
    topic = make_topic("stream-dlq")
    sink = DeadLetters(
        tmp_path / "dead_letters", bootstrap_servers=bootstrap_servers, topic=topic, app_id=APP
    )
    letters = [
        DeadLetter(f"bad {i}", "LengthMismatchError", b"raw-%d" % i, b"key", Coordinates("raw", 2, 40 + i))
        for i in range(3)
    ]
    assert sink.write(letters) == 3
    assert sink.write(letters) == 0
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap_servers,
            "group.id": f"t-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])  # no group membership, nothing to clean up
    got = []
    deadline = time.monotonic() + 20
    try:
        while len(got) < 3 and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                got.append(msg)
        quiet_until = time.monotonic() + 2  # any duplicate would arrive right behind the originals
        while time.monotonic() < quiet_until:
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                got.append(msg)
    finally:
        consumer.close()
    assert [m.value() for m in got] == [b"raw-0", b"raw-1", b"raw-2"]
    headers = dict(got[1].headers())
    assert headers == {
        "reason": b"bad 1",
        "error_type": b"LengthMismatchError",
        "source_topic": b"raw",
        "source_partition": b"2",
        "source_offset": b"41",
    }
    assert got[0].key() == b"key"


def test_stage_replay_is_skipped(tmp_path, records):
    codec = TrajectoryCodec()
    messages = [
        SourceMessage(Coordinates("raw", 0, i), None, codec.encode(r)) for i, r in enumerate(records[:40])
    ]
    messages.append(SourceMessage(Coordinates("raw", 0, 40), None, b"garbage"))
    stage = Stage(
        BatchProcessor(), DeltaSink(tmp_path / "t", app_id=APP), DeadLetters(tmp_path / "d", app_id=APP)
    )
    first = stage.run(messages)
    assert (first.records_in, first.rows_written, first.dead_letters_written) == (41, 40, 1)
    again = stage.run(messages)
    assert (
        again.rows_written,
        again.dead_letters_written,
        again.rows_skipped,
        again.dead_letters_skipped,
    ) == (0, 0, 41, 0)  # decided offsets are skipped before they are judged


def test_table_uri_joins_local_paths_and_object_store_uris(tmp_path):
    assert table_uri("s3://bucket/lake/", "trajectories") == "s3://bucket/lake/trajectories"
    assert table_uri(tmp_path, "dead_letters") == str(tmp_path / "dead_letters")


def test_map_column_is_the_map_of_each_rows_items() -> None:
    maps = [{"a": 1.0, "ü": -0.5}, {}, {"k": float("inf")}, {}]
    expected = pa.array([list(m.items()) for m in maps], pa.map_(pa.string(), pa.float64()))
    assert map_column(maps, pa.float64()).equals(expected)
    assert map_column([], pa.string()).equals(pa.array([], pa.map_(pa.string(), pa.string())))
