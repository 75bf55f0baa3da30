"""A record schema compiled to one Python function that reads its Avro binary body.

The counterpart of compiled_writer.py. fastavro's reader dispatches on each field's type on every
call: about 20 µs of CPU for an 8 KB fleet trajectory here, the largest part of decoding it in the
stream stage. The compiled function runs straight through the schema's fields instead, with the
one- and two-byte varints (most ints, lengths and union indexes) read inline.

It covers the types the contract uses: string, bytes, int, long, double, long timestamp-millis
(read by fastavro's own logical reader), map, array, record, and a union of null with one of
those; `compile_reader` returns None for a schema with anything else. It reads only what it can
read the way fastavro does; on anything else (a truncated body, a union index other than 0 or 1,
a negative length or block count, invalid UTF-8) it raises, and the caller decodes that message
with fastavro, so the records returned and the errors raised stay fastavro's.
tests/test_schemas_codec.py checks that the two read the same records.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from typing import Any

from fastavro.read import LOGICAL_READERS

from schemas.codegen import Source, UnsupportedSchema

Reader = Callable[[bytes, int], tuple[dict[str, Any], int]]
"""(message, position of the body) -> (record, position after it)."""


class Unreadable(Exception):
    """Bytes the compiled reader does not read: decode the message with fastavro instead."""


def long_at(data: bytes, pos: int) -> tuple[int, int]:
    """The zigzag varint at `pos` (at most 10 bytes) and the position after it."""
    shift = value = 0
    for end in range(pos, pos + 10):
        byte = data[end]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return (value >> 1) ^ -(value & 1), end + 1
        shift += 7
    raise Unreadable(f"varint longer than 10 bytes at {pos}")


def _long(src: Source, indent: int, var: str) -> None:
    """Lines reading a zigzag varint into `var`, a one- or two-byte one inline (lengths of the
    token and text fields take two bytes)."""
    src.line(indent, "b = d[p]")
    src.line(indent, "if b < 128:")
    src.line(indent + 4, f"{var} = (b >> 1) ^ -(b & 1)")
    src.line(indent + 4, "p += 1")
    src.line(indent, "elif d[p + 1] < 128:")
    src.line(indent + 4, "b = (b & 127) | (d[p + 1] << 7)")
    src.line(indent + 4, f"{var} = (b >> 1) ^ -(b & 1)")
    src.line(indent + 4, "p += 2")
    src.line(indent, "else:")
    src.line(indent + 4, f"{var}, p = long_at(d, p)")


def _value(src: Source, schema: Any, var: str, indent: int) -> None:
    """Lines reading a value of `schema` into variable `var`; raise UnsupportedSchema for other types."""
    if isinstance(schema, Mapping) and schema.get("type") == "long" and "logicalType" in schema:
        if schema["logicalType"] != "timestamp-millis":
            raise UnsupportedSchema(schema["logicalType"])
        convert = src.constant(LOGICAL_READERS["long-timestamp-millis"])
        _long(src, indent, var)
        src.line(indent, f"{var} = {convert}({var}, {src.constant(schema)}, {src.constant(schema)})")
        return
    if isinstance(schema, Mapping) and set(schema) <= {"type"} and isinstance(schema.get("type"), str):
        schema = schema["type"]
    if isinstance(schema, list):
        if len(schema) != 2 or schema[0] != "null" or schema[1] == "null" or isinstance(schema[1], list):
            raise UnsupportedSchema(schema)
        src.line(indent, "b = d[p]")
        src.line(indent, "p += 1")
        src.line(indent, "if b == 0:")
        src.line(indent + 4, f"{var} = None")
        src.line(indent, "elif b == 2:")
        _value(src, schema[1], var, indent + 4)
        src.line(indent, "else:")
        src.line(indent + 4, "raise Unreadable('union index')")
    elif schema in ("string", "bytes"):
        n = src.fresh("n")
        _long(src, indent, n)
        src.line(indent, f"if {n} < 0 or p + {n} > size: raise Unreadable('length')")
        decode = ".decode()" if schema == "string" else ""
        src.line(indent, f"{var} = d[p : p + {n}]{decode}")
        src.line(indent, f"p += {n}")
    elif schema in ("int", "long"):
        _long(src, indent, var)
    elif schema == "double":
        src.line(indent, f"{var} = unpack_double(d, p)[0]")
        src.line(indent, "p += 8")
    elif isinstance(schema, Mapping) and schema.get("type") in ("map", "array"):
        _items(src, schema, var, indent)
    elif isinstance(schema, Mapping) and schema.get("type") == "record":
        _fields(src, schema, var, indent)
    else:
        raise UnsupportedSchema(schema)


def _items(src: Source, schema: Mapping[str, Any], var: str, indent: int) -> None:
    """A map or an array: blocks of items until the empty block (a negative count is Unreadable)."""
    n, item = src.fresh("n"), src.fresh("i")
    is_map = schema["type"] == "map"
    src.line(indent, f"{var} = {{}}" if is_map else f"{var} = []")
    src.line(indent, "while True:")
    _long(src, indent + 4, n)
    src.line(indent + 4, f"if {n} <= 0:")
    src.line(indent + 8, f"if {n}: raise Unreadable('block count')")
    src.line(indent + 8, "break")
    src.line(indent + 4, f"for _ in range({n}):")
    if is_map:
        key = src.fresh("k")
        _value(src, "string", key, indent + 8)
        _value(src, schema["values"], item, indent + 8)
        src.line(indent + 8, f"{var}[{key}] = {item}")
    else:
        _value(src, schema["items"], item, indent + 8)
        src.line(indent + 8, f"{var}.append({item})")


def _fields(src: Source, schema: Mapping[str, Any], var: str, indent: int) -> None:
    """A record's fields in order, then the dict of them in `var`."""
    values = []
    for field in schema["fields"]:
        value = src.fresh("v")
        _value(src, field["type"], value, indent)
        values.append(f"{field['name']!r}: {value}")
    src.line(indent, f"{var} = {{{', '.join(values)}}}")


def compile_reader(schema: Mapping[str, Any]) -> Reader | None:
    """A function reading a record's Avro body per `schema` (parsed by fastavro), written and read
    with the same schema.

    Returns None when the schema uses a type the compiled reader does not cover. The function
    raises (Unreadable, IndexError, UnicodeDecodeError, struct.error, ...) for bytes it does not read.
    """
    if schema.get("type") != "record":
        return None
    src = Source()
    src.line(0, "def read(d, p):")
    src.line(4, "size = len(d)")
    try:
        _fields(src, schema, "r", 4)
    except UnsupportedSchema:
        return None
    src.line(4, "return r, p")
    globals_ = {
        "long_at": long_at,
        "unpack_double": struct.Struct("<d").unpack_from,
        "Unreadable": Unreadable,
    }
    read: Reader = src.function("read", f"<avro reader of {schema.get('name')}>", globals_)
    return read
