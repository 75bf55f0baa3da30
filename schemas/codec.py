"""Avro single-object encoding of trajectories, with writer-to-reader schema resolution.

Every message is ``C3 01`` + the writer schema's 64-bit CRC-64-AVRO fingerprint (little-endian)
+ the Avro binary body. A reader resolves any writer schema it knows (older or newer) to its own
reader schema, so producers and processors can upgrade independently without a registry server.
See WIRE_FORMAT.md beside this file.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import fastavro
from fastavro.schema import fingerprint as _fingerprint
from fastavro.schema import to_parsing_canonical_form

from schemas.compiled_reader import compile_reader
from schemas.compiled_writer import compile_writer
from schemas.exceptions import DecodeError, EncodeError, SchemaError, UnknownSchemaError

MAGIC = b"\xc3\x01"
HEADER_SIZE = len(MAGIC) + 8
AVRO_DIR = Path(__file__).with_name("avro")
TRAJECTORY_SCHEMA_PATH = AVRO_DIR / "trajectory.avsc"

SchemaLike = Mapping[str, Any] | str | Path


def load_schema(source: SchemaLike) -> Any:
    """Read a schema (record, or any Avro type) from a path, a JSON string or a mapping, unparsed."""
    if isinstance(source, Path):
        try:
            return json.loads(source.read_text())
        except (OSError, ValueError) as exc:
            raise SchemaError(f"cannot read Avro schema {source}: {exc}") from exc
    if isinstance(source, str):
        try:
            return json.loads(source)
        except ValueError as exc:
            raise SchemaError(f"Avro schema is not valid JSON: {exc}") from exc
    return dict(source)


def _parse(schema: Any) -> Any:
    try:
        # A fresh name registry per schema: two versions of one record name must not collide.
        return fastavro.parse_schema(schema, named_schemas={})
    except Exception as exc:
        raise SchemaError(f"invalid Avro schema: {exc}") from exc


def record_name(schema: Any) -> str:
    """The full name (``namespace.name``) of an unparsed record schema; "" for other types."""
    if not isinstance(schema, Mapping) or not isinstance(schema.get("name"), str):
        return ""
    name, namespace = schema["name"], schema.get("namespace")
    return name if "." in name or not namespace else f"{namespace}.{name}"


def fingerprint_of(schema: SchemaLike) -> bytes:
    """The 8 wire bytes naming a schema: CRC-64-AVRO of its parsing canonical form, little-endian."""
    canonical = to_parsing_canonical_form(_parse(load_schema(schema)))
    return bytes.fromhex(_fingerprint(canonical, "CRC-64-AVRO"))


class TrajectoryCodec:
    """Encodes with the reader schema; decodes any known writer schema into the reader schema.

    Args:
        reader_schema: the schema this process works in; default the shipped trajectory.avsc.
        writer_schemas: further schemas whose messages may arrive (older or newer versions).
            Every .avsc under ``schemas/avro/`` naming the reader's record is known too.
    """

    def __init__(
        self,
        reader_schema: SchemaLike | None = None,
        *,
        writer_schemas: Iterable[SchemaLike] = (),
    ) -> None:
        raw = load_schema(reader_schema if reader_schema is not None else TRAJECTORY_SCHEMA_PATH)
        self._reader = _parse(raw)
        self._fingerprint = fingerprint_of(raw)
        self._header = MAGIC + self._fingerprint
        self._compiled = compile_writer(self._reader, self._header)
        self._compiled_read = compile_reader(self._reader)
        self._writers: dict[bytes, Any] = {self._fingerprint: self._reader}
        for path in sorted(AVRO_DIR.rglob("*.avsc")):
            shipped = load_schema(path)
            if record_name(shipped) == record_name(raw):
                self.register(shipped)
        for schema in writer_schemas:
            self.register(schema)

    @property
    def fingerprint(self) -> int:
        """The reader schema's 64-bit fingerprint, as an unsigned integer."""
        return int.from_bytes(self._fingerprint, "little")

    @property
    def known_fingerprints(self) -> frozenset[int]:
        """Fingerprints of every writer schema this codec can decode."""
        return frozenset(int.from_bytes(fp, "little") for fp in self._writers)

    def register(self, schema: SchemaLike) -> int:
        """Make messages written with `schema` decodable; returns its fingerprint."""
        raw = load_schema(schema)
        fp = fingerprint_of(raw)
        self._writers.setdefault(fp, _parse(raw))
        return int.from_bytes(fp, "little")

    def encode(self, record: Mapping[str, Any]) -> bytes:
        """Encode one record with the reader schema as the writer schema.

        The schema's compiled writer (schemas/compiled_writer.py) writes the records it takes;
        fastavro writes, or refuses, any other, so both the bytes and the errors are fastavro's.
        """
        if self._compiled is not None:
            try:
                return self._compiled(record)
            except Exception:  # a value it does not take: fastavro writes it or says what is wrong
                pass
        out = io.BytesIO()
        out.write(self._header)
        try:
            fastavro.schemaless_writer(out, self._reader, record)
        except (ValueError, TypeError, KeyError, AttributeError, OverflowError) as exc:
            name = record.get("trajectory_id", "?") if isinstance(record, Mapping) else "?"
            raise EncodeError(
                f"trajectory {name!r} does not fit schema dev.rollstream.Trajectory: {exc!r}; "
                "check field names and types against schemas/avro/trajectory.avsc"
            ) from exc
        return out.getvalue()

    def decode(self, data: bytes) -> dict[str, Any]:
        """Decode one message into a record shaped by the reader schema.

        A message written with the reader schema is read by its compiled reader
        (schemas/compiled_reader.py); fastavro reads, or refuses, any other, and any message the
        compiled reader does not read, so both the records and the errors are fastavro's.
        """
        if len(data) < HEADER_SIZE or data[:2] != MAGIC:
            raise DecodeError(
                f"not an Avro single-object message: expected marker C3 01 and an 8-byte "
                f"fingerprint, got {len(data)} bytes starting {data[:10].hex() or 'nothing'}"
            )
        fp = data[2:HEADER_SIZE]
        writer = self._writers.get(fp)
        if writer is None:
            raise UnknownSchemaError(
                f"message names writer schema fingerprint {fp.hex()} (little-endian), which this "
                "codec does not know: register the producer's schema (TrajectoryCodec.register) "
                "or ship its .avsc under schemas/avro/"
            )
        if writer is self._reader and self._compiled_read is not None:
            try:
                record, end = self._compiled_read(data, HEADER_SIZE)
            except Exception:  # bytes it does not read: fastavro reads them or says what is wrong
                pass
            else:
                _check_end(data, end)
                return record
        body = io.BytesIO(data)
        body.seek(HEADER_SIZE)
        reader = None if writer is self._reader else self._reader
        try:
            decoded = fastavro.schemaless_reader(body, writer, reader)
        except Exception as exc:
            raise DecodeError(f"Avro body does not decode with writer schema {fp.hex()}: {exc!r}") from exc
        _check_end(data, body.tell())
        if not isinstance(decoded, dict):
            raise DecodeError(f"expected a record, decoded {type(decoded).__name__}")
        return decoded


