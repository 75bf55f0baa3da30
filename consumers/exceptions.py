"""Errors of the learner side; each subclasses `schemas.RollstreamError` and says what to do."""

from __future__ import annotations

from schemas.exceptions import RollstreamError


class ConsumerError(RollstreamError):
    """Root of the errors raised by `consumers`."""


class MissingTableError(ConsumerError):
    """The trajectories Delta table (or the requested version of it) does not exist."""


class ForkedReaderError(ConsumerError):
    """A table read was attempted in a process forked after deltalake/polars started up."""


class EmptySnapshotError(ConsumerError):
    """The table snapshot holds no rows a learner can train on."""


class PolicyInputError(ConsumerError):
    """A batch does not fit the policy, e.g. a token id outside its vocabulary."""


class TrackingError(ConsumerError):
    """The MLflow tracking configuration is unusable."""


class AnalyticsError(ConsumerError):
    """A SQL query, table name or time-travel target is invalid; the message says which."""


class TokenRangeError(PolicyInputError):
    """A stored token id lies outside the configured vocabulary."""


class RateLimitTimeout(ConsumerError):
    """The rate limiter kept the learner waiting longer than its timeout."""


class BufferExhausted(ConsumerError):
    """A bounded read (an end version) is done: no row is left that the samplers may draw."""


class CheckpointError(ConsumerError):
    """A checkpoint cannot be read or does not match this run."""


class WeightsError(ConsumerError):
    """Publishing or reading policy weights failed; the message says which step and why."""


class VersionConflictError(WeightsError):
    """A policy version number is already published with other weights, or is not above the latest."""


class ChecksumError(WeightsError):
    """A weights file does not match its record's sha256 or size; nothing was loaded."""


class AnnounceError(WeightsError):
    """A policy version record could not be delivered to, or read from, its Kafka topic."""


class RegistrationError(WeightsError):
    """A published policy version could not be registered as an MLflow model version."""
