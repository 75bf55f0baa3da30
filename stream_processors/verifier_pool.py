"""CPU-heavy verifiers (math, extraction) in spawned processes, off the GIL and the event loop.

Spawned, never forked: deltalake and polars do not survive fork() (HAZARDS.md). Each process
builds its own `DomainVerifiers` from the parent's registry and options, so a verdict is the same
as in the parent. Records travel as the few text fields these verifiers read (VERIFIER_FIELDS).
A chunk the pool cannot judge (a broken process, a host error) is judged again in the caller's
thread, where host errors are retried and stop the worker if they persist.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import multiprocessing
import os
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from schemas.domains import DomainRegistry, DomainSpec
from stream_processors.exceptions import InvalidRecordError
from stream_processors.thread_names import name_os_thread
from stream_processors.verifiers import Verdict
from stream_processors.verifiers.domains import DomainVerifiers

log = logging.getLogger(__name__)

PARENT_CHECK_S = 1.0
"""How often a pool process checks that the worker that started it is alive."""
CPU_HEAVY = frozenset({"math", "extraction"})
"""Verifiers judged in the pool: pure Python work of a few hundred microseconds per record."""
VERIFIER_FIELDS = ("trajectory_id", "domain", "task_type", "response_text", "expected_answer", "gold_fields")
"""What the CPU_HEAVY verifiers read of a record, and all a record sends to the pool: pickling the
rest (the packed tokens, the created_at datetime, the metadata map) and reading it back cost
about half as much CPU as judging the record. tests/test_stream_verifier_pool.py checks that
these verifiers read nothing else."""

_verifiers: DomainVerifiers | None = None


def _plain(domains: DomainRegistry) -> tuple[dict[str, Any], dict[str, DomainSpec], str]:
    """The registry as picklable plain data (it holds read-only mapping proxies)."""
    task_types = {name: (verifier, dict(options)) for name, (verifier, options) in domains.task_types.items()}
    specs = {name: dataclasses.replace(spec, options=dict(spec.options)) for name, spec in domains.items()}
    return task_types, specs, domains.source


def _exit_with(parent: int) -> None:
    """End this process once `parent` is gone (a SIGKILLed worker would otherwise leave it behind)."""
    while os.getppid() == parent:
        time.sleep(PARENT_CHECK_S)
    os._exit(0)


def _start(
    registry: tuple[dict[str, Any], dict[str, DomainSpec], str],
    unknown_domains: str,
    versions: Mapping[str, str],
    parent: int,
) -> None:
    global _verifiers
    name_os_thread("rs-verifier")  # the process's main thread: `ps` and `top` show this name
    threading.Thread(target=_exit_with, args=(parent,), name="rollstream-parent-watch", daemon=True).start()
    _verifiers = DomainVerifiers(
        DomainRegistry(*registry), unknown_domains=unknown_domains, versions=versions
    )


def judge_record(verifiers: DomainVerifiers, record: Mapping[str, Any]) -> Verdict | InvalidRecordError:
    """The verdict of a verifier that runs no sandbox, or the input error that makes a dead letter.

    Raises:
        MemoryError, OSError: the host's failures, for the caller to retry.
    """
    name, version = "unknown", ""
    try:
        verifier, _ = verifiers.lookup(record)
        name, version = verifier.name, verifier.version
        verdict = verifiers.judge(record)
    except InvalidRecordError as exc:
        return exc
    except (MemoryError, OSError):
        raise
    except Exception as exc:
        log.warning("verifier failed on %s: %r", record.get("trajectory_id"), exc)
        return Verdict(0.0, "error", name, f"{type(exc).__name__}: {exc}"[:500], version)
    if not math.isfinite(verdict.reward):
        return Verdict(0.0, "error", name, f"verifier returned reward={verdict.reward!r}", version)
    return verdict


def _ready() -> None:
    """A no-op: submitting it starts a process and runs its initializer."""


def _judge_chunk(records: list[dict[str, Any]]) -> list[Verdict | InvalidRecordError]:
    assert _verifiers is not None, "the pool's initializer did not run"
    return [judge_record(_verifiers, r) for r in records]


class VerifierPool:
    """Judges the records of CPU-heavy verifiers in `size` spawned processes.

    Args:
        verifiers: the parent's verifiers; their registry, unknown-domain policy and versions are
            rebuilt in each process (task-type overrides cannot be, and are refused).
        size: processes; each holds its own verifiers (about 115 MB, plus a sympy helper).
    """

    def __init__(self, verifiers: DomainVerifiers, size: int) -> None:
        if size < 1:
            raise ValueError(f"verifier pool size must be >= 1, got {size} (0 means no pool: pass None)")
        if verifiers.overrides:
            raise ValueError(
                "a VerifierPool cannot rebuild task-type overrides in its processes; use no pool"
            )
        self.verifiers = verifiers
        self.size = size
        self._executor = self._new_executor()

    def _new_executor(self) -> ProcessPoolExecutor:
        executor = ProcessPoolExecutor(
            max_workers=self.size,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_start,
            initargs=(
                _plain(self.verifiers.domains),
                self.verifiers.unknown_domains,
                dict(self.verifiers.versions),
                os.getpid(),
            ),
        )
        for _ in range(self.size):
            executor.submit(_ready)  # start the processes now, not when the first batch waits for them
        return executor

    def takes(self, record: Mapping[str, Any]) -> bool:
        """Whether `record`'s verifier is one the pool judges."""
        try:
            verifier, _ = self.verifiers.lookup(record)
        except Exception:
            return False  # judged in the caller's thread, which makes it a dead letter
        return verifier.name in CPU_HEAVY

    def submit(self, records: Sequence[Mapping[str, Any]]) -> list[tuple[int, Future[Any] | None]]:
        """Start judging `records` in about `size` chunks; pass the result to `collect`.

        A broken pool (a process killed) is replaced before the next chunk is sent.
        """
        if not records:
            return []
        light = [{k: r[k] for k in VERIFIER_FIELDS if k in r} for r in records]
        step = max(1, math.ceil(len(light) / self.size))
        out: list[tuple[int, Future[Any] | None]] = []
        for i in range(0, len(light), step):
            chunk = light[i : i + step]
            try:
                out.append((i, self._executor.submit(_judge_chunk, chunk)))
            except BrokenProcessPool as exc:
                log.warning("the verifier pool broke (%s); starting a new one", exc)
                self._executor.shutdown(wait=False, cancel_futures=True)
                self._executor = self._new_executor()
                out.append((i, self._executor.submit(_judge_chunk, chunk)))
        return out

    def collect(
        self, futures: list[tuple[int, Future[Any] | None]], count: int
    ) -> list[Verdict | InvalidRecordError | None]:
        """The verdicts in order; None where a chunk failed (the caller judges those itself)."""
        out: list[Verdict | InvalidRecordError | None] = [None] * count
        for start, future in futures:
            if future is None:
                continue
            try:
                verdicts = future.result()
            except Exception as exc:
                log.warning("the verifier pool could not judge a chunk (%s); judging it in-thread", exc)
                continue
            out[start : start + len(verdicts)] = verdicts
        return out

    def close(self) -> None:
        """Stop the processes (judgements still queued are dropped)."""
        self._executor.shutdown(wait=False, cancel_futures=True)
