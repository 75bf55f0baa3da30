"""Samples from tasks through the stream stage (no broker): loss masks into the table and the replay
buffer's batches, one complete group per task across attempts, restarts and rebalances, the task
fields' dead letters, and a lake of the older schema gaining the new columns."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pytest
from deltalake import DeltaTable, QueryBuilder

from consumers import BufferExhausted, ReplayBuffer, ReplayConfig
from infra.maintenance import maintain_table
from schemas import TrajectoryCodec, pack_float32, pack_int32, pack_mask
from schemas.tables import TRAJECTORIES_SCHEMA
from stream_processors import BatchProcessor, Coordinates, DeadLetters, DeltaSink, SourceMessage, Stage
from stream_processors import stage as stage_module
from stream_processors.delta_sink import writer_properties
from stream_processors.groups import GroupBuffer
from stream_processors.offsets import TxnTable
from stream_processors.state import STATE_KEY, stored_partitions
from stream_processors.task_window import TaskWindow, task_key

pytestmark = pytest.mark.timeout(120)
APP = "attempts-test"
CODEC = TrajectoryCodec()
DOMAIN = "precomputed/chat-000"
PROMPT = [1, 2, 3, 4, 5]
TASK_COLUMNS = ["task_id", "attempt", "loss_mask", "version_spans", "logprob_mode"]


def sample(task_id: str | None, attempt: int, index: int, size: int = 4, **fields: Any) -> dict[str, Any]:
    """One small trajectory of a task's attempt (group id `<task>/<attempt>`), rewarded by index."""
    response = fields.pop("response", 6)
    record = {
        "trajectory_id": f"{task_id}-{attempt}-{index}",
        "group_id": f"{task_id}/{attempt}",
        "sample_index": index,
        "group_size": size,
        "domain": DOMAIN,
        "task_type": "precomputed",
        "policy_version": 3,
        "prompt_tokens": pack_int32(PROMPT),
        "response_tokens": pack_int32(range(100 + index, 100 + index + response)),
        "response_logprobs": pack_float32([-0.5] * response),
        "response_text": "",
        "finish_reason": "stop",
        "precomputed_reward": float(index % 2),
        "worker_id": "w0",
        "created_at": datetime(2026, 1, 1, tzinfo=UTC),
        "metadata": {},
        "task_id": task_id,
        "attempt": attempt,
        "logprob_mode": None if task_id is None else "processed",
    }
    record.update(fields)
    return record


def group(task_id: str | None, attempt: int, size: int = 4, **fields: Any) -> list[dict[str, Any]]:
    return [sample(task_id, attempt, i, size, **fields) for i in range(size)]


class Feed:
    """Messages of one source partition, offsets in publishing order."""

    def __init__(self, partition: int = 0) -> None:
        self.partition = partition
        self.messages: list[SourceMessage] = []

    def add(self, records: list[dict[str, Any]]) -> list[SourceMessage]:
        first = len(self.messages)
        for i, r in enumerate(records):
            key = str(r["task_id"] or r["group_id"]).encode()
            c = Coordinates("raw", self.partition, first + i)
            self.messages.append(SourceMessage(c, key, CODEC.encode(r)))
        return self.messages[first:]


def make_stage(lake, **kwargs) -> Stage:
    groups = kwargs.pop("groups", None)
    stage = Stage(
        BatchProcessor(),
        DeltaSink(lake / "trajectories", app_id=APP),
        DeadLetters(lake / "dead_letters", app_id=APP),
        groups=GroupBuffer(event_timeout_s=1e9, wall_timeout_s=1e9) if groups is None else groups,
        **kwargs,
    )
    stage.load([("raw", p) for p in range(2)], {"raw": "id-raw"})
    return stage


def rows(lake) -> pl.DataFrame:
    return pl.read_delta(str(lake / "trajectories"))


def letters(lake) -> pl.DataFrame:
    if not DeltaTable.is_deltatable(str(lake / "dead_letters")):
        return pl.DataFrame(schema={"error_type": pl.String, "offset": pl.Int64})
    return pl.read_delta(str(lake / "dead_letters"))


