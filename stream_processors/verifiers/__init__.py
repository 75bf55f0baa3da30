"""Verifiers: judge a decoded trajectory and return a `Verdict` (reward, status, verifier, detail)."""

from stream_processors.verifiers.base import STATUSES, Verdict, VerdictStatus, Verifier
from stream_processors.verifiers.exact_answer import ExactAnswerVerifier, final_answer, normalize_answer
from stream_processors.verifiers.field_match import FieldMatchVerifier
from stream_processors.verifiers.precomputed import PrecomputedVerifier
from stream_processors.verifiers.registry import VerifierRegistry, default_registry
from stream_processors.verifiers.skipped import CODE_SKIP_DETAIL, SkippedVerifier

__all__ = [
    "CODE_SKIP_DETAIL",
    "STATUSES",
    "ExactAnswerVerifier",
    "FieldMatchVerifier",
    "PrecomputedVerifier",
    "SkippedVerifier",
    "Verdict",
    "VerdictStatus",
    "Verifier",
    "VerifierRegistry",
    "default_registry",
    "final_answer",
    "normalize_answer",
]
