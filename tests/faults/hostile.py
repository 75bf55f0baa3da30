"""Hostile messages for the faults tests: each kind with the outcome the stage owes it.

`hostile_mix(n, seed)` returns (key, value, kind) triples; `EXPECTED[kind]` says whether a message
of that kind must be a dead letter ("dead") or a row ("row"). Good trajectories are interleaved.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator

from producers.fleet import SyntheticFleet
from schemas import TrajectoryCodec
from schemas.codec import HEADER_SIZE, MAGIC

EXPECTED = {
    "good": "row",
    "garbage": "dead",
    "truncated": "dead",
    "unknown_schema": "dead",
    "nan_reward": "dead",
    "inf_reward": "dead",
    "nan_logprob": "dead",
    "count_mismatch": "dead",
    "length_2_31": "dead",
    "map_count_2_31": "dead",
    "invalid_utf8": "dead",
    "huge_map": "row",  # valid Avro, within the topic's limit: a row like any other
    "deep_json": "row",  # a response nested 100,000 deep: the verifier's verdict, never a crash
}


def zigzag(n: int) -> bytes:
    """Avro's long encoding (zigzag varint)."""
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while z > 0x7F:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def _precomputed(record: dict) -> dict:
    return {**record, "task_type": "precomputed", "domain": "precomputed/chat-000", "unit_tests": None}


def _solo(record: dict) -> dict:
    """A group of its own (group_size 1): hostile messages must not hold good groups open."""
    return {**record, "group_id": "solo-" + record["trajectory_id"], "sample_index": 0, "group_size": 1}


def hostile_mix(n: int, seed: int = 0) -> Iterator[tuple[bytes | None, bytes, str]]:
    """About `n` messages: a good trajectory every other message, the rest cycling the hostile kinds."""
    rng = random.Random(seed)
    codec = TrajectoryCodec()
    fleet = SyntheticFleet(seed=seed, group_size=8)
    good = iter(fleet.trajectories(n))
    spare = SyntheticFleet(seed=seed + 1, group_size=1).trajectories(n)
    kinds = [k for k in EXPECTED if k != "good"]
    pending: list[dict] = []
    for i in range(n):
        if i % 2 == 0:
            if not pending:
                pending = [next(good) for _ in range(8)]  # one whole group, in order
            r = pending.pop(0)
            if r["task_type"] == "code":
                r = {**_precomputed(r), "precomputed_reward": float(r["metadata"]["synthetic_score"])}
            yield r["group_id"].encode(), codec.encode(r), "good"
            continue
        kind = kinds[(i // 2) % len(kinds)]
        base = _solo(next(spare))
        key = base["group_id"].encode()
        if kind == "garbage":
            yield key, rng.randbytes(rng.randint(0, 3000)), kind
        elif kind == "truncated":
            whole = codec.encode(base)
            yield key, whole[: rng.randint(HEADER_SIZE, len(whole) - 1)], kind
        elif kind == "unknown_schema":
            yield key, MAGIC + rng.randbytes(8) + codec.encode(base)[HEADER_SIZE:], kind
        elif kind in ("nan_reward", "inf_reward"):
            reward = math.nan if kind == "nan_reward" else -math.inf
            yield key, codec.encode({**_precomputed(base), "precomputed_reward": reward}), kind
        elif kind == "nan_logprob":
            logprobs = bytearray(base["response_logprobs"])
            logprobs[0:4] = b"\x00\x00\xc0\x7f"  # float32 NaN
            yield key, codec.encode({**base, "response_logprobs": bytes(logprobs)}), kind
        elif kind == "count_mismatch":
            yield key, codec.encode({**base, "response_logprobs": base["response_logprobs"][:-4]}), kind
        elif kind == "length_2_31":
            # trajectory_id declares 2**31 bytes; the message holds a few
            yield key, codec.encode(base)[:HEADER_SIZE] + zigzag(2**31) + b"abc", kind
        elif kind == "map_count_2_31":
            whole = codec.encode({**base, "metadata": {}})
            # the metadata map is the last field: its block count (0) is the last byte
            yield key, whole[:-1] + zigzag(2**31) + b"\x02k\x02v", kind
        elif kind == "invalid_utf8":
            whole = codec.encode({**base, "worker_id": "w" * 8})
            yield key, whole.replace(b"w" * 8, b"\xff\xfe\xfd\xfc\xc3\x28\xa0\xa1", 1), kind
        elif kind == "huge_map":
            meta = {f"k{j}": "v" * 8 for j in range(20_000)}
            yield key, codec.encode({**_precomputed(base), "precomputed_reward": 0.5, "metadata": meta}), kind
        elif kind == "deep_json":
            text = "[" * 100_000 + "]" * 100_000
            yield key, codec.encode({**base, "response_text": text}), kind
