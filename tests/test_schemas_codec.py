"""The contract: single-object encoding, schema resolution both ways, clear errors."""

from __future__ import annotations

import copy
import io
import json
import struct
from datetime import UTC, datetime
from typing import Any

import fastavro
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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
from schemas.codec import AVRO_DIR, HEADER_SIZE
from schemas.compiled_reader import Unreadable, compile_reader
from schemas.compiled_writer import Unsupported, compile_writer

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


# The compiled writer (schemas/compiled_writer.py) must write what fastavro writes, byte for byte,
# and leave every value it does not take to fastavro, so that errors stay fastavro's too.
def _fastavro(codec: TrajectoryCodec, record: Any) -> bytes | type[BaseException]:
    out = io.BytesIO()
    out.write(codec._header)
    try:
        fastavro.schemaless_writer(out, codec._reader, record)
    except Exception as exc:
        return type(exc)
    return out.getvalue()


def _ours(codec: TrajectoryCodec, record: Any) -> bytes | type[BaseException]:
    try:
        return codec.encode(record)
    except EncodeError:
        return EncodeError


def _same_as_fastavro(codec: TrajectoryCodec, record: Any) -> None:
    expected = _fastavro(codec, record)
    got = _ours(codec, record)
    if isinstance(expected, bytes):
        assert got == expected
    else:
        assert got is EncodeError, f"fastavro refused it ({expected.__name__}), ours wrote {got!r}"


def test_the_shipped_schemas_compile_and_fleet_records_take_the_compiled_path() -> None:
    from producers import SyntheticFleet

    for schema in (None, AVRO_DIR / "history" / "trajectory-v1.avsc", _evolved_schema()):
        codec = TrajectoryCodec(schema)
        assert codec._compiled is not None
    codec = TrajectoryCodec()
    assert codec._compiled is not None
    records = list(SyntheticFleet(5).trajectories(600))
    assert {r["task_type"] for r in records} >= {"math", "code", "extraction"}
    for record in records:
        written = codec._compiled(record)  # raises if it would fall back to fastavro
        assert written == _fastavro(codec, record)


def _edge_records(*, reward: float) -> list[dict[str, Any]]:
    """Records at the contract's limits (int and long ranges, large and empty values, old dates)."""
    spans = [
        {"start": 0, "end": 70_000, "version": -(2**63)},
        {"start": 70_000, "end": 2**31 - 1, "version": 2**63 - 1},
    ]
    return [
        _record(),
        _record(sample_index=-(2**31), group_size=2**31 - 1, policy_version=2**63 - 1),
        _record(policy_version=-(2**63), attempt=63, task_id="t" * 9_000, response_text="é🙂" * 5_000),
        _record(prompt_tokens=b"\x01" * 1_000_000, gold_fields={"a": "", "ü": "x" * 20_000}, metadata={}),
        _record(precomputed_reward=reward, loss_mask=b"", version_spans=spans, logprob_mode="raw"),
        _record(
            precomputed_reward=-0.0,
            version_spans=[],
            gold_fields={},
            metadata={str(i): "v" for i in range(300)},
        ),
        _record(created_at=0, expected_answer=None),
        _record(created_at=-1_764_504_000_123),
        _record(created_at=datetime(1969, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC)),
    ]


def test_the_compiled_writer_matches_fastavro_at_the_edges() -> None:
    codec = TrajectoryCodec()
    edges = [
        *_edge_records(reward=float("nan")),
        _record(created_at=datetime(2026, 1, 2, 3, 4, 5, 678_901)),  # naive: fastavro's local time
        {k: v for k, v in _record().items() if k not in ("response_text", "metadata", "expected_answer")},
    ]
    for record in edges:
        assert codec._compiled(record) == _fastavro(codec, record)


def test_the_compiled_writer_matches_fastavro_at_varint_width_boundaries() -> None:
    """Each width of varint, the table's edge (2**14) and a timestamp's three 14-bit groups."""
    codec = TrajectoryCodec()
    for bits in range(6, 63, 7):
        for zigzagged in (2**bits - 1, 2**bits, 2**bits + 1, 2 ** (bits + 1) - 1):
            value = (zigzagged >> 1) ^ -(zigzagged & 1)
            for record in (
                _record(created_at=value, policy_version=value),
                _record(created_at=-value, policy_version=-value, task_id="t" * min(zigzagged >> 1, 20_000)),
            ):
                assert codec._compiled(record) == _fastavro(codec, record)


