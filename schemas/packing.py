"""Packed token buffers: little-endian int32 ids and float32 logprobs in Avro `bytes` fields.

Arrays of numbers decode about 270 times slower than packed bytes in fastavro
(ARCHITECTURE.md, Contracts), so sequences travel packed and unpack without a copy.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from schemas.exceptions import DecodeError

INT32 = np.dtype("<i4")
FLOAT32 = np.dtype("<f4")
UINT8 = np.dtype("u1")


def pack_int32(values: Sequence[int] | npt.NDArray[np.integer]) -> bytes:
    """Pack token ids as little-endian int32."""
    return np.asarray(values).astype(INT32, copy=False).tobytes()


def pack_float32(values: Sequence[float] | npt.NDArray[np.floating]) -> bytes:
    """Pack logprobs as little-endian float32."""
    return np.asarray(values).astype(FLOAT32, copy=False).tobytes()


def _check(data: bytes, what: str) -> None:
    if len(data) % 4:
        raise DecodeError(
            f"packed {what} buffer has {len(data)} bytes, not a multiple of 4: "
            "the producer must pack 4-byte little-endian elements (schemas/WIRE_FORMAT.md)"
        )


def unpack_int32(data: bytes) -> npt.NDArray[np.int32]:
    """View a packed int32 buffer as a read-only numpy array (no copy)."""
    _check(data, "int32")
    return np.frombuffer(data, dtype=INT32)


def unpack_float32(data: bytes) -> npt.NDArray[np.float32]:
    """View a packed float32 buffer as a read-only numpy array (no copy)."""
    _check(data, "float32")
    return np.frombuffer(data, dtype=FLOAT32)


def pack_mask(values: Sequence[bool] | Sequence[int] | npt.NDArray[np.generic]) -> bytes:
    """Pack a per-token loss mask: one byte per token, 1 trained on, 0 not."""
    return (np.asarray(values) != 0).astype(UINT8).tobytes()


def unpack_mask(data: bytes) -> npt.NDArray[np.bool_]:
    """A packed loss mask as a boolean array (values other than 0 and 1 are refused)."""
    mask = np.frombuffer(data, dtype=UINT8)
    if mask.size and mask.max() > 1:
        raise DecodeError("packed loss mask holds a byte other than 0 or 1 (schemas/WIRE_FORMAT.md)")
    return mask.astype(np.bool_)


def concatenated(arrays: Sequence[npt.NDArray[np.generic]], dtype: np.dtype[np.generic]) -> pa.Buffer:
    """The elements of `arrays`, cast to `dtype` (same kind), one after another in one buffer of
    Arrow's default memory pool.

    Arrow's pool keeps freed memory for the next buffer (no page fault once warm, also after a
    second idle), where a `b"".join` of tens of MB gets fresh pages from the kernel: one page fault
    per 4 KiB, 5 to 6.5 us per row of 3 KB, with the GIL held.
    """
    total = sum(map(len, arrays))
    if not total:
        return pa.py_buffer(b"")
    buffer = pa.allocate_buffer(total * dtype.itemsize)
    np.concatenate(arrays, out=np.frombuffer(buffer, dtype))
    return buffer
