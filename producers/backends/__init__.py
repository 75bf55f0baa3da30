"""Generation backends behind one interface: OpenAI-compatible or SGLang HTTP, and in-process torch."""

from producers.backends.base import (
    FinishReason,
    GeneratedSample,
    GenerationBackend,
    LogprobMode,
    ModelInfo,
    SamplingParams,
    Tokenizer,
    VersionSpan,
)
from producers.backends.exceptions import (
    BadResponseError,
    GenerationError,
    InvalidRequestError,
    LogprobModeError,
    RetryableGenerationError,
    TokenizerMismatchError,
    WeightsError,
)
from producers.backends.http import HttpBackend, HttpOptions
from producers.backends.torch_backend import PolicyModel, TorchBackend
from producers.backends.weights import file_sha256, load_weights

__all__ = [
    "BadResponseError",
    "FinishReason",
    "GeneratedSample",
    "GenerationBackend",
    "GenerationError",
    "HttpBackend",
    "HttpOptions",
    "InvalidRequestError",
    "LogprobMode",
    "LogprobModeError",
    "ModelInfo",
    "PolicyModel",
    "RetryableGenerationError",
    "SamplingParams",
    "Tokenizer",
    "TokenizerMismatchError",
    "TorchBackend",
    "VersionSpan",
    "WeightsError",
    "file_sha256",
    "load_weights",
]
