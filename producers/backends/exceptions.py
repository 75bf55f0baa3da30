"""Errors of the generation backends: retryable (the server is away) or not (the answer is bad)."""

from __future__ import annotations

from producers.exceptions import ProducerError


class GenerationError(ProducerError):
    """A group could not be generated; `retryable` says whether the same request may succeed later."""

    retryable: bool = False


class RetryableGenerationError(GenerationError):
    """The server is unavailable for now: a 5xx or 429, a refused or dropped connection, a timeout.

    The backend has already retried with backoff; a worker releases the task for a later attempt.
    """

    retryable = True


class BadResponseError(GenerationError):
    """The server answered something unusable: not JSON, missing or misaligned token ids and
    logprobs, non-finite logprobs, more tokens than asked for, the wrong number of choices.

    Retrying the same request against the same server would not help; the message names the field.
    """


class InvalidRequestError(GenerationError):
    """The request cannot be served as asked: the server refused it (4xx, its code in `status`), or
    the prompt or the sampling parameters are out of the model's range."""

    status: int | None = None


class LogprobModeError(InvalidRequestError):
    """The server reports raw logprobs, which are not the sampling logprobs under these settings."""


class TokenizerMismatchError(InvalidRequestError):
    """A text prompt's tokenization does not round-trip (its ids detokenize to other text), or the
    task names a tokenizer other than the model's: no attempt can succeed, so the task is dead."""


class WeightsError(ProducerError):
    """A weights file or state dict was refused: wrong sha256, a version not newer, keys or shapes
    that do not match the model, or an unreadable file."""
