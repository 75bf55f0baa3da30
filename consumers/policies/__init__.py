"""Policies (model definitions): the `Policy` interface, shipped policies, scoring helpers, a sampler."""

from consumers.policies.base import (
    DirectScoring,
    PackedIndex,
    Policy,
    packed_index,
    shifted_entropy,
    shifted_logprobs,
    token_entropy_packed,
    token_entropy_padded,
    token_logprobs_packed,
    token_logprobs_padded,
)
from consumers.policies.exceptions import PolicySpecError
from consumers.policies.registry import load_policy, policy_spec_names
from consumers.policies.sampling import Sample, sample
from consumers.policies.tiny import DEFAULT_VOCAB_SIZE, TinyPolicy
from consumers.policies.transformer import TransformerPolicy

__all__ = [
    "DEFAULT_VOCAB_SIZE",
    "DirectScoring",
    "PackedIndex",
    "Policy",
    "PolicySpecError",
    "Sample",
    "TinyPolicy",
    "TransformerPolicy",
    "load_policy",
    "packed_index",
    "policy_spec_names",
    "sample",
    "shifted_entropy",
    "shifted_logprobs",
    "token_entropy_packed",
    "token_entropy_padded",
    "token_logprobs_packed",
    "token_logprobs_padded",
]
