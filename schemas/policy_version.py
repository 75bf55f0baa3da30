"""The policy version record: written by the learner, read by servers and rollout workers.

One record names one published set of weights: its number (what generation stamps as
``policy_version``), the learner's step, the safetensors file and its SHA-256, the MLflow run and
the trajectories table version trained to. The same fields are a row of the ``policies`` Delta
table (`schemas.tables.POLICIES_SCHEMA`, the publication) and, Avro single-object encoded like a
trajectory (``schemas/avro/policy_version.avsc``), the value of a record on the compacted
`POLICY_VERSIONS_TOPIC`, which only announces it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from schemas.codec import AVRO_DIR, RecordCodec, SchemaLike
from schemas.exceptions import DecodeError, PolicyVersionError

POLICY_VERSION_SCHEMA_PATH = AVRO_DIR / "policy_version.avsc"
POLICY_VERSIONS_TOPIC = "rollouts.policies"
"""The compacted topic of announcements; `infra/topics.toml` declares it under this name."""

_SHA256 = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class PolicyVersion:
    """One published policy version; `created_at` is kept in UTC at millisecond precision.

    Raises:
        PolicyVersionError: a field is out of range or malformed.
    """

    number: int
    step: int
    path: str
    sha256: str
    size_bytes: int
    run_id: str | None
    table_version: int | None
    created_at: datetime

    def __post_init__(self) -> None:
        for name in ("number", "step", "size_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise PolicyVersionError(f"policy version {name} = {value!r}; give an integer >= 0")
        if self.table_version is not None and (
            not isinstance(self.table_version, int) or self.table_version < 0
        ):
            raise PolicyVersionError(
                f"table_version = {self.table_version!r}; give the table version trained to (>= 0) or None"
            )
        if not isinstance(self.sha256, str) or not _SHA256.match(self.sha256):
            raise PolicyVersionError(
                f"sha256 = {self.sha256!r} is not 64 lowercase hex digits; give hashlib.sha256(...).hexdigest()"
            )
        if not isinstance(self.path, str) or not self.path:
            raise PolicyVersionError(f"path = {self.path!r}; give the URI of the weights file")
        if not isinstance(self.created_at, datetime) or self.created_at.tzinfo is None:
            raise PolicyVersionError(
                f"created_at = {self.created_at!r} must be a timezone-aware datetime, e.g. datetime.now(UTC)"
            )
        at = self.created_at.astimezone(UTC)
        object.__setattr__(self, "created_at", at.replace(microsecond=at.microsecond // 1000 * 1000))

    def as_dict(self) -> dict[str, Any]:
        """The fields by name: an Avro record for the codec, a row for the policies table."""
        return asdict(self)

    @classmethod
    def from_dict(cls, fields: Mapping[str, Any]) -> PolicyVersion:
        """The record from a decoded Avro record or a table row (extra keys are ignored).

        Raises:
            PolicyVersionError: a field is missing or invalid.
        """
        names = cls.__dataclass_fields__
        missing = sorted(set(names) - set(fields))
        if missing:
            raise PolicyVersionError(f"policy version record lacks {missing}; it has {sorted(fields)}")
        return cls(**{name: fields[name] for name in names})


class PolicyVersionCodec(RecordCodec):
    """Avro single-object encoding of `PolicyVersion` (the trajectory's wire format, WIRE_FORMAT.md).

    Args:
        writer_schemas: further PolicyVersion schemas whose messages may arrive; every .avsc under
            ``schemas/avro/`` naming ``dev.rollstream.PolicyVersion`` is known too.
    """

    def __init__(self, *, writer_schemas: Iterable[SchemaLike] = ()) -> None:
        super().__init__(POLICY_VERSION_SCHEMA_PATH, writer_schemas=writer_schemas)

    def encode(self, record: PolicyVersion) -> bytes:
        """One message: marker, fingerprint, Avro body."""
        return self.encode_fields(record.as_dict(), f"policy version {getattr(record, 'number', '?')!r}")

    def decode(self, data: bytes) -> PolicyVersion:
        """The record in one message, resolved from its writer schema to ours.

        Raises:
            UnknownSchemaError: the message names a writer schema this codec does not know.
            DecodeError: the bytes are not a single-object message or not a valid record.
        """
        fields = self.decode_fields(data)
        try:
            return PolicyVersion.from_dict(fields)
        except PolicyVersionError as exc:
            raise DecodeError(f"decoded {self.name} is invalid: {exc}") from exc
