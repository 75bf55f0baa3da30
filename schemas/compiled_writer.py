"""A record schema compiled to one Python function that writes its Avro binary body.

fastavro's writer works out each field's type, and tries the branches of each union in turn, on
every call: 20 to 35 µs of CPU for a 1 KB trajectory here, about a quarter of a publish's. The
compiled function runs straight through the schema's fields instead: 9 to 13 µs for the same
records (docs/producers.md, Benchmarks).

It covers the types the contract uses: string, bytes, int, long, double, long timestamp-millis,
map, array, record, and a union of null with one of those; `compile_writer` returns None for a
schema with anything else. It writes only values of the Python types fastavro writes the same way
(exactly str, bytes, int within range, float, dict, list or None); for any other value it raises
`Unsupported`, and the caller writes that record with fastavro, so the bytes written and the
errors raised stay fastavro's. tests/test_schemas_codec.py checks the two write the same bytes.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from typing import Any

from fastavro.write import LOGICAL_WRITERS

from schemas.codegen import Source, UnsupportedSchema

Writer = Callable[[Mapping[str, Any]], bytes]

_TABLE = 1 << 14
_VARINTS: list[bytes] = []
_RANGES = {"int": (-(1 << 31), 1 << 31), "long": (-(1 << 63), 1 << 63)}


class Unsupported(Exception):
    """The value is not one the compiled writer takes: write the record with fastavro instead."""


def varint(value: int) -> bytes:
    """The Avro variable-length encoding of a non-negative (already zigzagged) integer."""
    out = bytearray()
    while value & ~0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _prefix(src: Source, indent: int, length: str) -> None:
    """Append the varint of a non-negative zigzagged integer held in variable `length`."""
    src.line(indent, f"a(V[{length}] if {length} < {_TABLE} else varint({length}))")


def _value(src: Source, schema: Any, var: str, indent: int) -> None:
    """Lines writing the value in variable `var` as `schema`; raise UnsupportedSchema for other types."""
    if isinstance(schema, Mapping) and schema.get("type") == "long" and "logicalType" in schema:
        if schema["logicalType"] != "timestamp-millis":
            raise UnsupportedSchema(schema["logicalType"])
        prepare = src.constant(LOGICAL_WRITERS["long-timestamp-millis"])
        src.line(indent, f"if type({var}) is not int: {var} = {prepare}({var}, {src.constant(schema)})")
        schema = "long"
    elif isinstance(schema, Mapping) and set(schema) <= {"type"} and isinstance(schema.get("type"), str):
        schema = schema["type"]
    if isinstance(schema, list):
        if len(schema) != 2 or schema[0] != "null" or schema[1] == "null" or isinstance(schema[1], list):
            raise UnsupportedSchema(schema)
        src.line(indent, f"if {var} is None:")
        src.line(indent + 4, "a(b'\\x00')")
        src.line(indent, "else:")
        src.line(indent + 4, "a(b'\\x02')")
        _value(src, schema[1], var, indent + 4)
    elif schema in ("string", "bytes"):
        n = src.fresh("n")
        if schema == "string":
            src.line(indent, f"if type({var}) is not str: raise Unsupported")
            src.line(indent, f"{var} = {var}.encode()")
        else:
            src.line(indent, f"if type({var}) is not bytes: raise Unsupported")
        src.line(indent, f"{n} = len({var}) << 1")
        _prefix(src, indent, n)
        src.line(indent, f"a({var})")
    elif isinstance(schema, str) and schema in _RANGES:
        low, high = _RANGES[schema]
        z = src.fresh("z")
        src.line(indent, f"if type({var}) is not int or not {low} <= {var} < {high}: raise Unsupported")
        src.line(indent, f"{z} = ({var} << 1) ^ ({var} >> 63)")
        _prefix(src, indent, z)
    elif schema == "double":
        src.line(indent, f"if type({var}) is not float: raise Unsupported")
        src.line(indent, f"a(pack_double({var}))")
    elif isinstance(schema, Mapping) and schema.get("type") in ("map", "array"):
        _items(src, schema, var, indent)
    elif isinstance(schema, Mapping) and schema.get("type") == "record":
        src.line(indent, f"if type({var}) is not dict or '-type' in {var}: raise Unsupported")
        _fields(src, schema, var, indent)
    else:
        raise UnsupportedSchema(schema)


def _items(src: Source, schema: Mapping[str, Any], var: str, indent: int) -> None:
    """A map or an array: one block of all its items (if any), then the empty block."""
    n, item = src.fresh("n"), src.fresh("i")
    if schema["type"] == "map":
        key = src.fresh("k")
        src.line(indent, f"if type({var}) is not dict: raise Unsupported")
        loop = f"for {key}, {item} in {var}.items():"
    else:
        src.line(indent, f"if type({var}) is not list: raise Unsupported")
        loop = f"for {item} in {var}:"
    src.line(indent, f"if {var}:")
    src.line(indent + 4, f"{n} = len({var}) << 1")
    _prefix(src, indent + 4, n)
    src.line(indent + 4, loop)
    if schema["type"] == "map":
        _value(src, "string", key, indent + 8)
        _value(src, schema["values"], item, indent + 8)
    else:
        _value(src, schema["items"], item, indent + 8)
    src.line(indent, "a(b'\\x00')")


def _fields(src: Source, schema: Mapping[str, Any], var: str, indent: int) -> None:
    """A record's fields in order; a missing field takes its default (KeyError without one)."""
    for field in schema["fields"]:
        value = src.fresh("v")
        if "default" in field:
            src.line(indent, f"{value} = {var}.get({field['name']!r}, {src.constant(field['default'])})")
        else:
            src.line(indent, f"{value} = {var}[{field['name']!r}]")
        _value(src, field["type"], value, indent)


def compile_writer(schema: Mapping[str, Any], prefix: bytes = b"") -> Writer | None:
    """A function writing `prefix` and a record's Avro body per `schema` (parsed by fastavro).

    Returns None when the schema uses a type the compiled writer does not cover. The function
    raises `Unsupported` (or KeyError, UnicodeEncodeError, ...) for a record it does not take.
    """
    if not _VARINTS:
        _VARINTS.extend(varint(z) for z in range(_TABLE))
    if schema.get("type") != "record":
        return None
    src = Source()
    src.line(0, "def write(r):")
    src.line(4, "if type(r) is not dict: raise Unsupported")
    src.line(4, "p = [PREFIX]")
    src.line(4, "a = p.append")
    try:
        _fields(src, schema, "r", 4)
    except UnsupportedSchema:
        return None
    src.line(4, "return b''.join(p)")
    globals_ = {
        "PREFIX": prefix,
        "V": _VARINTS,
        "varint": varint,
        "pack_double": struct.Struct("<d").pack,
        "Unsupported": Unsupported,
    }
    write: Writer = src.function("write", f"<avro writer of {schema.get('name')}>", globals_)
    return write