def _check_end(data: bytes, end: int) -> None:
    """Raise DecodeError when the Avro body ended before the message did."""
    if end != len(data):
        raise DecodeError(
            f"{len(data) - end} trailing bytes after the Avro body: the message is "
            "corrupt or was written with a different schema than it names"
        )


class RecordCodec:
    """Single-object encoding of one record type by its shipped schema; a base for small records.

    Every .avsc under ``schemas/avro/`` naming the same record is a known writer schema, and so is
    each of `writer_schemas`; a message is resolved from its writer schema to the shipped one.

    Args:
        schema_path: the shipped (reader) schema.
        writer_schemas: further schemas of the same record whose messages may arrive.
    """

    def __init__(self, schema_path: Path, *, writer_schemas: Iterable[SchemaLike] = ()) -> None:
        raw = load_schema(schema_path)
        self.name = record_name(raw)
        self._reader = _parse(raw)
        self._header = MAGIC + fingerprint_of(raw)
        self._writers: dict[bytes, Any] = {self._header[2:]: self._reader}
        shipped = (load_schema(path) for path in sorted(AVRO_DIR.rglob("*.avsc")))
        for schema in [*(s for s in shipped if record_name(s) == self.name), *writer_schemas]:
            self._writers.setdefault(fingerprint_of(schema), _parse(load_schema(schema)))

    @property
    def fingerprint(self) -> int:
        """The reader schema's 64-bit fingerprint, as an unsigned integer."""
        return int.from_bytes(self._header[2:], "little")

    def encode_fields(self, fields: Mapping[str, Any], what: str) -> bytes:
        """One message of `fields`: marker, fingerprint, Avro body; `what` names the record in errors."""
        out = io.BytesIO()
        out.write(self._header)
        try:
            fastavro.schemaless_writer(out, self._reader, fields)
        except (ValueError, TypeError, KeyError, AttributeError, OverflowError) as exc:
            raise EncodeError(f"{what} does not fit {self.name}: {exc!r}") from exc
        return out.getvalue()

    def decode_fields(self, data: bytes) -> dict[str, Any]:
        """The fields of one message, resolved from its writer schema to ours.

        Raises:
            UnknownSchemaError: the message names a writer schema this codec does not know.
            DecodeError: the bytes are not a single-object message of this record.
        """
        if len(data) < HEADER_SIZE or data[:2] != MAGIC:
            raise DecodeError(
                f"not an Avro single-object message: expected marker C3 01 and an 8-byte fingerprint, "
                f"got {len(data)} bytes starting {data[:10].hex() or 'nothing'}"
            )
        writer = self._writers.get(data[2:HEADER_SIZE])
        if writer is None:
            raise UnknownSchemaError(
                f"message names writer schema fingerprint {data[2:HEADER_SIZE].hex()} (little-endian), "
                f"which is no {self.name} this codec knows: ship its .avsc under schemas/avro/ or pass "
                "it in writer_schemas"
            )
        body = io.BytesIO(data)
        body.seek(HEADER_SIZE)
        try:
            fields = fastavro.schemaless_reader(
                body, writer, None if writer is self._reader else self._reader
            )
        except Exception as exc:
            raise DecodeError(f"{self.name} body does not decode: {exc!r}") from exc
        if body.tell() != len(data) or not isinstance(fields, dict):
            raise DecodeError(f"{len(data) - body.tell()} trailing bytes after the {self.name} body")
        return fields
