"""The one small interface every generation backend speaks: a prompt in, a group of samples out."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, NamedTuple, Protocol, runtime_checkable

FinishReason = Literal["stop", "length"]
LogprobMode = Literal["processed", "raw"]
"""`processed`: logprobs of the distribution the token was drawn from (after temperature, top-k,
top-p); `raw`: of the model's unmodified distribution. Only `processed` ones are sampling logprobs
(and `raw` ones too at temperature 1 without truncation)."""


@dataclass(frozen=True)
class SamplingParams:
    """How to sample a group; validated on construction.

    Attributes:
        temperature: 0 is greedy (each token's logprob is then 0, the log of a point mass).
        top_p: nucleus mass kept, in (0, 1]; 1 keeps everything.
        top_k: tokens kept by rank; None keeps everything.
        max_tokens: most tokens generated per sample, stop token included.
        stop_token_ids: tokens that end a sample (kept as its last token), besides the model's eos.
        seed: makes a group reproducible on backends that take one; None draws fresh.
        n: samples in the group (one prompt).
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    max_tokens: int = 256
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None
    n: int = 1

    def __post_init__(self) -> None:
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"temperature must be finite and >= 0, got temperature={self.temperature}")
        if not (0 < self.top_p <= 1):
            raise ValueError(f"top_p must lie in (0, 1], got top_p={self.top_p}")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k must be >= 1 or None (no limit), got top_k={self.top_k}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got max_tokens={self.max_tokens}")
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got n={self.n}")
        if any(not isinstance(t, int) or t < 0 for t in self.stop_token_ids):
            raise ValueError(f"stop_token_ids must be non-negative ints, got {self.stop_token_ids!r}")
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))

    @property
    def truncates(self) -> bool:
        """Whether the sampling distribution differs from the raw one (raw logprobs would be wrong)."""
        return self.temperature != 1.0 or self.top_p < 1.0 or self.top_k is not None


class VersionSpan(NamedTuple):
    """Tokens [start, end) of a sample were generated with weights `version`."""

    start: int
    end: int
    version: int


@dataclass(frozen=True)
class GeneratedSample:
    """One sample of a group, its tokens aligned one to one with their sampling logprobs.

    Attributes:
        token_ids: the generated tokens (the prompt excluded).
        logprobs: the logprob each token was drawn with, one per token.
        finish_reason: "stop" (a stop or eos token, kept as the last token) or "length".
        text: the tokens' text when the backend has a tokenizer, else None.
        weight_versions: spans covering [0, len(token_ids)); one span when the version did not
            change. When `spans_exact` is False the switch token is unknown: the spans are
            `[(0, n, before), (n, n, after)]`, every token attributed to the older version.
        logprob_mode: which distribution the logprobs are of (`LogprobMode`).
        sampling: the parameters the sample was drawn with.
        spans_exact: whether the spans' boundaries are the tokens where the weights changed.
    """

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    weight_versions: list[VersionSpan]
    logprob_mode: LogprobMode
    sampling: SamplingParams
    text: str | None = None
    spans_exact: bool = True

    @property
    def policy_version(self) -> int:
        """The version the sample began on: the oldest that made it, so staleness is never understated."""
        return self.weight_versions[0].version


@dataclass(frozen=True)
class ModelInfo:
    """What a backend knows of its model; a field is None when the server does not say."""

    model_id: str | None = None
    vocab_size: int | None = None
    max_length: int | None = None
    logprob_mode: LogprobMode | None = None
    weight_version: int | None = None
    extra: dict[str, object] = field(default_factory=dict)


@runtime_checkable
class GenerationBackend(Protocol):
    """Generates groups of samples for token-id prompts, stamped with the weight version(s) used."""

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> list[GeneratedSample]:
        """Exactly `params.n` samples of one prompt, or a `GenerationError`."""
        ...

    async def current_version(self) -> int:
        """The weight version the backend generates with now."""
        ...

    async def model_info(self) -> ModelInfo:
        """The model's vocabulary size, length limit, logprob mode and version, where known."""
        ...

    async def close(self) -> None:
        """Release connections and threads; the backend is unusable afterwards."""
        ...


class Tokenizer(Protocol):
    """Text to token ids and back; what `rollstream serve` needs for /tokenize and /detokenize."""

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


def single_span(length: int, version: int) -> list[VersionSpan]:
    """The spans of a sample made wholly by one version."""
    return [VersionSpan(0, length, version)]


def before_after_spans(length: int, before: int, after: int) -> tuple[list[VersionSpan], bool]:
    """Spans for a sample whose server read `before` ahead of the request and `after` behind it.

    Returns the spans and whether they are exact. When the versions differ the switch token is
    unknown: all tokens go to `before` and a zero-length span at the end records `after`.
    """
    if before == after:
        return single_span(length, before), True
    return [VersionSpan(0, length, before), VersionSpan(length, length, after)], False


def check_spans(spans: Sequence[VersionSpan], length: int) -> str | None:
    """Why `spans` do not cover [0, length) in order without gaps, or None when they do."""
    if not spans:
        return "no version spans"
    if spans[0].start != 0 or spans[-1].end != length:
        return f"spans {list(spans)} do not cover tokens [0, {length})"
    for prev, nxt in itertools.pairwise(spans):
        if prev.end != nxt.start:
            return f"spans {list(spans)} leave a gap or overlap at token {prev.end}"
    if any(s.end < s.start for s in spans):
        return f"spans {list(spans)} have an end before their start"
    return None
