"""One batch of raw messages in, scored trajectories and dead letters out (no I/O).

Order per message: decode (Avro single-object), validate (validation.py), pick the verifier by
task_type, judge. Anything that fails becomes a dead letter with the error's message as reason;
an unexpected exception inside a verifier is a verdict with status "error" instead, since the
trajectory itself is sound. Then buckets and advantages are computed over the whole batch.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from schemas import DecodeError, TrajectoryCodec
from schemas.profile import WorkloadProfile, load_profile
from stream_processors.advantages import domain_rewards, group_advantages
from stream_processors.dead_letters import DeadLetter
from stream_processors.exceptions import InvalidRecordError
from stream_processors.offsets import Coordinates
from stream_processors.rows import ScoredTrajectory
from stream_processors.validation import TokenArrays, validate
from stream_processors.verifiers import Verdict, VerifierRegistry, default_registry

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SourceMessage:
    """A consumed Kafka message: its coordinates, key and raw value."""

    coordinates: Coordinates
    key: bytes | None
    value: bytes | None


@dataclass(slots=True)
class ProcessedBatch:
    """The outcome of one batch: rows with their coordinates (parallel lists) and dead letters."""

    rows: list[ScoredTrajectory] = field(default_factory=list)
    coordinates: list[Coordinates] = field(default_factory=list)
    dead_letters: list[DeadLetter] = field(default_factory=list)


class BatchProcessor:
    """Decodes, validates, verifies, buckets and normalizes a batch of raw messages.

    Args:
        codec: the Avro codec; default the shipped schema (plus its history).
        verifiers: task_type -> verifier; default `default_registry()`.
        profile: the inference workload profile that names each row's bucket; default the shipped one.
    """

    def __init__(
        self,
        *,
        codec: TrajectoryCodec | None = None,
        verifiers: VerifierRegistry | None = None,
        profile: WorkloadProfile | None = None,
    ) -> None:
        self.codec = codec or TrajectoryCodec()
        self.verifiers = verifiers if verifiers is not None else default_registry()
        self.profile = profile if profile is not None else load_profile()

    def process(self, messages: Sequence[SourceMessage]) -> ProcessedBatch:
        """Turn a batch into rows and dead letters; never raises for bad input."""
        out = ProcessedBatch()
        judged: list[tuple[Coordinates, dict[str, Any], TokenArrays, Verdict]] = []
        for message in messages:
            try:
                judged.append((message.coordinates, *self._judge(message)))
            except (DecodeError, InvalidRecordError) as exc:
                out.dead_letters.append(self._letter(message, exc))
            except Exception as exc:
                log.warning("unexpected %s at %s: %s", type(exc).__name__, message.coordinates, exc)
                out.dead_letters.append(self._letter(message, exc))
        if not judged:
            return out
        rewards = [verdict.reward for _, _, _, verdict in judged]
        advantages = group_advantages(
            [record["group_id"] for _, record, _, _ in judged], rewards, [v.status for _, _, _, v in judged]
        )
        normalized = domain_rewards(rewards)
        buckets = self.profile.bucket_names([tokens.length for _, _, tokens, _ in judged])
        for i, (coordinates, record, tokens, verdict) in enumerate(judged):
            out.rows.append(
                ScoredTrajectory(
                    record=record,
                    tokens=tokens,
                    verdict=verdict,
                    bucket=buckets[i],
                    advantage=float(advantages[i]),
                    domain_reward=float(normalized[i]),
                )
            )
            out.coordinates.append(coordinates)
        return out

    def _judge(self, message: SourceMessage) -> tuple[dict[str, Any], TokenArrays, Verdict]:
        if message.value is None:
            raise InvalidRecordError(
                "message has no value (a tombstone): rollouts.raw carries only trajectories"
            )
        record = self.codec.decode(message.value)
        tokens = validate(record)
        verifier = self.verifiers[record["task_type"]]
        try:
            verdict = verifier.verify(record)
        except InvalidRecordError:
            raise
        except Exception as exc:
            log.warning("verifier %s failed on %s: %r", verifier.name, record["trajectory_id"], exc)
            verdict = Verdict(0.0, "error", verifier.name, f"{type(exc).__name__}: {exc}"[:500])
        if not math.isfinite(verdict.reward):
            verdict = Verdict(0.0, "error", verifier.name, f"verifier returned reward={verdict.reward!r}")
        return record, tokens, verdict

    @staticmethod
    def _letter(message: SourceMessage, exc: BaseException) -> DeadLetter:
        return DeadLetter(
            reason=str(exc) or repr(exc),
            error_type=type(exc).__name__,
            raw=message.value or b"",
            key=message.key,
            coordinates=message.coordinates,
        )
