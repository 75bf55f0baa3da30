"""The replay buffer against real Delta tables on disk, some grown by a live writer while it samples."""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import torch
from deltalake import write_deltalake
from replay_support import PROFILE, make_rows, trainable, write_rows

from consumers import (
    BufferExhausted,
    CheckpointError,
    RateLimitTimeout,
    ReplayBuffer,
    ReplayConfig,
    ReplayDataset,
    TokenRangeError,
    replay_loader,
)
from consumers.replay import FifoSampler, PrioritizedSampler, SamplerStack, TableLog, plan_batches
from consumers.replay.limiters import SampleToInsertRatio
from schemas.tables import TRAJECTORIES_SCHEMA

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, dict[str, Any]], list[set[str]]]:
    """(table uri, every row by id, ids of each append): three versions, 0 to 2."""
    uri = str(tmp_path_factory.mktemp("lake") / "trajectories")
    appends = [make_rows(120, first=120 * k, seed=k, policy_version=k) for k in range(3)]
    for rows in appends:
        write_rows(uri, rows)
    by_id = {r["trajectory_id"]: r for rows in appends for r in rows}
    return uri, by_id, [{r["trajectory_id"] for r in rows} for rows in appends]


def drain(buffer: ReplayBuffer, version: int = 0) -> list[dict[str, Any]]:
    batches = []
    while True:
        try:
            batches.append(buffer.sample(version, timeout=30))
        except BufferExhausted:
            return batches


def kept_tokens(row: dict[str, Any], max_length: int) -> tuple[list[int], int]:
    """What a row becomes when cut to max_length: the prompt's tail, the response's head; and where the response starts."""
    prompt, response = row["prompt_tokens"], row["response_tokens"][: max_length - 1]
    p = min(len(prompt), max_length - len(response))
    return prompt[len(prompt) - p :] + response, p


def check_padded(batch: dict[str, Any], rows: dict[str, dict[str, Any]], max_length: int) -> None:
    """Every tensor of a padded batch against its source rows (prompt tail, response head)."""
    width = batch["input_ids"].shape[1]
    kept = []
    for i, tid in enumerate(batch["trajectory_ids"]):
        row = rows[tid]
        tokens, p = kept_tokens(row, max_length)
        kept.append(len(tokens))
        assert batch["input_ids"][i, : len(tokens)].tolist() == tokens
        assert not batch["input_ids"][i, len(tokens) :].any()
        assert batch["attention_mask"][i].tolist() == [t < len(tokens) for t in range(width)]
        assert batch["response_mask"][i].tolist() == [p <= t < len(tokens) for t in range(width)]
        expected = np.zeros(width, dtype=np.float32)
        expected[p : len(tokens)] = np.asarray(row["response_logprobs"], dtype=np.float32)[: len(tokens) - p]
        np.testing.assert_array_equal(batch["old_logprobs"][i].numpy(), expected)
        assert batch["advantages"][i].item() == pytest.approx(row["advantage"], rel=1e-6)
        assert batch["rewards"][i].item() == row["reward"]
        assert batch["policy_versions"][i].item() == row["policy_version"]
        assert batch["buckets"][i] == row["bucket"]
        assert batch["domains"][i] == row["domain"] and batch["task_types"][i] == row["task_type"]
    assert width == max(kept)
    assert batch["tokens"] == sum(kept)
    assert batch["padding_waste"] == pytest.approx(1 - sum(kept) / (len(kept) * width))


def test_log_lists_only_the_files_each_version_added(lake) -> None:
    uri, _, appends = lake
    log = TableLog(uri)
    assert log.latest_version() == 2 and log.latest_version(known=1) == 2
    seen: set[str] = set()
    for version in range(3):
        files = log.added_files(version)
        assert files and {f.version for f in files} == {version}
        paths = {f.path for f in files}
        assert not paths & seen
        seen |= paths
        assert {f.partition("bucket") for f in files} <= set(PROFILE.names)
        assert sum(f.num_records or 0 for f in files) == len(appends[version])
    for version in range(3):  # object stores (and cleaned-up commit files) diff the file lists instead
        diffed = sorted(log._diffed(version), key=lambda f: f.path)
        assert diffed == sorted(log.added_files(version), key=lambda f: f.path)
        assert all(f.partition("bucket") in PROFILE.names for f in diffed)


