"""Errors of the contract; `RollstreamError` is the root of every rollstream error."""


class RollstreamError(Exception):
    """Root of every error rollstream raises on purpose."""


class SchemaError(RollstreamError):
    """A schema file is missing or invalid."""


class EncodeError(RollstreamError):
    """A record does not fit the writer schema."""


class DecodeError(RollstreamError):
    """Bytes are not a decodable single-object-encoded Trajectory."""


class UnknownSchemaError(DecodeError):
    """The message names a writer schema fingerprint this codec does not know."""


class DomainRegistryError(RollstreamError):
    """The domain registry is missing or malformed, or a domain is not in it."""


class ProfileError(RollstreamError):
    """An inference workload profile or trace is missing, malformed or inconsistent."""


class PolicyVersionError(RollstreamError):
    """A policy version record has an invalid field (negative number, malformed sha256, ...)."""