def drain(config: ReplayConfig) -> list[dict[str, Any]]:
    out = []
    with ReplayBuffer(config) as buffer:
        while True:
            try:
                out.append(buffer.sample(0, timeout=30))
            except BufferExhausted:
                return out


def test_a_task_group_lands_with_its_mask_and_a_packed_batch_trains_only_the_policy_tokens(tmp_path):
    masks = [[1, 1, 0, 0, 1, 1], [1] * 6, [0, 1, 1, 1, 1, 0], None]
    spans = [{"start": 0, "end": 2, "version": 2}, {"start": 2, "end": 6, "version": 3}]
    records = [
        sample(
            "task-1",
            1,
            i,
            loss_mask=None if m is None else pack_mask(m),
            version_spans=spans if i == 0 else None,
        )
        for i, m in enumerate(masks)
    ]
    feed = Feed()
    stage = make_stage(tmp_path)
    stats = stage.run(feed.add(records))
    assert (stats.rows_written, stats.dead_letters_written) == (4, 0)

    frame = rows(tmp_path).sort("sample_index")
    assert frame.schema["loss_mask"] == pl.List(pl.Boolean)
    assert frame["loss_mask"].to_list() == [None if m is None else [bool(b) for b in m] for m in masks]
    assert frame["task_id"].to_list() == ["task-1"] * 4 and frame["attempt"].to_list() == [1] * 4
    assert frame["version_spans"].to_list() == [spans, None, None, None]
    assert frame["logprob_mode"].to_list() == ["processed"] * 4
    assert frame["group_status"].unique().to_list() == ["complete"]

    config = ReplayConfig(
        table_uri=str(tmp_path / "trajectories"), token_budget=64, max_length=32, max_uses=1, layout="packed"
    )
    batches = drain(config)
    seen = {}
    for batch in batches:
        cu = batch["cu_seqlens"].tolist()
        for i, tid in enumerate(batch["trajectory_ids"]):
            seen[tid] = (
                batch["response_mask"][0, cu[i] : cu[i + 1]].tolist(),
                batch["input_ids"][0, cu[i] : cu[i + 1]].tolist(),
                int(batch["policy_versions"][i]),
            )
    assert len(seen) == 4
    for i, m in enumerate(masks):
        response_mask, input_ids, version = seen[f"task-1-1-{i}"]
        trained = [True] * 6 if m is None else [bool(b) for b in m]
        assert response_mask == [False] * len(PROMPT) + trained, i
        assert input_ids[len(PROMPT) :] == list(range(100 + i, 106 + i))  # masked tokens stay in the input
        assert version == (2 if i == 0 else 3)  # staleness goes by the oldest span's version


def test_a_second_complete_attempt_is_dead_letters_across_a_restart_a_replay_and_a_rebalance(tmp_path):
    feed = Feed()
    first = make_stage(tmp_path)
    assert first.run(feed.add(group("task-a", 1) + group(None, 0))).rows_written == 8

    second = make_stage(tmp_path)  # a restart between the attempts
    retried = feed.add(group("task-a", 2))
    stats = second.run(retried)
    assert (stats.rows_written, stats.dead_letters_written) == (0, 4)
    dead = letters(tmp_path)
    assert dead["error_type"].to_list() == ["duplicate_attempt"] * 4
    assert dead["raw"].to_list() == [m.value for m in retried]
    assert all("task_id 'task-a' already has a complete group" in r for r in dead["reason"])
    assert second.safe_offsets()[("raw", 0)] == 12

    # No commit of rows followed the letters: a worker replaying from the stored state decides the
    # attempt again and finds its letters stored, below the table's txn version.
    replay = make_stage(tmp_path)
    again = replay.run(feed.messages)
    assert (again.rows_written, again.dead_letters_written, again.rows_skipped) == (0, 0, 8)
    assert again.dead_letters_skipped == 4

    replay.revoke([("raw", 0)])  # a rebalance: the window is read back with the partition
    replay.assign([("raw", 0)])
    third = replay.run(feed.add(group("task-a", 3)))
    assert (third.rows_written, third.dead_letters_written) == (0, 4)

    frame = rows(tmp_path)
    assert frame.height == 8 and frame["trajectory_id"].n_unique() == 8
    complete = frame.filter(pl.col("task_id") == "task-a")
    assert complete["group_id"].unique().to_list() == ["task-a/1"]
    plain = frame.filter(pl.col("task_id").is_null())
    assert plain["attempt"].to_list() == [0] * 4 and plain["loss_mask"].null_count() == 4
    assert letters(tmp_path).height == 8


