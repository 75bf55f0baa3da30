"""Decode speed of the Trajectory codec (packed token buffers) against Avro arrays of numbers.

The baseline is the same record with token ids and logprobs as Avro `array<int>` / `array<float>`,
decoded by fastavro (its C extension, schema parsed once, schemaless reader: the fastest way it
reads) into numpy in the same run. Rounds alternate (bench/rounds.py); ratio = the median of our
decodes per second / the baseline's (higher is better).

    python bench/codec.py [--prompt 1024] [--response 3072] [--repeats 2000] [--rounds 3] [--json]
"""

from __future__ import annotations

import argparse
import copy
import io
import json
import time
from datetime import UTC, datetime
from typing import Any

import fastavro
import numpy as np
from rounds import alternate, emit, load_average, summary, timed

from schemas import (
    TRAJECTORY_SCHEMA_PATH,
    TrajectoryCodec,
    pack_float32,
    pack_int32,
    unpack_float32,
    unpack_int32,
)


def _array_schema() -> Any:
    schema = json.loads(TRAJECTORY_SCHEMA_PATH.read_text())
    schema = copy.deepcopy(schema)
    kinds = {"prompt_tokens": "int", "response_tokens": "int", "response_logprobs": "float"}
    for f in schema["fields"]:
        if f["name"] in kinds:
            f["type"] = {"type": "array", "items": kinds[f["name"]]}
            f.pop("packed", None)
    return fastavro.parse_schema(schema, named_schemas={})


def _time(fn: Any, repeats: int) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--prompt", type=int, default=1024, help="prompt tokens")
    parser.add_argument("--response", type=int, default=3072, help="response tokens")
    parser.add_argument("--repeats", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    prompt = rng.integers(0, 32_000, args.prompt, dtype=np.int32)
    response = rng.integers(0, 32_000, args.response, dtype=np.int32)
    logprobs = -rng.exponential(1.0, args.response).astype(np.float32)
    base: dict[str, Any] = {
        "trajectory_id": "t", "group_id": "g", "sample_index": 0, "group_size": 8,
        "domain": "math/algebra-000", "task_type": "math", "policy_version": 1,
        "response_text": "Answer: 4", "finish_reason": "stop", "expected_answer": "4",
        "worker_id": "w", "created_at": datetime.now(UTC),
    }  # fmt: skip

    codec = TrajectoryCodec()
    packed = codec.encode(
        {**base, "prompt_tokens": pack_int32(prompt), "response_tokens": pack_int32(response),
         "response_logprobs": pack_float32(logprobs)}
    )  # fmt: skip

    def ours() -> None:
        record = codec.decode(packed)
        unpack_int32(record["response_tokens"])
        unpack_float32(record["response_logprobs"])

    array_schema = _array_schema()
    buf = io.BytesIO()
    fastavro.schemaless_writer(
        buf, array_schema,
        {**base, "prompt_tokens": prompt.tolist(), "response_tokens": response.tolist(),
         "response_logprobs": logprobs.tolist()},
    )  # fmt: skip
    arrays = buf.getvalue()

    def baseline() -> None:
        record: Any = fastavro.schemaless_reader(io.BytesIO(arrays), array_schema, None)
        np.asarray(record["response_tokens"], dtype=np.int32)
        np.asarray(record["response_logprobs"], dtype=np.float32)

    baseline_repeats = max(20, args.repeats // 50)
    load_before = load_average()

    def side(fn: Any, repeats: int) -> Any:
        return lambda index: timed(lambda: (_time(fn, repeats), repeats)[1])

    samples = alternate(
        ("ours", side(ours, args.repeats)), [("baseline", side(baseline, baseline_repeats))], args.rounds
    )
    result = summary(samples, "ours", load_before, unit="decodes")
    result.update(
        ours_decode_us=round(1e6 / result["ours_per_s"], 2),
        baseline_decode_us=round(1e6 / result["baseline_per_s"], 2),
        ours_message_bytes=len(packed),
        baseline_message_bytes=len(arrays),
        tokens=args.prompt + args.response,
    )
    emit(
        result,
        args.json,
        lambda r: (
            f"packed codec: {r['ours_decode_us']:.1f} us per trajectory\n"
            f"Avro arrays:  {r['baseline_decode_us']:.1f} us per trajectory\n"
            f"ratio (median of {r['rounds']} rounds): {r['ratio']:.1f}x ({r['ratio_min']:.1f} to {r['ratio_max']:.1f})"
        ),
    )


if __name__ == "__main__":
    main()
