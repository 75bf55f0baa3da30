"""The contract: the Trajectory Avro schema, its single-object codec and packed token buffers."""

from schemas.codec import TRAJECTORY_SCHEMA_PATH, TrajectoryCodec, fingerprint_of, load_schema
from schemas.domains import DomainRegistry, DomainSpec, default_domains
from schemas.exceptions import (
    DecodeError,
    DomainRegistryError,
    EncodeError,
    RollstreamError,
    SchemaError,
    UnknownSchemaError,
)
from schemas.packing import pack_float32, pack_int32, pack_mask, unpack_float32, unpack_int32, unpack_mask
from schemas.record import TrajectoryRecord, VersionSpan
from schemas.tables import DEAD_LETTERS_SCHEMA, TRAJECTORIES_SCHEMA

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
