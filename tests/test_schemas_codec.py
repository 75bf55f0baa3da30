"""The contract: single-object encoding, schema resolution both ways, clear errors."""

from __future__ import annotations

import copy
import json
import struct
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pytest

from schemas import (
    TRAJECTORY_SCHEMA_PATH,
    DecodeError,
    EncodeError,
    TrajectoryCodec,
    UnknownSchemaError,
    fingerprint_of,
    pack_float32,
    pack_int32,
    pack_mask,
    unpack_float32,
    unpack_int32,
    unpack_mask,
)
from schemas.codec import AVRO_DIR

# Pinned so that an accidental schema change (which changes every message header) fails loudly.
TRAJECTORY_FINGERPRINT = 0x4F390D3FCADA587F
TRAJECTORY_V1_FINGERPRINT = 0xCCB6718F0F408DAE  # schemas/avro/history/trajectory-v1.avsc


def _record(**overrides: Any) -> dict[str, Any]:
    record: dict[str, Any] = {
        "trajectory_id": "9f0c7c1e-0000-4000-8000-000000000001",
        "group_id": "group-1",
        "sample_index": 3,
        "group_size": 8,
        "domain": "math/algebra-001",
        "task_type": "math",
        "policy_version": 7,
        "prompt_tokens": pack_int32([1, 2, 3, 70000]),
        "response_tokens": pack_int32([5, 6]),
        "response_logprobs": pack_float32([-0.5, -1.25]),
        "response_text": "x = 2\nAnswer: 2",
        "finish_reason": "stop",
        "expected_answer": "2",
        "worker_id": "worker-0",
        "created_at": datetime(2026, 11, 30, 12, 0, 0, 123000, tzinfo=UTC),
        "metadata": {"seed": "1"},
    }
    record.update(overrides)
    return record


def _evolved_schema() -> dict[str, Any]:
    schema = json.loads(TRAJECTORY_SCHEMA_PATH.read_text())
    schema = copy.deepcopy(schema)
    schema["fields"].append({"name": "temperature", "type": "double", "default": 1.0})
    return schema


def test_round_trip_keeps_every_field() -> None:
    codec = TrajectoryCodec()
    record = _record()
    decoded = codec.decode(codec.encode(record))
    assert decoded["trajectory_id"] == record["trajectory_id"]
    assert decoded["created_at"] == record["created_at"]
    assert decoded["gold_fields"] is None and decoded["precomputed_reward"] is None
    assert decoded["metadata"] == {"seed": "1"}
    assert unpack_int32(decoded["prompt_tokens"]).tolist() == [1, 2, 3, 70000]
    assert unpack_float32(decoded["response_logprobs"]).tolist() == [-0.5, -1.25]


def test_header_is_marker_and_little_endian_fingerprint() -> None:
    codec = TrajectoryCodec()
    message = codec.encode(_record())
    assert message[:2] == b"\xc3\x01"
    assert int.from_bytes(message[2:10], "little") == codec.fingerprint == TRAJECTORY_FINGERPRINT


def test_a_v1_message_decodes_with_the_new_fields_at_their_defaults() -> None:
    v1 = TrajectoryCodec(AVRO_DIR / "history" / "trajectory-v1.avsc")
    assert v1.fingerprint == TRAJECTORY_V1_FINGERPRINT
    decoded = TrajectoryCodec().decode(v1.encode(_record()))
    assert decoded["task_id"] is None and decoded["attempt"] == 0 and decoded["loss_mask"] is None
    assert decoded["version_spans"] is None and decoded["logprob_mode"] is None
    assert unpack_int32(decoded["prompt_tokens"]).tolist() == [1, 2, 3, 70000]


def test_task_fields_mask_and_spans_round_trip() -> None:
    codec = TrajectoryCodec()
    spans = [{"start": 0, "end": 1, "version": 3}, {"start": 1, "end": 2, "version": 4}]
    record = {**_record(), "task_id": "t-1", "attempt": 2, "loss_mask": pack_mask([1, 0])}
    decoded = codec.decode(codec.encode({**record, "version_spans": spans, "logprob_mode": "processed"}))
    assert (decoded["task_id"], decoded["attempt"], decoded["logprob_mode"]) == ("t-1", 2, "processed")
    assert unpack_mask(decoded["loss_mask"]).tolist() == [True, False] and decoded["version_spans"] == spans
    with pytest.raises(DecodeError, match="other than 0 or 1"):
        unpack_mask(b"\x00\x02")


def test_fingerprint_matches_avro_specification_vector() -> None:
    # SchemaNormalization.parsingFingerprint64 of "null" in Avro Java is 0x63dd24e7cc258f8a.
    assert fingerprint_of('"null"') == (0x63DD24E7CC258F8A).to_bytes(8, "little")


