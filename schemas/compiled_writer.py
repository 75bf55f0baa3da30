"""A record schema compiled to one Python function that writes its Avro binary body.

fastavro's writer works out each field's type, and tries the branches of each union in turn, on
every call: 20 to 35 µs of CPU for a 1 KB trajectory here, about a quarter of a publish's. The
compiled function runs straight through the schema's fields instead, holding each piece of the
body (a length or union prefix, a value's bytes) in a local and joining them all once at the end:
about 3.6 µs for the same records (docs/producers.md, Benchmarks). Prefixes come from tables:
the varint of every value below 2**14, and the same after a union's branch index; a larger
integer (a timestamp) is written 14 bits at a time.

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
from typing import Any, NamedTuple

from fastavro.write import LOGICAL_WRITERS

from schemas.codegen import Source, UnsupportedSchema

Writer = Callable[[Mapping[str, Any]], bytes]

_BITS = 14
_TABLE = 1 << _BITS
_LOW = _TABLE - 1
_VARINTS: list[bytes] = []  # the varint of each value below _TABLE
_SOME: list[bytes] = []  # the same after b'\x02', the index of a union's second branch
_MORE: list[bytes] = []  # 14 low bits as two bytes that both say another byte follows
_RANGES = {"int": (-(1 << 31), 1 << 31), "long": (-(1 << 63), 1 << 63)}


class Unsupported(Exception):
    """The value is not one the compiled writer takes: write the record with fastavro instead."""


def _slow_varint(value: int) -> bytes:
    out = bytearray()
    while value & ~0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _fill_tables() -> None:
    if not _VARINTS:
        _MORE.extend(bytes(((z & 0x7F) | 0x80, (z >> 7) | 0x80)) for z in range(_TABLE))
        _SOME.extend(b"\x02" + _slow_varint(z) for z in range(_TABLE))
        _VARINTS.extend(_slow_varint(z) for z in range(_TABLE))


def varint(value: int) -> bytes:
    """The Avro variable-length encoding of a non-negative (already zigzagged) integer."""
    _fill_tables()
    if value < _TABLE:
        return _VARINTS[value]
    if value < 1 << 2 * _BITS:
        return _MORE[value & _LOW] + _VARINTS[value >> _BITS]
    if value < 1 << 3 * _BITS:  # a timestamp in milliseconds until the year 2109
        return _MORE[value & _LOW] + _MORE[value >> _BITS & _LOW] + _VARINTS[value >> 2 * _BITS]
    pieces = []
    while value >= _TABLE:
        pieces.append(_MORE[value & _LOW])
        value >>= _BITS
    pieces.append(_VARINTS[value])
    return b"".join(pieces)


def _prefix(n: str) -> str:
    """The varint of the non-negative integer held in variable `n`."""
    return f"(V[{n}] if {n} < {_TABLE} else varint({n}))"


def _wide_prefix(z: str) -> str:
    """The varint of the non-negative integer held in variable `z`, a timestamp's 3 groups of 14
    bits inline (`varint` for anything else)."""
    wide = f"M[{z} & {_LOW}] + M[{z} >> {_BITS} & {_LOW}] + V[{z} >> {2 * _BITS}]"
    return f"({wide} if {1 << 2 * _BITS} <= {z} < {1 << 3 * _BITS} else {_prefix(z)})"


def _some_prefix(n: str) -> str:
    """A union's second-branch index, then the varint of the integer held in variable `n`."""
    return f"(S[{n}] if {n} < {_TABLE} else b'\\x02' + varint({n}))"


def _simple(schema: Any) -> Any:
    """`schema` with a timestamp-millis long and a {"type": name} wrapper taken off (left alone)."""
    if isinstance(schema, Mapping) and isinstance(schema.get("type"), str):
        if schema["type"] == "long" and "logicalType" in schema:
            if schema["logicalType"] != "timestamp-millis":
                raise UnsupportedSchema(schema["logicalType"])
            return schema
        if set(schema) <= {"type"}:
            return schema["type"]
    return schema


def _is_timestamp(schema: Any) -> bool:
    return isinstance(schema, Mapping) and schema.get("logicalType") == "timestamp-millis"


