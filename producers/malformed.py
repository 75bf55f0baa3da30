"""Deterministic bad input for dead-letter paths: what a buggy or hostile producer might send.

Some kinds are broken bytes (the codec must refuse them); others are valid Avro whose content
breaks a rule the schema cannot express (the processor's validation must refuse them).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator

import numpy as np

from producers.fleet import SyntheticFleet
from schemas import TrajectoryCodec, TrajectoryRecord

GARBAGE = "garbage"
TRUNCATED = "truncated"
UNKNOWN_FINGERPRINT = "unknown_fingerprint"
PLAIN_JSON = "json"
EMPTY = "empty"
NAN_REWARD = "nan_reward"
LOGPROB_MISMATCH = "logprob_mismatch"

MALFORMED_KINDS = (GARBAGE, TRUNCATED, UNKNOWN_FINGERPRINT, PLAIN_JSON, EMPTY, NAN_REWARD, LOGPROB_MISMATCH)
# Kinds that decode with the codec yet must be rejected by validation.
SEMANTIC_KINDS = frozenset({NAN_REWARD, LOGPROB_MISMATCH})


def _nan_reward(record: TrajectoryRecord, fleet: SyntheticFleet) -> TrajectoryRecord:
    domain = next(d for d in fleet.domains if d.task_type == "precomputed")
    bad = record.copy()
    bad["domain"] = domain.name
    bad["task_type"] = "precomputed"
    bad["expected_answer"] = bad["unit_tests"] = bad["gold_fields"] = None
    bad["precomputed_reward"] = math.nan
    return bad


def _logprob_mismatch(record: TrajectoryRecord) -> TrajectoryRecord:
    bad = record.copy()
    logprobs = record["response_logprobs"]
    bad["response_logprobs"] = logprobs[:-4] if logprobs else b"\x00\x00\x80\xbf" * 2
    return bad


def malformed_messages(
    seed: int, n: int, *, codec: TrajectoryCodec | None = None
) -> Iterator[tuple[bytes | None, bytes, str]]:
    """Yield `n` bad messages as (key, value, kind); every run of 7 holds each kind once.

    Kinds (`MALFORMED_KINDS`): random garbage bytes; a valid message cut short; a valid body
    behind an unknown schema fingerprint; a plain JSON object; an empty value; a valid record
    whose precomputed_reward is NaN; a valid record with one logprob fewer than response tokens.
    Keys are the source record's group_id where there is one, otherwise None or random bytes.
    """
    codec = codec or TrajectoryCodec()
    rng = np.random.default_rng([seed, 0xBAD])
    fleet = SyntheticFleet(seed + 1_000_003, num_domains=len(MALFORMED_KINDS) * 2)
    records = fleet.trajectories(n)
    order: list[str] = []
    for _ in range(n):
        if not order:
            order = [MALFORMED_KINDS[i] for i in rng.permutation(len(MALFORMED_KINDS))]
        kind = order.pop()
        record = next(records)
        key: bytes | None = record["group_id"].encode()
        valid = codec.encode(record)
        if kind == GARBAGE:
            key = rng.bytes(8) if rng.random() < 0.5 else None
            value = rng.bytes(int(rng.integers(1, 2048)))
        elif kind == TRUNCATED:
            value = valid[: int(rng.integers(1, len(valid)))]
        elif kind == UNKNOWN_FINGERPRINT:
            fingerprint = rng.bytes(8)
            while int.from_bytes(fingerprint, "little") in codec.known_fingerprints:
                fingerprint = rng.bytes(8)
            value = valid[:2] + fingerprint + valid[10:]
        elif kind == PLAIN_JSON:
            value = json.dumps({"trajectory_id": record["trajectory_id"], "reward": 1.0}).encode()
        elif kind == EMPTY:
            key, value = None, b""
        elif kind == NAN_REWARD:
            value = codec.encode(_nan_reward(record, fleet))
        else:
            value = codec.encode(_logprob_mismatch(record))
        yield key, value, kind
