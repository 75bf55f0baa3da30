"""One batch of raw messages in, scored trajectories, execution records and dead letters out.

Order per message: decode (Avro single-object), validate (validation.py), pick the verifier by
domain (the domain registry), judge; the judging runs on a bounded pool, since code runs in
sandboxes. Only bad input becomes a dead letter (undecodable, invalid, unknown domain, missing
verifier input); an unexpected exception inside a verifier is a verdict with status "error",
since the trajectory itself is sound. A failure of the host (a sandbox that did not start, a
host short of memory, the OOM killer) is retried, and if it persists raises
TransientScoringError: the worker stops without acking, and the batch is judged again later.
`judge` buckets each sample and leaves groups to the stage (groups.py); `process` computes
advantages within the batch alone, for benchmarks and tests of the sink.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from schemas import DecodeError, TrajectoryCodec
from schemas.defaults import StreamDefaults
from schemas.profile import WorkloadProfile, load_profile
from stream_processors.advantages import group_advantages
from stream_processors.dead_letters import DeadLetter
from stream_processors.exceptions import InvalidRecordError, TransientScoringError
from stream_processors.executions import ExecutionRecord
from stream_processors.groups import Sample
from stream_processors.offsets import Coordinates
from stream_processors.rows import ScoredTrajectory
from stream_processors.sandbox import SandboxHostError, SandboxPool, SandboxUnavailableError
from stream_processors.validation import TokenArrays, validate, values_ok
from stream_processors.verifiers import Verdict, Verifier, VerifierRegistry
from stream_processors.verifiers.domains import DomainVerifiers

if TYPE_CHECKING:
    from stream_processors.verifier_pool import VerifierPool

log = logging.getLogger(__name__)


@dataclass(slots=True)
class SourceMessage:
    """A consumed Kafka message: its coordinates, key and raw value."""

    coordinates: Coordinates
    key: bytes | None
    value: bytes | None


@dataclass(slots=True)
class JudgedBatch:
    """A batch judged: samples for the group buffer with their messages (parallel lists), dead
    letters, the sandbox executions with their source coordinates (parallel lists), and how many
    messages were already decided (replays)."""

    coordinates: list[Coordinates] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    sources: list[SourceMessage] = field(default_factory=list)
    dead_letters: list[DeadLetter] = field(default_factory=list)
    executions: list[ExecutionRecord] = field(default_factory=list)
    execution_coordinates: list[Coordinates] = field(default_factory=list)
    skipped: int = 0
    seconds: float = 0.0

    def only(self, keep: Callable[[Coordinates], bool]) -> JudgedBatch:
        """This batch without the messages `keep` rejects (those of a partition revoked meanwhile)."""
        executions = [
            (e, c) for e, c in zip(self.executions, self.execution_coordinates, strict=True) if keep(c)
        ]
        return JudgedBatch(
            coordinates=[c for c in self.coordinates if keep(c)],
            samples=[s for s in self.samples if keep(s.coordinates)],
            sources=[m for m in self.sources if keep(m.coordinates)],
            dead_letters=[d for d in self.dead_letters if keep(d.coordinates)],
            executions=[e for e, _ in executions],
            execution_coordinates=[c for _, c in executions],
            skipped=self.skipped,
            seconds=self.seconds,
        )


@dataclass(slots=True)
class ProcessedBatch:
    """The outcome of one batch: rows with their coordinates (parallel lists), dead letters, and
    the sandbox executions with their source coordinates (parallel lists)."""

    rows: list[ScoredTrajectory] = field(default_factory=list)
    coordinates: list[Coordinates] = field(default_factory=list)
    dead_letters: list[DeadLetter] = field(default_factory=list)
    executions: list[ExecutionRecord] = field(default_factory=list)
    execution_coordinates: list[Coordinates] = field(default_factory=list)


class BatchProcessor:
    """Decodes, validates, verifies, buckets and normalizes a batch of raw messages.

    Args:
        codec: the Avro codec; default the shipped schema (plus its history).
        verifiers: domain -> verifier (`DomainVerifiers`, default from the shipped registry); a
            task-type `VerifierRegistry` overrides the registry's choice for its task types.
        pool_size: judgements run at once (sandboxes); default 2.
        verifier_pool: spawned processes for the CPU-heavy verifiers (math, extraction); None
            judges them in the calling thread.
        transient_retries: retries of a judgement the host broke before TransientScoringError.
        retry_backoff_s: the first retry's delay, doubled each time.
        profile: the inference workload profile that names each row's bucket; default the shipped one.
    """

    def __init__(
        self,
        *,
        codec: TrajectoryCodec | None = None,
        verifiers: DomainVerifiers | VerifierRegistry | None = None,
        profile: WorkloadProfile | None = None,
        pool_size: int = StreamDefaults.sandbox_pool_size,
        verifier_pool: VerifierPool | None = None,
        transient_retries: int = 3,
        retry_backoff_s: float = 0.5,
    ) -> None:
        self.codec = codec or TrajectoryCodec()
        if isinstance(verifiers, VerifierRegistry):
            verifiers = DomainVerifiers(overrides=verifiers)
        self.verifiers = verifiers if verifiers is not None else DomainVerifiers()
        self.profile = profile if profile is not None else load_profile()
        self.pool = SandboxPool(pool_size)
        self.verifier_pool = verifier_pool
        self.transient_retries = transient_retries
        self.retry_backoff_s = retry_backoff_s

    def judge(
        self, messages: Sequence[SourceMessage], done: Callable[[Coordinates], bool] = lambda _: False
    ) -> JudgedBatch:
        """Judge each message not `done` yet (a replay), bucketing its length; never raises for bad input.

        Raises:
            TransientScoringError: the host kept breaking a judgement (after retries).
            SandboxUnavailableError: the sandbox cannot run on this host at all.
        """
        start = time.perf_counter()
        out = JudgedBatch(coordinates=[m.coordinates for m in messages])
        decoded, letters, skipped = self._decode_all(messages, done, values=False)
        if letters or not values_ok([tokens for _, _, tokens in decoded]):
            # Something is wrong in this batch: decode it again with every per-record check, so
            # each bad record gets the error `validate` names first.
            decoded, letters, skipped = self._decode_all(messages, done, values=True)
        out.dead_letters.extend(letters)
        out.skipped += skipped
        verdicts = self._judge_all([record for _, record, _ in decoded])
        for (message, record, tokens), verdict in zip(decoded, verdicts, strict=True):
            if isinstance(verdict, InvalidRecordError):
                out.dead_letters.append(self._letter(message, verdict))
                continue
            for index, execution in enumerate(verdict.executions):
                out.executions.append(
                    ExecutionRecord(
                        record["trajectory_id"],
                        index,
                        record["domain"],
                        verdict.verifier,
                        verdict.verifier_version,
                        verdict.status,
                        execution,
                    )
                )
                out.execution_coordinates.append(message.coordinates)
            bucket = self.profile.bucket_of(tokens.length)
            sample = Sample(message.coordinates, record, tokens, verdict, bucket, len(message.value or b""))
            if record.get("task_id") is not None:
                sample.raw, sample.key = message.value, message.key
            out.samples.append(sample)
            out.sources.append(message)
        out.seconds = time.perf_counter() - start
        return out

    def process(self, messages: Sequence[SourceMessage]) -> ProcessedBatch:
        """Judge a batch and normalize advantages within it alone (benchmarks, tests of the sink)."""
        judged = self.judge(messages)
        out = ProcessedBatch(
            dead_letters=judged.dead_letters,
            executions=judged.executions,
            execution_coordinates=judged.execution_coordinates,
        )
        if not judged.samples:
            return out
        samples = judged.samples
        advantages = group_advantages(
            [str(s.record["group_id"]) for s in samples],
            [s.verdict.reward for s in samples],
            [s.verdict.status for s in samples],
        )
        for sample, advantage in zip(samples, advantages, strict=True):
            out.rows.append(
                ScoredTrajectory(
                    record=sample.record,
                    tokens=sample.tokens,
                    verdict=sample.verdict,
                    bucket=sample.bucket,
                    advantage=float(advantage),
                    domain_reward=0.0,
                    group_status="batch",
                )
            )
            out.coordinates.append(sample.coordinates)
        return out

    def _judge_all(self, records: list[dict[str, Any]]) -> list[Verdict | InvalidRecordError]:
        """Verdicts in order: CPU-heavy verifiers in the process pool, those that wait (sandbox,
        symbolic checker) in the sandbox pool's threads, the cheap rest in this thread."""
        pool = self.verifier_pool
        heavy = [i for i, r in enumerate(records) if pool is not None and pool.takes(r)]
        futures = pool.submit([records[i] for i in heavy]) if pool is not None else []
        chosen = set(heavy)
        rest = [i for i in range(len(records)) if i not in chosen]
        waits = getattr(self.verifiers, "waits", None)
        slow: list[int] = []
        fast: list[int] = []
        for i in rest:
            (slow if waits is None or waits(records[i]) else fast).append(i)
        out: list[Verdict | InvalidRecordError | None] = [None] * len(records)
        for i, verdict in zip(slow, self.pool.map(lambda i: self._judge(records[i]), slow), strict=True):
            out[i] = verdict
        for i in fast:
            out[i] = self._judge(records[i])
        if pool is not None:
            for i, found in zip(heavy, pool.collect(futures, len(heavy)), strict=True):
                out[i] = found if found is not None else self._judge(records[i])
        return [v for v in out if v is not None]

    def _decode_all(
        self, messages: Sequence[SourceMessage], done: Callable[[Coordinates], bool], *, values: bool
    ) -> tuple[list[tuple[SourceMessage, dict[str, Any], TokenArrays]], list[DeadLetter], int]:
        """(message, record, tokens) of each decodable message not `done`, the letters of the rest,
        and how many were skipped as done."""
        decoded: list[tuple[SourceMessage, dict[str, Any], TokenArrays]] = []
        letters: list[DeadLetter] = []
        skipped = 0
        for message in messages:
            if done(message.coordinates):
                skipped += 1
                continue
            try:
                decoded.append((message, *self._decode(message, values=values)))
            except (DecodeError, InvalidRecordError) as exc:
                letters.append(self._letter(message, exc))
            except (MemoryError, OSError):
                raise
            except Exception as exc:  # a function of the bytes: a replay repeats it
                log.warning("unexpected %s at %s: %s", type(exc).__name__, message.coordinates, exc)
                letters.append(self._letter(message, exc))
        return decoded, letters, skipped

    def _decode(self, message: SourceMessage, *, values: bool = True) -> tuple[dict[str, Any], TokenArrays]:
        if message.value is None:
            raise InvalidRecordError(
                "message has no value (a tombstone): rollouts.raw carries only trajectories"
            )
        record = self.codec.decode(message.value)
        return record, validate(record, values=values)

    def _judge(self, record: dict[str, Any]) -> Verdict | InvalidRecordError:
        """The verdict, or the input error that makes the record a dead letter.

        Raises:
            TransientScoringError: the host kept breaking the judgement (after retries).
            SandboxUnavailableError: the sandbox cannot run on this host at all.
        """
        delay = self.retry_backoff_s
        verifier: Verifier | None = None
        for attempt in range(self.transient_retries + 1):
            try:
                verifier, _ = self.verifiers.lookup(record)
                verdict = self.verifiers.judge(record)
            except InvalidRecordError as exc:
                return exc
            except SandboxUnavailableError:
                raise
            except (SandboxHostError, MemoryError, OSError) as exc:
                if attempt == self.transient_retries:
                    raise TransientScoringError(
                        f"judging {record['trajectory_id']!r} ({record['domain']}) failed "
                        f"{attempt + 1} times for the host's reasons, last: {type(exc).__name__}: {exc}. "
                        "Stopping without acking; fix the host (memory, user namespaces, cgroups) and restart"
                    ) from exc
                log.warning(
                    "transient failure judging %s (attempt %d): %s", record["trajectory_id"], attempt + 1, exc
                )
                time.sleep(delay)
                delay = min(delay * 2, 10.0)
                continue
            except Exception as exc:
                log.warning("verifier failed on %s: %r", record["trajectory_id"], exc)
                name, version = (verifier.name, verifier.version) if verifier else ("unknown", "")
                return Verdict(0.0, "error", name, f"{type(exc).__name__}: {exc}"[:500], version)
            if not math.isfinite(verdict.reward):
                assert verifier is not None
                return Verdict(
                    0.0, "error", verifier.name, f"verifier returned reward={verdict.reward!r}",
                    verifier.version, {}, verdict.executions,
                )  # fmt: skip
            return verdict
        raise AssertionError("unreachable")

    @staticmethod
    def _letter(message: SourceMessage, exc: BaseException) -> DeadLetter:
        return DeadLetter(
            reason=str(exc) or repr(exc),
            error_type=type(exc).__name__,
            raw=message.value or b"",
            key=message.key,
            coordinates=message.coordinates,
        )
