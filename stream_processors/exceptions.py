"""Errors of the stream stage; every one is a `RollstreamError` and names the bad value."""

from __future__ import annotations

from schemas.exceptions import RollstreamError


class StreamProcessorError(RollstreamError):
    """Root of the stream processors' errors."""


class BrokerUnavailableError(StreamProcessorError):
    """The brokers did not answer a metadata or offsets request in time; retrying may succeed."""


class InvalidRecordError(StreamProcessorError):
    """A decoded trajectory breaks a rule the schema cannot express; it becomes a dead letter."""


class PackedBufferError(InvalidRecordError):
    """A packed token or logprob buffer does not hold whole 4-byte elements."""


class LengthMismatchError(InvalidRecordError):
    """Two sequences that must pair up element by element have different lengths."""


class TokenIdError(InvalidRecordError):
    """A token id is negative or not below `validation.MAX_TOKEN_ID`."""


class NonFiniteValueError(InvalidRecordError):
    """A reward or logprob is NaN or infinite."""


class GroupIndexError(InvalidRecordError):
    """`group_size` or `sample_index` is out of range."""


class EmptyIdError(InvalidRecordError):
    """An id field (trajectory_id, group_id, task_id) is empty."""


class LossMaskError(InvalidRecordError):
    """A loss mask byte is neither 0 nor 1."""


class VersionSpanError(InvalidRecordError):
    """`version_spans` do not cover the response's tokens in order, without gaps or overlap."""


class AttemptError(InvalidRecordError):
    """`attempt` and `task_id` disagree: attempt < 0, a task without an attempt, or the reverse."""


class UnknownTaskTypeError(InvalidRecordError):
    """No verifier is registered for the record's task_type."""


class UnknownDomainError(InvalidRecordError):
    """The record's domain is not in the domain registry (or names a verifier that does not exist)."""


class DomainMismatchError(InvalidRecordError):
    """The record's task_type is not the one the domain registry gives its domain."""


class TransientScoringError(StreamProcessorError):
    """Scoring kept failing for the host's reasons after retries: the worker stops without acking."""


class VerifierInputError(InvalidRecordError):
    """The record lacks what its verifier needs (expected_answer, gold_fields, precomputed_reward)."""


class SinkError(StreamProcessorError):
    """A Delta table or the dead-letter topic refused a write."""