class _Scalar(NamedTuple):
    """How a scalar is written: the variable its varint prefix writes ("" for none), the
    expression of its bytes after that (None for none), and whether the varint is a timestamp's."""

    counted: str
    data: str | None
    wide: bool = False

    def prefix(self) -> str:
        return _wide_prefix(self.counted) if self.wide else _prefix(self.counted)


def _scalar(src: Source, schema: Any, var: str, indent: int) -> _Scalar | None:
    """Lines checking (and for a string, encoding) a scalar in `var`; None for other types.

    A string or bytes is written as its zigzagged length and `var`; an int or long as its
    zigzagged value; a double as its packed bytes.
    """
    timestamp = _is_timestamp(schema)
    if timestamp:
        prepare = src.constant(LOGICAL_WRITERS["long-timestamp-millis"])
        src.line(indent, f"if type({var}) is not int: {var} = {prepare}({var}, {src.constant(schema)})")
        schema = "long"
    if schema in ("string", "bytes"):
        n = src.fresh("n")
        if schema == "string":
            src.line(indent, f"if type({var}) is not str: raise Unsupported")
            src.line(indent, f"{var} = {var}.encode()")
        else:
            src.line(indent, f"if type({var}) is not bytes: raise Unsupported")
        src.line(indent, f"{n} = len({var}) << 1")
        return _Scalar(n, var)
    if isinstance(schema, str) and schema in _RANGES:
        low, high = _RANGES[schema]
        z = src.fresh("z")
        src.line(indent, f"if type({var}) is not int or not {low} <= {var} < {high}: raise Unsupported")
        src.line(indent, f"{z} = ({var} << 1) ^ ({var} >> 63)")
        return _Scalar(z, None, timestamp)
    if schema == "double":
        src.line(indent, f"if type({var}) is not float: raise Unsupported")
        return _Scalar("", f"pack_double({var})")
    return None


def _append(src: Source, schema: Any, var: str, indent: int, a: str) -> None:
    """Lines writing the value in `var` as `schema` by calls to the append function `a` (the form
    inside a map or array, whose item count is known only at run time)."""
    schema = _simple(schema)
    if isinstance(schema, list):
        _check_union(schema)
        src.line(indent, f"if {var} is None:")
        src.line(indent + 4, f"{a}(b'\\x00')")
        src.line(indent, "else:")
        src.line(indent + 4, f"{a}(b'\\x02')")
        _append(src, schema[1], var, indent + 4, a)
        return
    scalar = _scalar(src, schema, var, indent)
    if scalar is not None:
        if scalar.counted:
            src.line(indent, f"{a}({scalar.prefix()})")
        if scalar.data is not None:
            src.line(indent, f"{a}({scalar.data})")
    elif isinstance(schema, Mapping) and schema.get("type") in ("map", "array"):
        src.line(indent, f"{a}({_items(src, schema, var, indent)})")
    elif isinstance(schema, Mapping) and schema.get("type") == "record":
        src.line(indent, f"if type({var}) is not dict or '-type' in {var}: raise Unsupported")
        for piece in _fields(src, schema, var, indent):
            src.line(indent, f"{a}({piece})")
    else:
        raise UnsupportedSchema(schema)


def _check_union(schema: list[Any]) -> None:
    if len(schema) != 2 or schema[0] != "null" or schema[1] == "null" or isinstance(schema[1], list):
        raise UnsupportedSchema(schema)


def _items(src: Source, schema: Mapping[str, Any], var: str, indent: int) -> str:
    """Lines writing a map or an array into one local (one block of all its items, if any, then
    the empty block); returns its name."""
    out, n, item = src.fresh("m"), src.fresh("n"), src.fresh("i")
    if schema["type"] == "map":
        key = src.fresh("k")
        src.line(indent, f"if type({var}) is not dict: raise Unsupported")
        loop = f"for {key}, {item} in {var}.items():"
    else:
        src.line(indent, f"if type({var}) is not list: raise Unsupported")
        loop = f"for {item} in {var}:"
    src.line(indent, f"if {var}:")
    a = src.fresh("a")
    src.line(indent + 4, f"{n} = len({var}) << 1")
    src.line(indent + 4, f"{out} = [{_prefix(n)}]")
    src.line(indent + 4, f"{a} = {out}.append")
    src.line(indent + 4, loop)
    if schema["type"] == "map":
        _append(src, "string", key, indent + 8, a)
        _append(src, schema["values"], item, indent + 8, a)
    else:
        _append(src, schema["items"], item, indent + 8, a)
    src.line(indent + 4, f"{a}(b'\\x00')")
    src.line(indent + 4, f"{out} = b''.join({out})")
    src.line(indent, "else:")
    src.line(indent + 4, f"{out} = b'\\x00'")
    return out


