"""Hostile input on the real broker, and the decoder and validation fuzzed with hypothesis.

Injected: HOSTILE messages (4,000; 10,000 with ROLLSTREAM_SOAK=1), every other one a good
trajectory, the rest cycling the kinds of hostile.py (garbage bytes, truncated Avro, an unknown
schema, NaN and inf rewards, a NaN logprob, token and logprob counts that differ, a 2^31 string
length, a 2^31 map block count, invalid UTF-8, a 20,000-entry map, a response nested 100,000
deep). Counted: every bad message a dead letter with its reason and error type, every good one a
row (and nothing else), the worker still running at the end, its peak RSS under RSS_BOUND.
"""

from __future__ import annotations

import contextlib
import random
import threading

import polars as pl
import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from stream_support import (
    SOAK,
    group_name_fixture,  # noqa: F401 (provides the group_name fixture)
    publish,
    start_worker,
    stop_worker,
    table_rows,
    wait_for,
)

from schemas import DecodeError, TrajectoryCodec
from schemas.codec import HEADER_SIZE, MAGIC
from stream_processors.exceptions import InvalidRecordError
from stream_processors.validation import validate

from .hostile import EXPECTED, hostile_mix

pytestmark = pytest.mark.timeout(900)
HOSTILE = 10_000 if SOAK else 4_000
RSS_BOUND = 1536 * 2**20
DEAD_TYPES = {
    "garbage": {"DecodeError"},
    "truncated": {"DecodeError"},
    "unknown_schema": {"UnknownSchemaError"},
    "nan_reward": {"NonFiniteValueError"},
    "inf_reward": {"NonFiniteValueError"},
    "nan_logprob": {"NonFiniteValueError"},
    "count_mismatch": {"LengthMismatchError"},
    "length_2_31": {"DecodeError"},
    "map_count_2_31": {"DecodeError"},
    "invalid_utf8": {"DecodeError"},
}


class RssProbe:
    """Samples a process's resident set size in a thread until stopped; keeps the peak."""

    def __init__(self, pid: int) -> None:
        self.process = psutil.Process(pid)
        self.peak = 0
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            try:
                rss = self.process.memory_info().rss
            except psutil.Error:
                return
            self.samples.append(rss)
            self.peak = max(self.peak, rss)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


@pytest.mark.slow(40)
def test_hostile_messages_are_dead_letters_and_the_worker_keeps_going(
    bootstrap_servers, make_topic, group_name, tmp_path
):
    raw = make_topic("hostile-raw", partitions=3)
    dlq = make_topic("hostile-dlq", partitions=1, config={"max.message.bytes": "67108864"})
    mix = list(hostile_mix(HOSTILE, seed=11))
    delivered = publish(bootstrap_servers, raw, [(k, v) for k, v, _ in mix])
    kind_of = {}
    by_value = {}
    for _k, v, kind in mix:
        by_value.setdefault(v, kind)
    for (partition, offset), value in delivered.items():
        kind_of[(partition, offset)] = by_value[value]
    want_rows = sum(EXPECTED[kind] == "row" for kind in kind_of.values())
    want_dead = len(kind_of) - want_rows
    lake, log = tmp_path / "lake", tmp_path / "worker.log"
    proc = start_worker(bootstrap_servers, lake, raw, dlq, "hostile", group_name("hostile"), log)
    probe = RssProbe(proc.pid)
    try:
        wait_for(
            lambda: table_rows(lake / "trajectories") >= want_rows
            and table_rows(lake / "dead_letters") >= want_dead,
            600, proc, log, f"{want_rows} rows and {want_dead} dead letters",
        )  # fmt: skip
        assert proc.poll() is None, "the worker stopped"
    finally:
        probe.stop()
        code = stop_worker(proc, log)
    assert code == 0, log.read_text()[-3000:]
    rows = pl.read_delta(str(lake / "trajectories"))
    letters = pl.read_delta(str(lake / "dead_letters"))
    assert rows.height == want_rows and letters.height == want_dead
    for partition, offset, error_type, reason in letters.select(
        "partition", "offset", "error_type", "reason"
    ).iter_rows():
        kind = kind_of[(partition, offset)]
        assert EXPECTED[kind] == "dead", (kind, reason)
        assert error_type in DEAD_TYPES[kind], (kind, error_type, reason)
        assert reason, kind
    for partition, offset in rows.select("partition", "offset").iter_rows():
        assert EXPECTED[kind_of[(partition, offset)]] == "row"
    half = probe.samples[len(probe.samples) // 2] if probe.samples else 0
    print(
        f"\n{len(kind_of)} messages: {want_rows} rows, {want_dead} dead letters; worker RSS peak "
        f"{probe.peak / 2**20:.0f} MiB, at half time {half / 2**20:.0f} MiB, {len(probe.samples)} samples"
    )
    assert probe.samples and probe.peak < RSS_BOUND


FUZZ = settings(
    max_examples=20_000 if SOAK else 300,
    deadline=None,
    derandomize=not SOAK,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
CODEC = TrajectoryCodec()
VALID = [v for _, v, kind in hostile_mix(40, seed=3) if kind == "good"]


def _decode_and_validate(data: bytes) -> None:
    """Only the two bad-input errors may come out (anything else would be a crash)."""
    with contextlib.suppress(DecodeError, InvalidRecordError):
        validate(CODEC.decode(data))


@FUZZ
@given(st.binary(max_size=4096))
def test_fuzz_arbitrary_bytes(data: bytes) -> None:
    _decode_and_validate(data)
    _decode_and_validate(MAGIC + CODEC.fingerprint.to_bytes(8, "little") + data)  # a known schema


@FUZZ
@given(st.data())
def test_fuzz_mutated_valid_messages(data: st.DataObject) -> None:
    message = bytearray(data.draw(st.sampled_from(VALID)))
    rng = random.Random(data.draw(st.integers(0, 2**32)))
    for _ in range(data.draw(st.integers(1, 8))):
        op = rng.randrange(3)
        at = rng.randrange(HEADER_SIZE, len(message))
        if op == 0:
            message[at] = rng.randrange(256)
        elif op == 1:
            del message[at : at + rng.randint(1, 64)]
        else:
            message[at:at] = rng.randbytes(rng.randint(1, 16))
    _decode_and_validate(bytes(message))