def test_newer_writer_reads_with_older_reader() -> None:
    new = TrajectoryCodec(_evolved_schema())
    old = TrajectoryCodec(writer_schemas=[_evolved_schema()])
    decoded = old.decode(new.encode(_record(temperature=0.7)))
    assert "temperature" not in decoded
    assert decoded["domain"] == "math/algebra-001"


def test_older_writer_reads_with_newer_reader_taking_the_default() -> None:
    new = TrajectoryCodec(_evolved_schema())
    decoded = new.decode(TrajectoryCodec().encode(_record()))
    assert decoded["temperature"] == 1.0
    assert new.fingerprint != TrajectoryCodec().fingerprint


def test_unknown_fingerprint_is_a_clear_error() -> None:
    message = TrajectoryCodec(_evolved_schema()).encode(_record())
    with pytest.raises(UnknownSchemaError, match="does not know"):
        TrajectoryCodec().decode(message)


@pytest.mark.parametrize(
    "data",
    [b"", b"garbage", b'{"trajectory_id": "x"}', b"\xc3\x01" + b"\x00" * 4],
)
def test_bytes_that_are_no_message_are_rejected(data: bytes) -> None:
    with pytest.raises(DecodeError, match="single-object"):
        TrajectoryCodec().decode(data)


def test_truncated_and_padded_bodies_are_rejected() -> None:
    codec = TrajectoryCodec()
    message = codec.encode(_record())
    with pytest.raises(DecodeError):
        codec.decode(message[:-7])
    with pytest.raises(DecodeError, match="trailing bytes"):
        codec.decode(message + b"\x00\x00")


def test_record_of_wrong_shape_is_an_encode_error() -> None:
    with pytest.raises(EncodeError, match="trajectory"):
        TrajectoryCodec().encode(_record(sample_index="three"))


def test_packed_buffer_of_odd_size_is_rejected() -> None:
    with pytest.raises(DecodeError, match="multiple of 4"):
        unpack_int32(b"\x01\x02\x03")


def test_unpack_is_zero_copy_little_endian() -> None:
    data = pack_int32(np.array([1, -2], dtype=np.int64))
    assert data == struct.pack("<ii", 1, -2)
    view = unpack_int32(data)
    assert not view.flags.owndata and view.dtype.str == "<i4"


# An independent encoder written from WIRE_FORMAT.md alone, as a producer in another language
# would: it shares no code with fastavro, so agreement proves the page is enough.
def _zigzag(n: int) -> bytes:
    n = (n << 1) ^ (n >> 63)
    out = bytearray()
    while n & ~0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _string(s: str | bytes) -> bytes:
    raw = s.encode() if isinstance(s, str) else s
    return _zigzag(len(raw)) + raw


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_message_written_from_the_wire_format_page_decodes(version: str) -> None:
    task_fields = [
        b"\x02" + _string("task-9"),  # task_id
        _zigzag(1),  # attempt
        b"\x00",  # loss_mask: null
        b"\x02" + _zigzag(1) + _zigzag(0) + _zigzag(2) + _zigzag(7) + b"\x00",  # version_spans
        b"\x02" + _string("processed"),  # logprob_mode
    ]
    body = b"".join(
        [
            _string("t-1"),
            _string("g-1"),
            _zigzag(0),
            _zigzag(4),
            _string("extraction/invoices-003"),
            _string("extraction"),
            _zigzag(12),
            _string(struct.pack("<3i", 10, 11, 12)),
            _string(struct.pack("<2i", 13, 14)),
            _string(struct.pack("<2f", -0.25, -2.0)),
            _string('{"total": "42"}'),
            _string("stop"),
            b"\x00",  # expected_answer: null
            b"\x00",  # unit_tests: null
            b"\x02" + _zigzag(1) + _string("total") + _string("42") + b"\x00",  # gold_fields
            b"\x00",  # precomputed_reward: null
            *(task_fields if version == "v2" else []),
            _string("rust-worker-1"),
            _zigzag(1_764_504_000_000),
            _zigzag(0),  # metadata: empty map
        ]
    )
    fingerprint = TRAJECTORY_FINGERPRINT if version == "v2" else TRAJECTORY_V1_FINGERPRINT
    decoded = TrajectoryCodec().decode(b"\xc3\x01" + fingerprint.to_bytes(8, "little") + body)
    assert decoded["gold_fields"] == {"total": "42"}
    assert decoded["task_id"] == ("task-9" if version == "v2" else None)
    assert decoded["version_spans"] == ([{"start": 0, "end": 2, "version": 7}] if version == "v2" else None)
    assert unpack_int32(decoded["prompt_tokens"]).tolist() == [10, 11, 12]
    assert unpack_float32(decoded["response_logprobs"]).tolist() == [-0.25, -2.0]
    assert decoded["created_at"] == datetime.fromtimestamp(1_764_504_000, tz=UTC)
