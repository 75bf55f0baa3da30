"""The processor SIGKILLed 20 times at random moments: the same rows, letters and state as a clean run.

Injected: MESSAGES (4,000; 200,000, so 100,000 good trajectories, with ROLLSTREAM_SOAK=1) from
hostile.py, good groups of 8 interleaved with hostile messages, then 60 re-sends of good ones.
One worker runs clean; another, on a fresh lake, is SIGKILLed 20 times, each after a random share
of the rows landed plus a random delay, and restarted (test_stream_groups_e2e's `_run`, which also
checks after each kill that Kafka's committed offsets never pass an unstored message). Counted:
both lakes hold exactly the expected rows and dead letters (by source offset, with the same error
types), each trajectory_id once, the same advantages and group statuses, and the same per-domain
statistics in the stored state.
"""

from __future__ import annotations

import random

import numpy as np
import polars as pl
import pytest
from stream_support import (
    SOAK,
    group_name_fixture,  # noqa: F401 (provides the group_name fixture)
    publish,
    table_rows,
)
from test_stream_groups_e2e import _merged_stats, _run

from stream_processors.stage import DUPLICATE

from .hostile import EXPECTED, hostile_mix

pytestmark = pytest.mark.timeout(2400)
MESSAGES = 200_000 if SOAK else 4_000
KILLS = 20
RESENDS = 60


def test_twenty_sigkills_change_nothing(bootstrap_servers, make_topic, group_name, tmp_path):
    raw = make_topic("kills-raw", partitions=4)
    ultra = make_topic("kills-ultra", partitions=2, config={"max.message.bytes": "67108864"})
    dlq = make_topic("kills-dlq", partitions=1, config={"max.message.bytes": "67108864"})
    mix = list(hostile_mix(MESSAGES, seed=41))
    good = [(k, v) for k, v, kind in mix if kind == "good"]
    resent = random.Random(4).sample(good, RESENDS)
    delivered = publish(bootstrap_servers, raw, [(k, v) for k, v, _ in mix] + resent)
    kind_of_value = {}
    for _, v, kind in mix:
        kind_of_value.setdefault(v, kind)
    first: set[bytes] = set()
    expected: dict[tuple[int, int], str] = {}
    for (partition, offset), value in sorted(delivered.items()):
        kind = kind_of_value[value]
        if kind == "good" and value in first:
            expected[(partition, offset)] = DUPLICATE
        else:
            expected[(partition, offset)] = EXPECTED[kind]
            first.add(value)
    want_rows = sum(v == "row" for v in expected.values())
    want_dead = len(expected) - want_rows

    def run(name: str, kills: list[float]) -> tuple[pl.DataFrame, pl.DataFrame]:
        lake, logs = tmp_path / f"lake-{name}", tmp_path / name
        logs.mkdir()
        _run(
            bootstrap_servers, raw, ultra, dlq, lake, group_name(f"kills-{name}"), logs, kills,
            total=want_rows, done=lambda: table_rows(lake / "dead_letters") >= want_dead,
        )  # fmt: skip
        return pl.read_delta(str(lake / "trajectories")), pl.read_delta(str(lake / "dead_letters"))

    clean_rows, clean_letters = run("clean", [])
    rng = random.Random(11)
    killed_rows, killed_letters = run("killed", [rng.uniform(0.02, 0.045) for _ in range(KILLS)])
    for rows, letters in ((clean_rows, clean_letters), (killed_rows, killed_letters)):
        assert rows.height == want_rows and rows["trajectory_id"].n_unique() == want_rows
        assert letters.height == want_dead
        got_rows = {(p, o) for p, o in rows.select("partition", "offset").iter_rows()}
        assert got_rows == {k for k, v in expected.items() if v == "row"}
        for p, o, error_type in letters.select("partition", "offset", "error_type").iter_rows():
            want = expected[(p, o)]
            assert want != "row" and (error_type == DUPLICATE) == (want == DUPLICATE), (p, o, error_type)
    key = ["partition", "offset"]
    assert (
        clean_letters.select(*key, "error_type")
        .sort(key)
        .equals(killed_letters.select(*key, "error_type").sort(key))
    )
    joined = clean_rows.join(killed_rows, on="trajectory_id", suffix="_k")
    assert joined.height == want_rows
    assert (joined["group_status"] == joined["group_status_k"]).all()
    assert np.allclose(joined["advantage"].to_numpy(), joined["advantage_k"].to_numpy(), rtol=0, atol=1e-9)
    clean_stats, killed_stats = (
        _merged_stats(tmp_path / "lake-clean"),
        _merged_stats(tmp_path / "lake-killed"),
    )
    assert clean_stats.keys() == killed_stats.keys() and clean_stats
    for domain, values in clean_stats.items():
        assert np.allclose(values, killed_stats[domain], rtol=0, atol=1e-9), domain
    print(
        f"\n{len(expected)} messages: {want_rows} rows, {want_dead} dead letters ({RESENDS} duplicates); {KILLS} SIGKILLs"
    )