@pytest.mark.parametrize(
    "change",
    [
        {"sample_index": True},  # a bool where an int goes
        {"sample_index": 2**31},  # beyond int
        {"policy_version": 2**63},  # beyond long
        {"precomputed_reward": 1},  # an int where a double goes
        {"prompt_tokens": bytearray(b"\x01\x00\x00\x00")},
        {"prompt_tokens": memoryview(b"\x01\x00\x00\x00")},
        {"domain": "bad \ud800 surrogate"},
        {"metadata": {"k": 1}},
        {"metadata": {1: "v"}},
        {"gold_fields": [("a", "b")]},
        {"version_spans": [{"start": 0, "end": 1}]},
        {"version_spans": ({"start": 0, "end": 1, "version": 2},)},
        {"version_spans": [{"start": 0, "end": 1, "version": 2, "-type": "Other"}]},
        {"created_at": 1.5},
        {"created_at": "2026-01-01"},
        {"trajectory_id": None},
        {"sample_index": "three"},
    ],
)
def test_values_the_compiled_writer_does_not_take_are_fastavros_to_write_or_refuse(change: dict) -> None:
    codec = TrajectoryCodec()
    record = _record(**change)
    with pytest.raises((Unsupported, KeyError, UnicodeEncodeError)):
        codec._compiled(record)
    _same_as_fastavro(codec, record)


def test_a_missing_field_without_default_is_fastavros_error() -> None:
    codec = TrajectoryCodec()
    record = {k: v for k, v in _record().items() if k != "worker_id"}
    with pytest.raises(EncodeError, match="worker_id"):
        codec.encode(record)
    assert _fastavro(codec, record) is ValueError


def test_a_schema_with_types_it_does_not_cover_is_written_by_fastavro() -> None:
    schema = _evolved_schema()
    schema["fields"].append({"name": "flag", "type": "boolean", "default": False})
    codec = TrajectoryCodec(schema)
    assert codec._compiled is None
    assert codec.decode(codec.encode(_record(flag=True)))["flag"] is True
    for unsupported in (
        {"type": "enum", "name": "E", "symbols": ["A"]},
        ["string", "null"],
        ["null", "string", "long"],
        {"type": "fixed", "name": "F", "size": 2},
        {"type": "int", "logicalType": "date"},
        "float",
    ):
        parsed = fastavro.parse_schema(
            {"type": "record", "name": "R", "fields": [{"name": "x", "type": unsupported}]}, named_schemas={}
        )
        assert compile_writer(parsed) is None, unsupported


_text = st.text(max_size=40)
_odd_ints = st.one_of(st.integers(-(2**64), 2**64), st.booleans())  # beyond int or long, or bools
_ints = st.integers(0, 9).flatmap(lambda k: _odd_ints if k == 0 else st.integers(-(2**31), 2**31 - 1))
_span = st.fixed_dictionaries({"start": _ints, "end": _ints, "version": _ints})
_CODEC = TrajectoryCodec()


@st.composite
def _records(draw: st.DrawFn) -> dict[str, Any]:
    record = _record(
        trajectory_id=draw(_text),
        sample_index=draw(_ints),
        policy_version=draw(_ints),
        prompt_tokens=draw(st.binary(max_size=300)),
        response_text=draw(_text),
        expected_answer=draw(st.one_of(st.none(), _text)),
        gold_fields=draw(st.one_of(st.none(), st.dictionaries(_text, _text, max_size=4))),
        # NaN never equals itself, so the records could not be compared: test_a_nan_reward_reads_as_nan
        precomputed_reward=draw(st.one_of(st.none(), st.floats(allow_nan=False), st.integers(-5, 5))),
        task_id=draw(st.one_of(st.none(), _text)),
        attempt=draw(_ints),
        loss_mask=draw(st.one_of(st.none(), st.binary(max_size=20))),
        version_spans=draw(st.one_of(st.none(), st.lists(_span, max_size=3))),
        created_at=draw(
            st.one_of(
                st.integers(-(2**62), 2**62),
                st.datetimes(timezones=st.just(UTC)),
                st.datetimes(min_value=datetime(1971, 1, 1), max_value=datetime(2100, 1, 1)),
            )
        ),
        metadata=draw(st.dictionaries(_text, _text, max_size=4)),
    )
    for name in draw(st.lists(st.sampled_from(sorted(record)), max_size=3, unique=True)):
        del record[name]
    return record


@settings(max_examples=400, deadline=None)
@given(_records())
def test_the_compiled_writer_and_fastavro_agree_on_any_record(record: dict[str, Any]) -> None:
    _same_as_fastavro(_CODEC, record)


# The compiled reader (schemas/compiled_reader.py) must read what fastavro reads, and leave every
# body it does not read to fastavro, so that errors stay fastavro's too.
def _fastavro_read(codec: TrajectoryCodec, message: bytes) -> Any:
    body = io.BytesIO(message)
    body.seek(HEADER_SIZE)
    try:
        record = fastavro.schemaless_reader(body, codec._reader, None)
    except Exception:
        return DecodeError
    return DecodeError if body.tell() != len(message) else record


def _ours_read(codec: TrajectoryCodec, message: bytes) -> Any:
    try:
        return codec.decode(message)
    except DecodeError:
        return DecodeError


def _reads_as_fastavro(codec: TrajectoryCodec, message: bytes) -> None:
    expected = _fastavro_read(codec, message)
    assert _ours_read(codec, message) == expected
    if expected is not DecodeError:
        assert codec._compiled_read is not None
        record, end = codec._compiled_read(message, HEADER_SIZE)  # raises if it would fall back
        assert (record, end) == (expected, len(message))
        assert list(record) == list(expected)  # the fields in the schema's order