def test_loss_masks_reach_response_mask_in_both_layouts(tmp_path: Path) -> None:
    """Rows with and without a loss mask, mixed in one file and cut at max_length: the padded
    batch's response_mask is the mask on the kept response tokens, and the packed batch holds
    the same tokens back to back."""
    uri = str(tmp_path / "trajectories")
    rows = make_rows(90, first=0, seed=5, all_trainable=True, lengths=(24, 60, 120))
    for i, row in enumerate(rows):
        if i % 3:
            row["loss_mask"] = [(t // 3) % 2 == 0 for t in range(len(row["response_tokens"]))]
    write_rows(uri, rows)
    by_id = {r["trajectory_id"]: r for r in rows}
    seen = 0
    for layout in ("padded", "packed"):
        config = ReplayConfig(table_uri=uri, token_budget=512, max_length=48, max_uses=1, layout=layout)
        with ReplayBuffer(config) as buffer:
            batches = drain(buffer)
        for batch in batches:
            offset = 0
            for i, tid in enumerate(batch["trajectory_ids"]):
                row = by_id[tid]
                tokens, p = kept_tokens(row, 48)
                mask = row.get("loss_mask") or [True] * len(row["response_tokens"])
                expected = [False] * p + list(mask[: len(tokens) - p])
                if layout == "padded":
                    got = batch["response_mask"][i, : len(tokens)].tolist()
                    assert not batch["response_mask"][i, len(tokens) :].any()
                    assert batch["input_ids"][i, : len(tokens)].tolist() == tokens
                else:
                    got = batch["response_mask"][0, offset : offset + len(tokens)].tolist()
                    assert batch["input_ids"][0, offset : offset + len(tokens)].tolist() == tokens
                    offset += len(tokens)
                assert got == expected, tid
                seen += 1
    assert seen == 2 * len(rows)


def test_fifo_delivers_every_trainable_row_once_padded_as_stored(lake) -> None:
    uri, rows, _ = lake
    config = ReplayConfig(table_uri=uri, token_budget=400, max_length=64, max_uses=1)
    with ReplayBuffer(config) as buffer:
        batches = drain(buffer)
    ids = [tid for b in batches for tid in b["trajectory_ids"]]
    assert len(ids) == len(set(ids))
    assert set(ids) == {r["trajectory_id"] for r in trainable(list(rows.values()))}
    for batch in batches:
        assert batch["input_ids"].numel() <= 400
        check_padded(batch, rows, 64)


def test_packed_batches_follow_the_varlen_layout(lake) -> None:
    uri, rows, _ = lake
    config = ReplayConfig(table_uri=uri, token_budget=300, max_length=64, max_uses=1, layout="packed")
    with ReplayBuffer(config) as buffer:
        batches = drain(buffer)
    total = 0
    for batch in batches:
        cu = batch["cu_seqlens"].tolist()
        assert cu[0] == 0 and batch["input_ids"].shape == (1, cu[-1]) and cu[-1] <= 300
        assert batch["padding_waste"] == 0.0 and batch["tokens"] == cu[-1]
        for i, tid in enumerate(batch["trajectory_ids"]):
            row = rows[tid]
            tokens, p = kept_tokens(row, 64)
            assert batch["response_mask"][0, cu[i] : cu[i + 1]].tolist() == [
                t >= p for t in range(len(tokens))
            ]
            assert batch["input_ids"][0, cu[i] : cu[i + 1]].tolist() == tokens
            assert batch["position_ids"][0, cu[i] : cu[i + 1]].tolist() == list(range(len(tokens)))
            assert batch["max_seqlen"] >= len(tokens)
        total += len(batch["trajectory_ids"])
    assert total == len(trainable(list(rows.values())))


def test_token_budget_batches_of_similar_lengths_waste_little() -> None:
    rng = np.random.default_rng(0)
    lengths = rng.lognormal(6, 0.8, 4000).astype(np.int64).clip(1, 2048)
    plan = plan_batches(lengths, token_budget=16_384, layout="padded")
    assert sorted(np.concatenate(plan).tolist()) == list(range(4000))
    slots = sum(len(b) * int(lengths[b].max()) for b in plan)
    assert all(len(b) * int(lengths[b].max()) <= 16_384 for b in plan)
    assert 1 - lengths.sum() / slots < 0.05
    random_batches = np.array_split(rng.permutation(4000), 4000 // 16)
    random_slots = sum(len(b) * int(lengths[b].max()) for b in random_batches)
    assert 1 - lengths.sum() / random_slots > 0.4
    packed = plan_batches(lengths, token_budget=16_384, layout="packed")
    assert all(int(lengths[b].sum()) <= 16_384 for b in packed)


def test_time_travel_reads_only_the_version_range(lake) -> None:
    uri, rows, appends = lake
    config = ReplayConfig(
        table_uri=uri, start_version=1, end_version=1, token_budget=400, max_length=64, max_uses=1
    )
    with ReplayBuffer(config) as buffer:
        ids = {tid for b in drain(buffer) for tid in b["trajectory_ids"]}
    assert ids == {i for i in appends[1] if rows[i]["verifier_status"] in ("ok", "fail")}


def test_out_of_range_token_ids_fail_at_read_time(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    write_rows(uri, make_rows(30, first=0, seed=1, vocab=40_000))
    config = ReplayConfig(table_uri=uri, vocab_size=32_768, token_budget=256, max_length=64)
    with (
        ReplayBuffer(config) as buffer,
        pytest.raises(TokenRangeError, match=r"outside the vocabulary \[0, 32768\)"),
    ):
        buffer.sample(0, timeout=30)


def test_capacity_evicts_oldest_chunks_and_keeps_memory_bounded(lake) -> None:
    uri, _, _ = lake
    config = ReplayConfig(table_uri=uri, capacity_rows=60, token_budget=400, max_length=64)
    with ReplayBuffer(config) as buffer:
        buffer.sample(0, timeout=30)
        deadline = time.monotonic() + 30
        while buffer.read_to < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        stats = buffer.stats()
        versions = {c.file.version for c in buffer.storage.chunks}
    assert stats["buffer_rows"] <= 60 + 40  # whole chunks go: at most one file over
    assert stats["evicted_rows"] > 0 and 2 in versions and 0 not in versions


def test_prioritized_sampler_follows_updated_priorities(lake) -> None:
    uri, _, _ = lake
    config = ReplayConfig(table_uri=uri, token_budget=400, max_length=64, profile_matched=False)
    prioritized = PrioritizedSampler(alpha=1.0)
    with ReplayBuffer(config, sampler=SamplerStack([prioritized], seed=1)) as buffer:
        first = buffer.sample(0, timeout=30)
        while buffer.read_to < 2:
            time.sleep(0.05)
        rows = buffer.storage.rows
        initial = prioritized.priority.copy()
        np.testing.assert_allclose(initial, np.abs(rows.advantage) + prioritized.epsilon, rtol=1e-6)
        favourite = int(first["keys"][0])
        assert prioritized.update(rows.seq, np.full(len(rows), 1e-6)) == len(rows)
        assert prioritized.update([favourite, -5], [1e6, 1.0]) == 1
        position = int(np.searchsorted(rows.seq, favourite))
        hits = sum(position in buffer.sampler.draw(rows, 0, 5).tolist() for _ in range(50))
    assert hits == 50


def test_staleness_limit_holds_while_a_live_writer_appends(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    write_rows(uri, make_rows(60, first=0, seed=0, policy_version=0))
    learner = {"version": 0}
    done = threading.Event()

    def fleet() -> None:
        rng = np.random.default_rng(5)
        for k in range(1, 25):
            lagging = max(learner["version"] - int(rng.integers(0, 8)), 0)
            write_rows(uri, make_rows(40, first=60 * k, seed=k, policy_version=lagging))
            time.sleep(0.05)
        done.set()

    writer = threading.Thread(target=fleet)
    config = ReplayConfig(
        table_uri=uri,
        follow=True,
        max_lag=3,
        half_life=2.0,
        token_budget=400,
        max_length=64,
        poll_interval_s=0.05,
    )
    lags: list[int] = []
    with ReplayBuffer(config) as buffer:
        writer.start()
        while not done.is_set() or buffer.stats()["versions_behind"] > 0:
            try:
                batch = buffer.sample(learner["version"], timeout=2)
            except RateLimitTimeout:
                continue
            lags += (learner["version"] - batch["policy_versions"]).tolist()
            learner["version"] += 1
    writer.join()
    assert learner["version"] > 20
    assert max(lags) <= 3
    assert min(lags) >= -10


def test_samples_per_insert_stays_within_its_bound_and_times_out_clearly(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    write_rows(uri, make_rows(50, first=0, seed=0, all_trainable=True))
    done = threading.Event()

    def fleet() -> None:
        for k in range(1, 16):
            write_rows(uri, make_rows(50, first=50 * k, seed=k, all_trainable=True))
            time.sleep(0.1)
        done.set()

    limiter = SampleToInsertRatio(2.0, min_size=40, error_buffer=60)
    config = ReplayConfig(
        table_uri=uri,
        follow=True,
        token_budget=400,
        max_length=64,
        poll_interval_s=0.05,
        profile_matched=False,
    )
    checks = []
    writer = threading.Thread(target=fleet)
    with ReplayBuffer(config, limiter=limiter) as buffer:
        writer.start()
        while not done.is_set():
            try:
                buffer.sample(0, timeout=2)
            except RateLimitTimeout:
                continue
            checks.append((limiter.samples, limiter.inserts))
        writer.join()
        while True:  # the fleet stopped: sampling catches up to the bound, then waits
            try:
                buffer.sample(0, timeout=1.5)
            except RateLimitTimeout as exc:
                message = str(exc)
                break
            checks.append((limiter.samples, limiter.inserts))
    assert len(checks) > 10
    for samples, inserts in checks:
        assert samples <= 2.0 * (inserts - 40) + 60
    samples, inserts = checks[-1]
    assert samples >= 2.0 * (inserts - 40) + 60 - 40  # it did use the allowance
    assert "rate limiter holds sampling" in message and "learner is ahead of the fleet" in message


def test_fleet_ahead_pauses_reading_and_is_reported(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    for k in range(6):
        write_rows(uri, make_rows(50, first=50 * k, seed=k, all_trainable=True))
    limiter = SampleToInsertRatio(1.0, min_size=40, error_buffer=20)
    config = ReplayConfig(table_uri=uri, token_budget=400, max_length=64, profile_matched=False)
    with ReplayBuffer(config, limiter=limiter) as buffer:
        deadline = time.monotonic() + 20
        while not buffer.fleet_ahead and time.monotonic() < deadline:
            time.sleep(0.05)
        stats = buffer.stats()
        assert stats["fleet_ahead"] == 1.0 and stats["read_to_version"] < 5
        for _ in range(30):
            buffer.sample(0, timeout=10)
        assert buffer.read_to > stats["read_to_version"]


def test_profile_matched_mix_stays_near_target_while_a_live_writer_appends(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    skew = (0.25, 0.35, 0.40)  # the fleet's supply is far from the profile's 0.5 / 0.4 / 0.1
    write_rows(uri, make_rows(200, first=0, seed=0, bucket_shares=skew, all_trainable=True))
    done = threading.Event()

    def fleet() -> None:
        for k in range(1, 12):
            write_rows(uri, make_rows(100, first=200 * k, seed=k, bucket_shares=skew, all_trainable=True))
            time.sleep(0.05)
        done.set()

    writer = threading.Thread(target=fleet)
    config = ReplayConfig(table_uri=uri, follow=True, token_budget=512, max_length=128, poll_interval_s=0.05)
    counts: dict[str, int] = {}
    with ReplayBuffer(config) as buffer:
        writer.start()
        for _ in range(150):
            for name in buffer.sample(0, timeout=10)["buckets"]:
                counts[name] = counts.get(name, 0) + 1
        report = buffer.stats()
    writer.join()
    supply = dict(zip(PROFILE.names, skew, strict=True))
    assert PROFILE.distance(supply) > 0.25
    assert PROFILE.distance(counts) <= 0.05
    assert report["bucket_distance"] <= 0.05


def test_state_dict_round_trip_resumes_the_position(lake) -> None:
    uri, rows, _ = lake
    config = ReplayConfig(table_uri=uri, token_budget=400, max_length=64, max_uses=1)
    with ReplayBuffer(config) as buffer:
        first = [tid for _ in range(5) for tid in buffer.sample(0, timeout=30)["trajectory_ids"]]
        state = buffer.state_dict()
    again = ReplayBuffer(config)
    again.load_state_dict(state)
    with again:
        rest = [tid for b in drain(again) for tid in b["trajectory_ids"]]
    assert not set(first) & set(rest)
    assert set(first) | set(rest) == {r["trajectory_id"] for r in trainable(list(rows.values()))}
    with pytest.raises(CheckpointError, match="samplers"):
        ReplayBuffer(config, sampler=SamplerStack([FifoSampler(2), FifoSampler(1)])).load_state_dict(state)


def test_spawned_dataloader_workers_read_disjoint_shards_covering_all(lake) -> None:
    uri, rows, _ = lake
    dataset = ReplayDataset(ReplayConfig(table_uri=uri, token_budget=400, max_length=64, max_uses=1))
    ids = [
        tid for batch in replay_loader(dataset, num_workers=2, timeout=120) for tid in batch["trajectory_ids"]
    ]
    assert len(ids) == len(set(ids))
    assert set(ids) == {r["trajectory_id"] for r in trainable(list(rows.values()))}
    assert isinstance(torch.initial_seed(), int)


def test_stalest_first_eviction_drops_the_lowest_policy_versions(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    for k, policy_version in enumerate([5, 1, 3, 4]):
        write_rows(
            uri,
            make_rows(
                40,
                first=40 * k,
                seed=k,
                policy_version=policy_version,
                bucket_shares=(1, 0, 0),
                all_trainable=True,
            ),
        )
    config = ReplayConfig(
        table_uri=uri,
        capacity_rows=80,
        eviction="stalest",
        token_budget=400,
        max_length=64,
        profile_matched=False,
    )
    with ReplayBuffer(config) as buffer:
        buffer.sample(0, timeout=30)
        while buffer.read_to < 3:
            time.sleep(0.05)
        held = sorted({int(v) for c in buffer.storage.chunks for v in c.policy_version})
    assert held == [4, 5]


def test_min_size_holds_sampling_with_a_clear_error(lake) -> None:
    uri, _, _ = lake
    following = ReplayConfig(table_uri=uri, follow=True, token_budget=400, max_length=64, min_size=10_000)
    with ReplayBuffer(following) as buffer, pytest.raises(RateLimitTimeout, match="min_size=10000"):
        buffer.sample(0, timeout=2)
    bounded = ReplayConfig(table_uri=uri, token_budget=400, max_length=64, min_size=10_000)
    with ReplayBuffer(bounded) as buffer, pytest.raises(BufferExhausted, match="min_size=10000"):
        buffer.sample(0, timeout=30)


def test_ranks_times_workers_shards_are_disjoint_and_cover_all(lake) -> None:
    uri, rows, _ = lake
    seen: list[list[str]] = []
    for rank in range(2):
        dataset = ReplayDataset(
            ReplayConfig(table_uri=uri, token_budget=400, max_length=64, max_uses=1), rank=rank, world_size=2
        )
        for worker in range(2):  # what shard_config computes inside DataLoader worker `worker` of 2
            config = dataclasses.replace(dataset.config, shard=rank * 2 + worker, num_shards=4)
            with ReplayBuffer(config) as buffer:
                seen.append([tid for b in drain(buffer) for tid in b["trajectory_ids"]])
    flat = [tid for share in seen for tid in share]
    assert len(flat) == len(set(flat)) and sum(1 for share in seen if share) >= 2
    assert set(flat) == {r["trajectory_id"] for r in trainable(list(rows.values()))}


def test_files_before_the_task_columns_and_version_spans_read_as_the_contract_says(tmp_path: Path) -> None:
    """A file written before `loss_mask` / `version_spans` existed reads them as null (every token
    trained on, one version); a later file's rows go by their oldest span's version; rows with a
    null or non-finite advantage, null tokens, or a status not trained on, are left out."""
    uri = str(tmp_path / "trajectories")
    old_schema = pa.schema([f for f in TRAJECTORIES_SCHEMA if f.name not in ("loss_mask", "version_spans")])
    old = make_rows(12, first=0, seed=7, policy_version=3, all_trainable=True)
    old[0]["advantage"] = float("nan")
    old[1]["advantage"] = None
    old[2]["verifier_status"] = "error"
    old[3]["response_tokens"] = None
    write_deltalake(uri, pa.Table.from_pylist(old, schema=old_schema), partition_by=["bucket"], mode="append")
    new = make_rows(12, first=12, seed=8, policy_version=5, all_trainable=True)
    for i, row in enumerate(new):
        if i % 2:
            row["version_spans"] = [
                {"start": 0, "end": 1, "version": 5},
                {"start": 1, "end": len(row["response_tokens"]), "version": 4 - i % 3},
            ]
    write_deltalake(
        uri,
        pa.Table.from_pylist(new, schema=TRAJECTORIES_SCHEMA),
        partition_by=["bucket"],
        mode="append",
        schema_mode="merge",
    )
    config = ReplayConfig(table_uri=uri, token_budget=4096, max_length=256, max_uses=1)
    with ReplayBuffer(config) as buffer:
        batches = drain(buffer, version=5)
    got = {
        tid: int(v) for b in batches for tid, v in zip(b["trajectory_ids"], b["policy_versions"], strict=True)
    }
    expected = {r["trajectory_id"]: 3 for r in old[4:]}
    expected.update(
        {
            r["trajectory_id"]: min(s["version"] for s in r["version_spans"]) if i % 2 else 5
            for i, r in enumerate(new)
        }
    )
    assert got == expected
    rows = {r["trajectory_id"]: {**r, "policy_version": expected.get(r["trajectory_id"])} for r in old + new}
    for batch in batches:
        check_padded(batch, rows, 256)