def test_letters_of_another_attempt_become_holes_and_a_partial_earlier_attempt_times_out(tmp_path):
    feed = Feed()
    stage = make_stage(tmp_path, groups=GroupBuffer(event_timeout_s=1e9, wall_timeout_s=5))
    t = 1000.0
    stage.accept(stage.judge(feed.add(group("task-a", 1))), now=t)
    # offset 4: half of task-b's first attempt; offsets 6-9 task-a again; 10-13 task-b's second attempt
    partial = group("task-b", 1)[:2]
    stage.accept(stage.judge(feed.add(partial + group("task-a", 2) + group("task-b", 2))), now=t)
    assert stage.flush() == 8
    stored = json.loads(DeltaTable(str(tmp_path / "trajectories")).history(limit=1)[0][STATE_KEY])
    assert stored["partitions"]['["raw",0]']["next"] == 4  # the partial attempt is pending
    assert stored["partitions"]['["raw",0]']["holes"] == list(range(6, 14))

    restarted = make_stage(tmp_path, groups=GroupBuffer(event_timeout_s=1e9, wall_timeout_s=5))
    replay = restarted.judge(feed.messages)
    assert replay.skipped == 12 and len(replay.samples) == 2  # letters and rows are holes or below next
    restarted.accept(replay, now=t + 2)
    restarted.tick(t + 10)
    assert restarted.flush() == 2
    frame = rows(tmp_path)
    assert sorted(frame["offset"].to_list()) == [0, 1, 2, 3, 4, 5, 10, 11, 12, 13]
    by_group = {g: s for (g,), s in frame.group_by("group_id")}
    assert by_group["task-b/1"]["group_status"].to_list() == ["timed_out"] * 2
    assert by_group["task-b/2"]["group_status"].to_list() == ["complete"] * 4
    assert sorted(letters(tmp_path)["offset"].to_list()) == [6, 7, 8, 9]


def test_a_resent_sample_of_another_attempt_is_a_duplicate_before_and_after_a_restart(tmp_path):
    feed = Feed()
    stage = make_stage(tmp_path)
    retried = group("task-a", 2)
    stage.run(feed.add(group("task-a", 1) + retried + group(None, 0)))  # letters at 4-7, next 12
    resent = feed.add([retried[0]])  # the publisher sent attempt 2's first sample again
    assert stage.accept(stage.judge(resent)).duplicates == 1  # its letter is written; then a crash
    restarted = make_stage(tmp_path)  # reads attempt 2's ids back from the dead letters
    replay = restarted.accept(restarted.judge(resent))
    assert (replay.duplicates, replay.dead_letters_written, replay.dead_letters_skipped) == (1, 0, 1)
    assert restarted.flush() == 0 and restarted.pending_groups == 0
    dead = letters(tmp_path).sort("offset")
    assert dead["error_type"].to_list() == ["duplicate_attempt"] * 4 + ["duplicate"]
    assert 12 not in rows(tmp_path)["offset"].to_list()


def test_a_sample_of_another_attempt_in_a_pending_group_is_a_dead_letter(tmp_path):
    feed = Feed()
    records = group("task-d", 1)
    strays = [
        sample("task-d", 2, 2, group_id="task-d/1", trajectory_id="stray-attempt"),
        sample(None, 0, 3, group_id="task-d/1", trajectory_id="stray-plain", logprob_mode=None),
    ]
    stage = make_stage(tmp_path)
    stats = stage.run(feed.add(records[:2] + strays + records[2:]))
    assert (stats.rows_written, stats.dead_letters_written) == (4, 2)
    dead = letters(tmp_path).sort("offset")
    assert dead["error_type"].to_list() == ["mixed_attempts"] * 2 and dead["offset"].to_list() == [2, 3]
    assert "('task-d', 1)" in dead["reason"][0] and "('task-d', 2)" in dead["reason"][0]
    assert "(None, 0)" in dead["reason"][1]
    assert rows(tmp_path)["group_status"].to_list() == ["complete"] * 4