def test_fleet_messages_take_the_compiled_reader() -> None:
    from producers import SyntheticFleet

    codec = TrajectoryCodec()
    for record in SyntheticFleet(6).trajectories(600):
        _reads_as_fastavro(codec, codec.encode(record))


def test_the_compiled_reader_matches_fastavro_at_the_edges() -> None:
    codec = TrajectoryCodec()
    for record in _edge_records(reward=float("inf")):  # NaN would not compare equal when read back
        _reads_as_fastavro(codec, codec.encode(record))


def test_the_compiled_reader_matches_fastavro_at_varint_width_boundaries() -> None:
    codec = TrajectoryCodec()
    for value in (63, 64, -64, -65, 8191, -8192, 8192, -8193, 2**20):
        _reads_as_fastavro(codec, codec.encode(_record(sample_index=value, policy_version=value)))
    for length in (63, 64, 4095, 4096):
        _reads_as_fastavro(codec, codec.encode(_record(task_id="t" * length, response_text="r" * length)))


def test_a_nan_reward_reads_as_nan() -> None:
    codec = TrajectoryCodec()
    record, _ = codec._compiled_read(codec.encode(_record(precomputed_reward=float("nan"))), HEADER_SIZE)
    assert record["precomputed_reward"] != record["precomputed_reward"]


def _corrupt(message: bytes, at: int, new: bytes) -> bytes:
    return message[:at] + new + message[at + 1 :]


def test_bodies_the_compiled_reader_does_not_read_are_fastavros_to_read_or_refuse() -> None:
    codec = TrajectoryCodec()
    message = codec.encode(_record(expected_answer="2", metadata={"k": "v"}))
    assert codec._compiled_read is not None
    start = HEADER_SIZE + 1 + len("9f0c7c1e-0000-4000-8000-000000000001")  # past trajectory_id
    union = message.index(b"\x02\x02" + b"2")  # expected_answer: branch 1, the string "2"
    bodies = [
        message[:-7],  # truncated
        message[: HEADER_SIZE + 3],
        _corrupt(message, HEADER_SIZE, b"\x03"),  # trajectory_id of length -2
        _corrupt(message, start, b"\xff"),  # a varint running on into the next bytes
        _corrupt(message, union, b"\x04"),  # union index 2
        _corrupt(message, union, b"\x01"),  # union index -1
        message[:HEADER_SIZE] + b"\xff" * 11 + message[HEADER_SIZE + 11 :],  # a varint of 11 bytes
        _corrupt(message, HEADER_SIZE + 1, b"\xc3"),  # invalid UTF-8
    ]
    for body in bodies:
        with pytest.raises((Unreadable, IndexError, UnicodeDecodeError, struct.error)):
            codec._compiled_read(body, HEADER_SIZE)
        assert _ours_read(codec, body) == _fastavro_read(codec, body)


def test_a_map_in_several_blocks_and_a_negative_block_count_are_read() -> None:
    codec = TrajectoryCodec()
    message = codec.encode(_record(metadata={}))
    assert message.endswith(b"\x00")
    # metadata as two blocks of one entry each, the second with a negative count and its byte size
    blocks = b"\x02\x02a\x02b" + b"\x01\x08\x02c\x02d" + b"\x00"
    decoded = codec.decode(message[:-1] + blocks)
    assert decoded["metadata"] == {"a": "b", "c": "d"}


def test_a_schema_with_types_it_does_not_cover_is_read_by_fastavro() -> None:
    schema = _evolved_schema()
    schema["fields"].append({"name": "flag", "type": "boolean", "default": False})
    codec = TrajectoryCodec(schema)
    assert codec._compiled_read is None
    assert codec.decode(codec.encode(_record(flag=True)))["flag"] is True
    for unsupported in (
        {"type": "enum", "name": "E", "symbols": ["A"]},
        ["string", "null"],
        ["null", "string", "long"],
        {"type": "fixed", "name": "F", "size": 2},
        {"type": "int", "logicalType": "date"},
        "float",
    ):
        parsed = fastavro.parse_schema(
            {"type": "record", "name": "R", "fields": [{"name": "x", "type": unsupported}]}, named_schemas={}
        )
        assert compile_reader(parsed) is None, unsupported


def test_older_writers_are_resolved_by_fastavro() -> None:
    codec = TrajectoryCodec()
    old = TrajectoryCodec(AVRO_DIR / "history" / "trajectory-v1.avsc")
    decoded = codec.decode(old.encode(_record()))
    assert decoded["attempt"] == 0 and decoded["task_id"] is None


@settings(max_examples=400, deadline=None)
@given(_records())
def test_the_compiled_reader_and_fastavro_agree_on_any_message(record: dict[str, Any]) -> None:
    try:
        message = _CODEC.encode(record)
    except EncodeError:
        return
    _reads_as_fastavro(_CODEC, message)