def _union(src: Source, branch: Any, var: str, indent: int) -> list[str]:
    """Lines writing null or the `branch` value in `var`; returns the pieces, the same number
    whichever it holds (the branch index with any length prefix, then the value's bytes, b'' for
    null, when they are a piece of their own)."""
    branch = _simple(branch)
    head = src.fresh("u")
    src.line(indent, f"if {var} is not None:")
    scalar = _scalar(src, branch, var, indent + 4)
    body = var
    if scalar is not None:
        if not scalar.counted:  # a double
            src.line(indent + 4, f"{head} = b'\\x02' + {scalar.data}")
            body = ""
        else:
            src.line(indent + 4, f"{head} = {_some_prefix(scalar.counted)}")
            body = var if scalar.data else ""  # an int or long has no piece after its prefix
    elif isinstance(branch, Mapping) and branch.get("type") in ("map", "array"):
        body = _items(src, branch, var, indent + 4)
        src.line(indent + 4, f"{head} = b'\\x02'")
    else:
        a = src.fresh("a")
        src.line(indent + 4, f"{head} = [b'\\x02']")
        src.line(indent + 4, f"{a} = {head}.append")
        _append(src, branch, var, indent + 4, a)
        src.line(indent + 4, f"{head} = b''.join({head})")
        body = ""
    src.line(indent, "else:")
    src.line(indent + 4, f"{head} = b'\\x00'" + (f"; {body} = b''" if body else ""))
    return [head, body] if body else [head]


def _pieces(src: Source, schema: Any, var: str, indent: int) -> list[str]:
    """Lines writing the value in `var` as `schema`; returns the expressions of its pieces, in order."""
    schema = _simple(schema)
    if isinstance(schema, list):
        _check_union(schema)
        return _union(src, schema[1], var, indent)
    scalar = _scalar(src, schema, var, indent)
    if scalar is not None:
        return [piece for piece in (scalar.counted and scalar.prefix(), scalar.data) if piece]
    if isinstance(schema, Mapping) and schema.get("type") in ("map", "array"):
        return [_items(src, schema, var, indent)]
    if isinstance(schema, Mapping) and schema.get("type") == "record":
        src.line(indent, f"if type({var}) is not dict or '-type' in {var}: raise Unsupported")
        return _fields(src, schema, var, indent)
    raise UnsupportedSchema(schema)


def _fields(src: Source, schema: Mapping[str, Any], var: str, indent: int) -> list[str]:
    """A record's fields in order; a missing field takes its default (KeyError without one)."""
    pieces: list[str] = []
    for field in schema["fields"]:
        value = src.fresh("v")
        if "default" in field:
            src.line(indent, f"{value} = {var}.get({field['name']!r}, {src.constant(field['default'])})")
        else:
            src.line(indent, f"{value} = {var}[{field['name']!r}]")
        pieces += _pieces(src, field["type"], value, indent)
    return pieces


def compile_writer(schema: Mapping[str, Any], prefix: bytes = b"") -> Writer | None:
    """A function writing `prefix` and a record's Avro body per `schema` (parsed by fastavro).

    Returns None when the schema uses a type the compiled writer does not cover. The function
    raises `Unsupported` (or KeyError, UnicodeEncodeError, ...) for a record it does not take.
    """
    _fill_tables()
    if schema.get("type") != "record":
        return None
    src = Source()
    src.line(0, "def write(r):")
    src.line(4, "if type(r) is not dict: raise Unsupported")
    try:
        pieces = _fields(src, schema, "r", 4)
    except UnsupportedSchema:
        return None
    src.line(4, f"return b''.join((PREFIX, {', '.join(pieces)}))")
    globals_ = {
        "PREFIX": prefix,
        "V": _VARINTS,
        "S": _SOME,
        "M": _MORE,
        "varint": varint,
        "pack_double": struct.Struct("<d").pack,
        "Unsupported": Unsupported,
    }
    write: Writer = src.function("write", f"<avro writer of {schema.get('name')}>", globals_)
    return write