def test_the_task_window_is_bounded_and_stored_in_small_deltas_and_snapshots(tmp_path, monkeypatch):
    window = TaskWindow(3)
    for k in range(5):
        window.add(k)
    assert window.keys() == [2, 3, 4] and 1 not in window and 4 in window
    monkeypatch.setattr("stream_processors.task_window.SNAPSHOT_EVERY", 3)
    feed = Feed()
    stage = make_stage(tmp_path, task_window=5)
    forms = []
    for k in range(7):
        stage.run(feed.add(group(f"task-{k}", 1, size=2)))
        entry = DeltaTable(str(tmp_path / "trajectories")).history(limit=1)[0]
        forms.append(json.loads(entry[STATE_KEY])["partitions"]['["raw",0]']["tasks"])
    assert [next(iter(f)) for f in forms] == ["all", "add", "add", "all", "add", "add", "all"]
    assert len(forms[1]["add"]) == 12  # one 8-byte key, base64
    live = stage.state.partition(("raw", 0)).tasks.keys()
    assert live == [task_key(f"task-{k}") for k in range(2, 7)]
    stored = stored_partitions(TxnTable(str(tmp_path / "trajectories"), app_id=APP), APP)
    assert stored[("raw", 0)].tasks.keys() == live
    # task-0 fell out of the window (size 5): another attempt of it is kept, the bound documented
    assert stage.run(feed.add(group("task-0", 2, size=2))).rows_written == 2
    assert stage.run(feed.add(group("task-6", 2, size=2))).dead_letters_written == 2
    plain = make_stage(tmp_path / "plain")
    plain.run(Feed().add(group(None, 0)))
    state = json.loads(DeltaTable(str(tmp_path / "plain" / "trajectories")).history(limit=1)[0][STATE_KEY])
    assert "tasks" not in state["partitions"]['["raw",0]']  # rows without tasks store nothing more


@pytest.mark.parametrize(
    ("changes", "error_type", "words"),
    [
        (
            {"loss_mask": pack_mask([1] * 5)},
            "LengthMismatchError",
            "len(loss_mask)=5 != len(response_tokens)=6",
        ),
        ({"loss_mask": bytes([1, 1, 2, 1, 1, 1])}, "LossMaskError", "loss_mask[2]=2 is neither 0 nor 1"),
        (
            {"version_spans": [{"start": 0, "end": 2, "version": 1}, {"start": 3, "end": 6, "version": 2}]},
            "VersionSpanError",
            "version_spans[1] starts at 3, not at 2 (a gap)",
        ),
        (
            {"version_spans": [{"start": 0, "end": 4, "version": 1}, {"start": 2, "end": 6, "version": 2}]},
            "VersionSpanError",
            "(an overlap)",
        ),
        ({"version_spans": [{"start": 0, "end": 5, "version": 1}]}, "VersionSpanError", "end at 5, not at"),
        ({"attempt": -1}, "AttemptError", "attempt=-1 must be >= 0"),
        ({"attempt": 0}, "AttemptError", "task_id='task-v' with attempt=0"),
        ({"task_id": None, "attempt": 2}, "AttemptError", "attempt=2 without a task_id"),
        ({"task_id": " "}, "EmptyIdError", "task_id=' ' is empty"),
    ],
)
def test_broken_task_fields_are_dead_letters_naming_the_rule(tmp_path, changes, error_type, words):
    good = sample("task-v", 1, 0, size=2)
    bad = {**sample("task-v", 1, 1, size=2), **changes}
    judged = BatchProcessor().judge(Feed().add([good, bad]))  # the batch check, then per record
    assert [s.record["trajectory_id"] for s in judged.samples] == [good["trajectory_id"]]
    (letter,) = judged.dead_letters
    assert letter.error_type == error_type and words in letter.reason, letter.reason
    assert letter.coordinates.offset == 1


