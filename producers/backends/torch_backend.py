"""In-process generation with a torch policy: for tests, the CPU demo, and `rollstream serve`.

Sampling is autoregressive without a KV cache; the n samples of a group share the prompt and run
as one batch. Weight updates take effect between token steps: each step holds the model lock,
so a sample generated across an update gets a span change at the first token the new weights made.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from producers.backends.base import (
    FinishReason,
    GeneratedSample,
    ModelInfo,
    SamplingParams,
    Tokenizer,
    VersionSpan,
)
from producers.backends.exceptions import GenerationError, InvalidRequestError, WeightsError
from producers.backends.sampling import draw, processed_logprobs
from producers.backends.weights import check_compatible, load_weights


class PolicyModel(Protocol):
    """What the torch backend needs of a policy: causal logits and a state dict to swap.

    `model(input_ids (B, L) long, attention_mask (B, L) bool)` returns logits (B, L, V) where
    position t predicts token t + 1. An optional int attribute `max_length` bounds prompt + output.
    """

    @property
    def vocab_size(self) -> int: ...

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(
        self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False
    ) -> Any: ...


@dataclass
class _Staged:
    tensors: dict[str, torch.Tensor]
    version: int


class TorchBackend:
    """Generates groups with a torch policy in this process; the torch work runs off the event loop.

    Args:
        model: the policy (see `PolicyModel`); put in eval mode when it is an `nn.Module`.
        version: the version of the weights the model holds now.
        eos_id: the token that ends a sample, besides each request's stop ids; None for none.
        tokenizer: decodes each sample's text when given.
        model_id: the name `model_info` reports.
        device: where the model's parameters live.
    """

    def __init__(
        self,
        model: PolicyModel,
        *,
        version: int = 0,
        eos_id: int | None = None,
        tokenizer: Tokenizer | None = None,
        model_id: str = "policy",
        device: str | torch.device = "cpu",
    ) -> None:
        self._model = model
        if isinstance(model, torch.nn.Module):
            model.eval()
        self._version = version
        self._eos_id = eos_id
        self._tokenizer = tokenizer
        self._model_id = model_id
        self._device = torch.device(device)
        self._lock = threading.Lock()  # held by each token step and by the swap
        self._staging = threading.Lock()  # guards _staged
        self._staged: _Staged | None = None
        max_length = getattr(model, "max_length", None)
        self._max_length = max_length if isinstance(max_length, int) else None

    @property
    def vocab_size(self) -> int:
        """The model's vocabulary size."""
        return int(self._model.vocab_size)

    @property
    def version(self) -> int:
        """The weight version tokens are generated with now."""
        return self._version

    @property
    def max_length(self) -> int | None:
        """The model's bound on prompt + output tokens, when it states one (`max_length`)."""
        return self._max_length

    @property
    def tokenizer(self) -> Tokenizer | None:
        """The tokenizer samples are decoded with, if any."""
        return self._tokenizer

    async def current_version(self) -> int:
        """The weight version tokens are generated with now."""
        return self._version

    async def model_info(self) -> ModelInfo:
        """Vocabulary size, length limit (None when the model has no `max_length`), mode and version."""
        return ModelInfo(
            model_id=self._model_id,
            vocab_size=self.vocab_size,
            max_length=self._max_length,
            logprob_mode="processed",
            weight_version=self._version,
        )

    async def close(self) -> None:
        """Nothing to release: the model stays with its owner."""

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> list[GeneratedSample]:
        """`params.n` samples of the prompt, drawn as one batch in a worker thread."""
        prompt = self._check_prompt(prompt_ids, params)
        return await asyncio.to_thread(self._generate, prompt, params)

    async def set_weights(
        self,
        weights: Mapping[str, torch.Tensor] | str | Path,
        *,
        version: int,
        sha256: str | None = None,
    ) -> None:
        """Load new weights off the event loop and swap them in; returns once they are in place.

        `weights` is a state dict or a safetensors file whose sha256 must equal `sha256`. The swap
        waits for the token step in progress, never for a whole generation. `version` must be newer
        than the current and any staged version.
        """
        await asyncio.to_thread(self.stage_weights, weights, version=version, sha256=sha256)
        await asyncio.to_thread(self._apply_staged)

    def stage_weights(
        self,
        weights: Mapping[str, torch.Tensor] | str | Path,
        *,
        version: int,
        sha256: str | None = None,
    ) -> None:
        """Check and stage weights; the next token step of any generation (or `set_weights`) swaps them in."""
        self._check_newer(version)
        if isinstance(weights, str | Path):
            if not sha256:
                raise WeightsError(f"weights file {weights}: give its sha256 (from the version's record)")
            tensors = load_weights(weights, sha256)
            source = str(weights)
        else:
            tensors = dict(weights)
            source = f"the state dict of version {version}"
        check_compatible(tensors, self._model.state_dict(), source=source)
        staged = {k: v.detach().to(self._device, copy=True) for k, v in tensors.items()}
        with self._staging:
            self._check_newer(version)
            self._staged = _Staged(staged, version)

    def _check_newer(self, version: int) -> None:
        staged = self._staged
        newest = max(self._version, staged.version if staged else self._version)
        if version <= newest:
            raise WeightsError(
                f"weights version {version} is not newer than version {newest} already loaded or "
                "staged; versions only go forward: publish under a new number"
            )

    def _apply_staged(self) -> None:
        with self._lock:
            self._swap_locked()

    def _swap_locked(self) -> None:
        with self._staging:
            staged = self._staged
            if staged is not None:
                self._model.load_state_dict(staged.tensors, strict=True)
                self._version = staged.version
                self._staged = None

    def _check_prompt(self, prompt_ids: Sequence[int], params: SamplingParams) -> list[int]:
        prompt = [int(t) for t in prompt_ids]
        if not prompt:
            raise InvalidRequestError("the prompt is empty: give at least one token id")
        bad = [t for t in prompt if not 0 <= t < self.vocab_size]
        if bad:
            raise InvalidRequestError(
                f"prompt token ids {bad[:5]} lie outside the vocabulary [0, {self.vocab_size}); "
                "tokenize with the policy's tokenizer"
            )
        if self._max_length is not None and len(prompt) + params.max_tokens > self._max_length:
            raise InvalidRequestError(
                f"prompt of {len(prompt)} tokens + max_tokens {params.max_tokens} exceeds the model's "
                f"max length {self._max_length}; shorten the prompt or lower max_tokens"
            )
        return prompt

    def _generate(self, prompt: list[int], params: SamplingParams) -> list[GeneratedSample]:
        n = params.n
        stops = set(params.stop_token_ids) | ({self._eos_id} if self._eos_id is not None else set())
        generator = torch.Generator(device=self._device)
        if params.seed is None:
            generator.seed()
        else:
            generator.manual_seed(params.seed)
        ids = torch.tensor([prompt] * n, dtype=torch.long, device=self._device)
        tokens: list[list[int]] = [[] for _ in range(n)]
        logprobs: list[list[float]] = [[] for _ in range(n)]
        finish: list[FinishReason] = ["length"] * n
        active = list(range(n))
        step_versions: list[int] = []
        for step in range(params.max_tokens):
            rows = ids[active]
            mask = torch.ones_like(rows, dtype=torch.bool)
            with self._lock:
                self._swap_locked()
                step_versions.append(self._version)
                with torch.inference_mode():
                    logits = self._model(rows, mask)
            last = self._last_logits(logits, rows)
            processed = processed_logprobs(last, params)
            drawn = draw(processed, generator)
            chosen = processed.gather(1, drawn[:, None]).squeeze(1)
            if not torch.isfinite(chosen).all():
                raise GenerationError(
                    f"a drawn token has a non-finite logprob at step {step}: check the model"
                )
            next_ids = torch.zeros(n, dtype=torch.long, device=self._device)
            next_ids[active] = drawn
            ids = torch.cat([ids, next_ids[:, None]], dim=1)
            still: list[int] = []
            for row, token, logprob in zip(active, drawn.tolist(), chosen.tolist(), strict=True):
                tokens[row].append(token)
                logprobs[row].append(logprob)
                if token in stops:
                    finish[row] = "stop"
                else:
                    still.append(row)
            active = still
            if not active:
                break
        return [
            GeneratedSample(
                token_ids=tokens[i],
                logprobs=logprobs[i],
                finish_reason=finish[i],
                weight_versions=_spans(step_versions[: len(tokens[i])]),
                logprob_mode="processed",
                sampling=params,
                text=self._tokenizer.decode(tokens[i]) if self._tokenizer is not None else None,
            )
            for i in range(n)
        ]

    def _last_logits(self, logits: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        expected = (rows.shape[0], rows.shape[1], self.vocab_size)
        if tuple(logits.shape) != expected:
            raise GenerationError(
                f"the policy returned logits of shape {tuple(logits.shape)}, expected {expected} "
                "(batch, length, vocab_size): check the policy's forward and its vocab_size"
            )
        last = logits[:, -1, :]
        if not torch.isfinite(last).all():
            raise GenerationError("the policy returned non-finite logits: check its weights")
        return last


def _spans(step_versions: Sequence[int]) -> list[VersionSpan]:
    spans: list[VersionSpan] = []
    for index, version in enumerate(step_versions):
        if spans and spans[-1].version == version:
            spans[-1] = spans[-1]._replace(end=index + 1)
        else:
            spans.append(VersionSpan(index, index + 1, version))
    return spans
