"""The processor SIGKILLed 20 times at random moments: the same rows, letters and state as a clean run.

Injected: MESSAGES (4,000; 200,000, so 100,000 good trajectories, with ROLLSTREAM_SOAK=1) from
hostile.py, good groups of 8 interleaved with hostile messages, then 60 re-sends of good ones,
published in KILLS + 1 chunks while a worker on a fresh lake runs: each of its 20 lives gets one
chunk and is SIGKILLed a random 0 to 2 s later, so every kill lands while the worker has fresh
messages to judge, group and commit (every fifth life is killed during its start-up instead, after
its chunk was published). After each kill, Kafka's committed offsets must not pass an unstored
message. The last life drains the rest; then a clean worker processes the whole topic on its own
lake. Counted: both lakes hold exactly the expected rows and dead letters (by source offset, with
the same error types), each trajectory_id once, the same advantages and group statuses, and the
same per-domain statistics in the stored state.
"""

from __future__ import annotations

import random
import signal
import time

import numpy as np
import polars as pl
import pytest
from stream_support import (
    SOAK,
    group_name_fixture,  # noqa: F401 (provides the group_name fixture)
    publish,
    start_worker,
    stop_worker,
    table_rows,
    wait_for,
)
from test_stream_groups_e2e import APP_ID, WORKER_FLAGS, _committed_offsets_are_stored, _merged_stats, _run

from stream_processors.stage import DUPLICATE

from .hostile import EXPECTED, hostile_mix

pytestmark = pytest.mark.timeout(2400)
MESSAGES = 200_000 if SOAK else 4_000
KILLS = 20
RESENDS = 60
STARTUP_KILL_EVERY = 5


@pytest.mark.slow(155)
def test_twenty_sigkills_change_nothing(bootstrap_servers, make_topic, group_name, tmp_path):
    raw = make_topic("kills-raw", partitions=4)
    ultra = make_topic("kills-ultra", partitions=2, config={"max.message.bytes": "67108864"})
    dlq = make_topic("kills-dlq", partitions=1, config={"max.message.bytes": "67108864"})
    mix = list(hostile_mix(MESSAGES, seed=41))
    good = [(k, v) for k, v, kind in mix if kind == "good"]
    resent = random.Random(4).sample(good, RESENDS)
    messages = [(k, v) for k, v, _ in mix] + resent
    step = -(-len(messages) // (KILLS + 1))
    chunks = [messages[i : i + step] for i in range(0, len(messages), step)]
    assert len(chunks) == KILLS + 1

    killed_lake, logs = tmp_path / "lake-killed", tmp_path / "killed"
    logs.mkdir()
    killed_group = group_name("kills-killed")
    rng = random.Random(11)
    delivered: dict[tuple[int, int], bytes] = {}
    for i in range(KILLS):
        log = logs / f"worker-{i}.log"
        proc = start_worker(
            bootstrap_servers,
            killed_lake,
            raw,
            dlq,
            APP_ID,
            killed_group,
            log,
            ultra=ultra,
            extra=WORKER_FLAGS,
        )
        try:
            at_startup = i % STARTUP_KILL_EVERY == STARTUP_KILL_EVERY - 1
            if not at_startup:
                wait_for(
                    lambda w=log: w.read_text().count("assigned partitions") >= 2,
                    120,
                    proc,
                    log,
                    "its partitions",
                )  # type: ignore[misc]
            delivered |= publish(bootstrap_servers, raw, chunks[i])
            time.sleep(rng.uniform(0.3, 2.5) if at_startup else rng.uniform(0.0, 2.0))
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
            moment = "during start-up" if at_startup else "with its chunk in flight"
            print(f"\nSIGKILL {i + 1} {moment}: {table_rows(killed_lake / 'trajectories')} rows in Delta")
            _committed_offsets_are_stored(
                bootstrap_servers, killed_group, raw, ultra, killed_lake / "trajectories"
            )
        finally:
            if (
                proc.poll() is None
            ):  # something failed before the kill: stop it cleanly once it took its signals
                wait_for(
                    lambda w=log: "[^Worker]: Ready" in w.read_text(), 120, proc, log, "the worker ready"
                )  # type: ignore[misc]
                assert stop_worker(proc, log) == 0, log.read_text()[-3000:]
    delivered |= publish(bootstrap_servers, raw, chunks[KILLS])
    assert len(delivered) == len(messages)

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

    def run(name: str, lake, group: str) -> tuple[pl.DataFrame, pl.DataFrame]:
        """A worker (no kill) until every row and dead letter of the topic is in `lake`."""
        (tmp_path / name).mkdir()
        _run(
            bootstrap_servers, raw, ultra, dlq, lake, group, tmp_path / name, [],
            total=want_rows, done=lambda: table_rows(lake / "dead_letters") >= want_dead,
        )  # fmt: skip
        return pl.read_delta(str(lake / "trajectories")), pl.read_delta(str(lake / "dead_letters"))

    killed_rows, killed_letters = run("killed-last", killed_lake, killed_group)
    clean_rows, clean_letters = run("clean", tmp_path / "lake-clean", group_name("kills-clean"))
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