def test_a_lake_of_the_older_schema_gains_the_new_columns_and_every_reader_still_reads_it(
    tmp_path, monkeypatch
):
    old_names = [n for n in TRAJECTORIES_SCHEMA.names if n not in TASK_COLUMNS]
    build = stage_module.trajectories_table
    monkeypatch.setattr(stage_module, "trajectories_table", lambda *a: build(*a).select(old_names))
    feed = Feed()
    plain = [
        sample(None, 0, i, group_id=f"plain-{k}", trajectory_id=f"plain-{k}-{i}", logprob_mode=None)
        for k in range(2)
        for i in range(4)
    ]
    assert make_stage(tmp_path).run(feed.add(plain)).rows_written == 8
    uri = str(tmp_path / "trajectories")
    assert DeltaTable(uri).schema().to_arrow().names == old_names  # what an older rollstream wrote
    monkeypatch.undo()

    stage = make_stage(tmp_path)  # the upgraded worker resumes on the old table
    masked = group("task-n", 1, loss_mask=pack_mask([1, 0, 0, 1, 1, 1]))
    stats = stage.run(feed.add(masked + group("task-n", 2)))
    assert (stats.rows_written, stats.dead_letters_written) == (4, 4)
    table = DeltaTable(uri)
    assert pa.schema(table.schema().to_arrow()).remove_metadata() == TRAJECTORIES_SCHEMA
    assert table.history(limit=2)[1]["operation"] == "ADD COLUMN" and table.protocol().min_reader_version == 1

    frame = pl.read_delta(uri)
    assert frame.height == 12 and frame.columns == TRAJECTORIES_SCHEMA.names
    old = frame.filter(pl.col("offset") < 8)
    assert all(old[c].null_count() == 8 for c in TASK_COLUMNS)
    assert (
        frame.filter(pl.col("task_id") == "task-n")["loss_mask"].to_list()
        == [[True, False, False, True, True, True]] * 4
    )
    assert pl.read_delta(uri, version=0).columns == old_names  # time travel reads the old version
    counted = pa.table(
        QueryBuilder()
        .register("t", table)
        .execute("SELECT count(*) AS n FROM t WHERE task_id IS NULL")
        .read_all()
    )
    assert counted["n"].to_pylist() == [8]

    def trained_tokens() -> int:
        config = ReplayConfig(table_uri=uri, token_budget=64, max_length=32, max_uses=1)
        return sum(int(b["response_mask"].sum()) for b in drain(config))

    responses = int(frame["response_tokens"].list.len().sum())
    assert trained_tokens() == responses - 2 * 4  # old rows train on every token, the task's masks hold

    report = maintain_table(uri, writer_properties=writer_properties())  # compacts old and new files together
    assert report.files_after < report.files_before
    assert pl.read_delta(uri).sort("offset").equals(frame.sort("offset"))
    assert make_stage(tmp_path).run(feed.messages).rows_skipped == 16  # the state and offsets survive


def test_masks_are_combined_into_padded_batches_and_rows_without_a_mask_are_unchanged(tmp_path):
    feed = Feed()
    stage = make_stage(tmp_path)
    stage.run(feed.add(group("task-p", 1, loss_mask=pack_mask([0, 1, 1, 1, 1, 0])) + group(None, 0)))
    config = ReplayConfig(table_uri=str(tmp_path / "trajectories"), token_budget=64, max_length=8, max_uses=1)
    for batch in drain(config):
        for i, tid in enumerate(batch["trajectory_ids"]):
            row = batch["response_mask"][i].tolist()
            start = row.index(True) if True in row else None
            attended = int(batch["attention_mask"][i].sum())
            if tid.startswith("task-p"):  # cut to 8 tokens: 2 of the prompt, the response's 6
                assert row[:attended] == [False, False, False, True, True, True, True, False], tid
            else:
                assert start is not None and all(row[start:attended]), tid
            assert np.count_nonzero(row) <= attended
