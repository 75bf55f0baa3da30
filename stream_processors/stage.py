"""The synchronous heart of the stream stage: one batch through processing and both sinks.

Kept free of Faust so it can be tested and benchmarked alone; app.py runs it in an executor
thread, one batch at a time, and acks the batch's messages only after `run` returns.

Rows and dead letters are two Delta commits to two tables, each exactly once per offset by its
own txn versions, not one atomic commit. A worker that dies between them leaves the batch's rows
committed and its letters not; the replay processes the batch again, the rows sink skips offsets
at or below its stored offset, and the letters are written. That makes every message exactly one
row or one dead letter only if its outcome on replay is the one it had before: a function of its
bytes and the deployed code (the codec's schemas, validation.py, the verifier registry). If the
outcome changes in between, a message that was a letter and is now a row is lost when a later
row of its partition was committed (its offset is skipped as written), and one that was a row
and is now a letter lands in both tables. Failures of the host (memory, a sandbox that did not
start) never decide an outcome: processing retries them and then raises, so the batch is not
acked. A sandbox verdict may differ on replay (a run near its time limit), but only between
row verdicts, never between a row and a letter, so the accounting holds.

So after a crash (a non-zero exit, SIGKILL, an OOM kill; a SIGTERM stop finishes both commits):
restart with the same app_id and unchanged code, and nothing is lost or doubled. Change the code or the registry only once that worker has consumed past the batch it
crashed in, then stop it with SIGTERM. If the code changed first, check the crashed batch by
hand: the offsets at risk are those covered by the last trajectories commit the crashed worker
made (per partition, between the table's stored offset in the version before it and in that
version; `DeltaTable.history()` shows the commit). Each must be in exactly one of the two tables:
publish a missing message again (read it from Kafka at its coordinates), delete a doubled one
from dead_letters.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from stream_processors.dead_letters import DeadLetters
from stream_processors.delta_sink import DeltaSink
from stream_processors.exceptions import SinkError
from stream_processors.executions import ExecutionLog
from stream_processors.processing import BatchProcessor, SourceMessage

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class BatchStats:
    """What one batch did: messages in, rows and dead letters appended, replays skipped, timings."""

    records_in: int
    rows_written: int
    dead_letters_written: int
    rows_skipped: int
    dead_letters_skipped: int
    seconds: float
    process_seconds: float = 0.0
    executions_written: int = 0


class Stage:
    """Processes a batch, then appends its rows and its dead letters, each exactly once per offset.

    Steps of `run`:
      1. decode, validate, verify, bucket, normalize (BatchProcessor);
      2. append the rows to the trajectories table with their offsets (one commit);
      3. append the sandbox executions to the executions table (one commit, same mechanism);
      4. send the dead letters to the topic, then append them to the dead_letters table.
    A host failure while judging (TransientScoringError) propagates: the worker stops unacked.
    A failing write is retried with backoff (`write_retries` times); replayed offsets are
    skipped by the sinks, so a retry never duplicates.
    """

    def __init__(
        self,
        processor: BatchProcessor,
        sink: DeltaSink,
        dead_letters: DeadLetters,
        *,
        executions: ExecutionLog | None = None,
        write_retries: int = 5,
        retry_backoff_s: float = 0.5,
    ) -> None:
        self.processor = processor
        self.sink = sink
        self.dead_letters = dead_letters
        self.executions = executions
        self.write_retries = write_retries
        self.retry_backoff_s = retry_backoff_s

    def run(self, messages: Sequence[SourceMessage]) -> BatchStats:
        """Process and persist one batch; raises SinkError when a write keeps failing."""
        start = time.perf_counter()
        batch = self.processor.process(messages)
        processed = time.perf_counter()
        rows = self._retrying("trajectories", lambda: self.sink.write(batch.rows, batch.coordinates))
        executions = 0
        if self.executions is not None:
            log_ = self.executions
            executions = self._retrying(
                "executions", lambda: log_.write(batch.executions, batch.execution_coordinates)
            )
        letters = self._retrying("dead_letters", lambda: self.dead_letters.write(batch.dead_letters))
        return BatchStats(
            records_in=len(messages),
            rows_written=rows,
            dead_letters_written=letters,
            rows_skipped=len(batch.rows) - rows,
            dead_letters_skipped=len(batch.dead_letters) - letters,
            seconds=time.perf_counter() - start,
            process_seconds=processed - start,
            executions_written=executions,
        )

    def _retrying(self, what: str, write: Callable[[], int]) -> int:
        delay = self.retry_backoff_s
        for attempt in range(self.write_retries + 1):
            try:
                return write()
            except SinkError as exc:
                if attempt == self.write_retries:
                    raise
                log.warning(
                    "writing %s failed (attempt %d): %s; retrying in %.1fs", what, attempt + 1, exc, delay
                )
                time.sleep(delay)
                delay = min(delay * 2, 30.0)
        raise AssertionError("unreachable")
