"""CPU-heavy verifiers in spawned processes: the same verdicts as in the worker, and a broken pool
falls back to judging in the caller's thread."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from producers.fleet import SyntheticFleet
from schemas import TrajectoryCodec
from stream_processors import BatchProcessor, Coordinates, SourceMessage
from stream_processors.verifier_pool import CPU_HEAVY, VERIFIER_FIELDS, VerifierPool, judge_record
from stream_processors.verifiers import DomainVerifiers

pytestmark = pytest.mark.timeout(180)
REPO = Path(__file__).resolve().parents[1]


def test_the_pool_judges_like_the_worker_and_survives_a_killed_process():
    verifiers = DomainVerifiers()
    pool = VerifierPool(verifiers, 2)
    try:
        records = list(SyntheticFleet(seed=31).trajectories(400))
        heavy = [r for r in records if pool.takes(r)]
        assert {verifiers.lookup(r)[0].name for r in heavy} == CPU_HEAVY
        assert not any(pool.takes(r) for r in records if r["task_type"] in ("code", "precomputed"))
        expected = [judge_record(verifiers, r) for r in heavy]
        got = pool.collect(pool.submit(heavy), len(heavy))
        assert got == expected
        # Each pool process names itself once its initializer ran (the second may still be starting).
        deadline = time.monotonic() + 60
        while len(named := [c for c in psutil.Process().children() if c.name() == "rs-verifier"]) < 2:
            assert time.monotonic() < deadline, f"pool processes named rs-verifier for ps and top: {named}"
            time.sleep(0.1)

        # A process killed while it judges breaks the pool: the chunks in flight come back as None
        # (the caller judges them), and the next submit starts a new pool. The chunks are large
        # (seconds of work) so that the kill lands while they run, not after they finished.
        many = heavy * 40
        in_flight = pool.submit(many)
        for pid in list(pool._executor._processes):
            os.kill(pid, signal.SIGKILL)
        broken = pool.collect(in_flight, len(many))
        assert broken.count(None) > 0
        assert all(got is None or got == want for got, want in zip(broken, expected * 40, strict=True))
        assert pool.collect(pool.submit(heavy), len(heavy)) == expected
    finally:
        pool.close()


class _Watched(dict):
    """A record that notes which fields are read."""

    read: set[str]

    def get(self, key, default=None):
        self.read.add(key)
        return super().get(key, default)

    def __getitem__(self, key):
        self.read.add(key)
        return super().__getitem__(key)


def test_the_pools_verifiers_read_only_the_fields_it_sends():
    verifiers = DomainVerifiers()
    read: set[str] = set()
    records = list(SyntheticFleet(seed=33).trajectories(400))
    heavy = [r for r in records if verifiers.lookup(r)[0].name in CPU_HEAVY]
    broken = [{**r, "expected_answer": None, "gold_fields": None} for r in heavy[:20]]  # dead letters
    for record in [*heavy, *broken]:
        watched = _Watched(record)
        watched.read = read
        judge_record(verifiers, watched)
    assert read and read <= set(VERIFIER_FIELDS)


def test_a_batch_processor_with_the_pool_gives_the_same_samples():
    codec = TrajectoryCodec()
    messages = [
        SourceMessage(Coordinates("t", 0, i), None, codec.encode(r))
        for i, r in enumerate(SyntheticFleet(seed=32).trajectories(120))
        if r["task_type"] != "code"
    ]
    alone = BatchProcessor(verifier_pool=None).judge(messages)
    processor = BatchProcessor()
    processor.verifier_pool = VerifierPool(processor.verifiers, 1)
    try:
        pooled = processor.judge(messages)
    finally:
        processor.verifier_pool.close()
    assert [(s.coordinates, s.verdict) for s in pooled.samples] == [
        (s.coordinates, s.verdict) for s in alone.samples
    ]
    assert len(pooled.samples) == len(messages)


def test_pool_processes_end_when_their_worker_is_sigkilled(tmp_path):
    """A SIGKILLed worker leaves no pool process behind (none lives on, reparented to init)."""
    script = (
        "import os, sys, time\n"
        "from stream_processors.verifier_pool import VerifierPool\n"
        "from stream_processors.verifiers import DomainVerifiers\n"
        "pool = VerifierPool(DomainVerifiers(), 2)\n"
        "pool.collect(pool.submit([]), 0)\n"
        "while len(pool._executor._processes) < 2: time.sleep(0.05)\n"
        "print(' '.join(str(p) for p in pool._executor._processes), flush=True)\n"
        "time.sleep(600)\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    worker = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert worker.stdout is not None
        children = [psutil.Process(int(p)) for p in worker.stdout.readline().split()]
        assert len(children) == 2 and all(c.is_running() for c in children)
    finally:
        worker.kill()
        worker.wait(timeout=30)
    _, alive = psutil.wait_procs(children, timeout=15)
    assert not alive, f"pool processes outlived their SIGKILLed worker: {[p.pid for p in alive]}"
