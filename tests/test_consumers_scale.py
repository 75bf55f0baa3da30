"""The replay buffer across torch.distributed ranks, and its memory while the table grows tenfold."""

from __future__ import annotations

import json
import multiprocessing
import time
from pathlib import Path

import psutil
import pytest
import torch.multiprocessing as torch_mp
from replay_support import (
    append_fast,
    fast_table,
    fast_writer_process,
    make_rows,
    rank_main,
    trainable,
    write_rows,
)

from consumers import ReplayBuffer, ReplayConfig
from consumers.replay import TableLog

pytestmark = pytest.mark.timeout(300)


def test_two_gloo_ranks_read_disjoint_rows_covering_the_table(tmp_path: Path) -> None:
    uri = str(tmp_path / "trajectories")
    rows = []
    for k in range(6):
        append = make_rows(60, first=60 * k, seed=k)
        write_rows(uri, append)
        rows += append
    out = tmp_path / "ranks.json"
    torch_mp.spawn(rank_main, args=(2, str(tmp_path / "init"), uri, str(out)), nprocs=2, join=True)
    result = json.loads(out.read_text())
    ranks = result["ranks"]
    assert [(r["rank"], r["world"]) for r in ranks] == [(0, 2), (1, 2)]
    first, second = (set(r["ids"]) for r in ranks)
    assert first and second and not first & second
    assert first | second == {r["trajectory_id"] for r in trainable(rows)}
    assert result["total"] == len(first) + len(second)


@pytest.mark.slow(53)
def test_rss_stays_flat_while_the_table_grows_tenfold(tmp_path: Path) -> None:
    uri = str(tmp_path / "trajectories")
    rows_per_append, mean_length, appends = 400, 1024, 10
    for k in range(appends):
        append_fast(
            uri, fast_table(rows_per_append, first=k * rows_per_append, seed=k, mean_length=mean_length)
        )
    config = ReplayConfig(
        table_uri=uri,
        follow=True,
        capacity_rows=1500,
        token_budget=8192,
        max_length=2048,
        poll_interval_s=0.1,
        profile_matched=False,
    )
    process = psutil.Process()
    spawn = multiprocessing.get_context("spawn")
    writer = spawn.Process(
        target=fast_writer_process,
        args=(uri, 9 * appends, rows_per_append, appends * rows_per_append, mean_length, 0.05),
    )
    with ReplayBuffer(config) as buffer:
        while buffer.read_to < appends - 1:
            buffer.sample(0, timeout=60)
        for _ in range(20):
            buffer.sample(0, timeout=60)
        baseline = process.memory_info().rss
        writer.start()
        peak, samples = baseline, 0
        while writer.is_alive() or buffer.read_to < 10 * appends - 1:
            buffer.sample(0, timeout=60)
            time.sleep(0.001)  # a learner's step between samples (a sample alone takes ~0.15 ms)
            samples += 1
            if samples % 5 == 0:
                peak = max(peak, process.memory_info().rss)
            assert samples < 100_000, "the reader never caught up with the writer"
        writer.join()
        final = process.memory_info().rss
        stats = buffer.stats()
    table_rows = sum(f.num_records or 0 for v in range(10 * appends) for f in TableLog(uri).added_files(v))
    print(
        f"\nRSS baseline {baseline / 1e6:.0f} MB at {appends * rows_per_append} rows; peak {peak / 1e6:.0f} MB, "
        f"final {final / 1e6:.0f} MB at {table_rows} rows; buffer held {stats['buffer_rows']:.0f} rows "
        f"({stats['buffer_mb']:.0f} MB of tokens), evicted {stats['evicted_rows']:.0f}"
    )
    assert table_rows == 10 * appends * rows_per_append
    assert stats["read_to_version"] == 10 * appends - 1
    assert peak <= 1.2 * baseline
    time.sleep(0)
