"""Verifiers: judge a decoded trajectory and return a `Verdict` (reward, status, verifier, detail)."""

from stream_processors.verifiers.base import STATUSES, Verdict, VerdictStatus, Verifier
from stream_processors.verifiers.code_tests import CodeTestsVerifier
from stream_processors.verifiers.domains import FACTORIES, DomainVerifiers
from stream_processors.verifiers.exact_answer import ExactAnswerVerifier, final_answer, normalize_answer
from stream_processors.verifiers.extraction import ExtractionVerifier
from stream_processors.verifiers.field_match import FieldMatchVerifier
from stream_processors.verifiers.math_answer import MathVerifier
from stream_processors.verifiers.precomputed import PrecomputedVerifier
from stream_processors.verifiers.registry import VerifierRegistry, default_registry
from stream_processors.verifiers.skipped import CODE_SKIP_DETAIL, SkippedVerifier
from stream_processors.verifiers.tool_use import ToolUseVerifier

__all__ = [
    "CODE_SKIP_DETAIL",
    "FACTORIES",
    "STATUSES",
    "CodeTestsVerifier",
    "DomainVerifiers",
    "ExactAnswerVerifier",
    "ExtractionVerifier",
    "FieldMatchVerifier",
    "MathVerifier",
    "PrecomputedVerifier",
    "SkippedVerifier",
    "ToolUseVerifier",
    "Verdict",
    "VerdictStatus",
    "Verifier",
    "VerifierRegistry",
    "default_registry",
    "final_answer",
    "normalize_answer",
]
