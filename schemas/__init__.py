"""The contract: the Trajectory Avro schema, its single-object codec and packed token buffers."""

from __future__ import annotations

from typing import TYPE_CHECKING

from schemas.exceptions import (
    DecodeError,
    DomainRegistryError,
    EncodeError,
    RollstreamError,
    SchemaError,
    UnknownSchemaError,
)
from schemas.lazy import lazy_exports

if TYPE_CHECKING:
    from schemas.codec import TRAJECTORY_SCHEMA_PATH, TrajectoryCodec, fingerprint_of, load_schema
    from schemas.domains import DomainRegistry, DomainSpec, default_domains
    from schemas.packing import pack_float32, pack_int32, pack_mask, unpack_float32, unpack_int32, unpack_mask
    from schemas.record import TrajectoryRecord, VersionSpan
    from schemas.tables import DEAD_LETTERS_SCHEMA, TRAJECTORIES_SCHEMA

_LAZY = {
    "TRAJECTORY_SCHEMA_PATH": "schemas.codec",
    "TrajectoryCodec": "schemas.codec",
    "fingerprint_of": "schemas.codec",
    "load_schema": "schemas.codec",
    "DomainRegistry": "schemas.domains",
    "DomainSpec": "schemas.domains",
    "default_domains": "schemas.domains",
    "pack_float32": "schemas.packing",
    "pack_int32": "schemas.packing",
    "pack_mask": "schemas.packing",
    "unpack_float32": "schemas.packing",
    "unpack_int32": "schemas.packing",
    "unpack_mask": "schemas.packing",
    "TrajectoryRecord": "schemas.record",
    "VersionSpan": "schemas.record",
    "DEAD_LETTERS_SCHEMA": "schemas.tables",
    "TRAJECTORIES_SCHEMA": "schemas.tables",
}
"""Names imported on first use, so that importing the errors does not load numpy and pyarrow."""


__getattr__, __dir__ = lazy_exports(__name__, _LAZY)


__all__ = [
    "DEAD_LETTERS_SCHEMA",
    "TRAJECTORIES_SCHEMA",
    "TRAJECTORY_SCHEMA_PATH",
    "DecodeError",
    "DomainRegistry",
    "DomainRegistryError",
    "DomainSpec",
    "EncodeError",
    "RollstreamError",
    "SchemaError",
    "TrajectoryCodec",
    "TrajectoryRecord",
    "UnknownSchemaError",
    "VersionSpan",
    "default_domains",
    "fingerprint_of",
    "load_schema",
    "pack_float32",
    "pack_int32",
    "pack_mask",
    "unpack_float32",
    "unpack_int32",
    "unpack_mask",
]
