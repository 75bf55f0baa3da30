"""Generation over HTTP from OpenAI-compatible servers (vLLM, `rollstream serve`) or SGLang.

Token ids go in and come out; text is never retokenized unless the server's own tokenize round
trip verifies. Every answer is checked (choice count, ids, alignment, finiteness, length, logprob
mode) and refused with a `BadResponseError` rather than trusted. Requests retry with exponential
backoff on 5xx, 429, connection errors and timeouts; a semaphore bounds those in flight, and no
slot is held while waiting to retry.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx
import tenacity

from producers.backends.base import (
    GeneratedSample,
    LogprobMode,
    ModelInfo,
    SamplingParams,
    before_after_spans,
)
from producers.backends.exceptions import (
    BadResponseError,
    GenerationError,
    InvalidRequestError,
    LogprobModeError,
    RetryableGenerationError,
    TokenizerMismatchError,
)
from producers.backends.responses import (
    Choice,
    check_choice,
    completion_choices,
    generate_choices,
    model_card,
    sglang_choices,
    version_field,
)

log = logging.getLogger(__name__)

Dialect = Literal["openai", "generate", "sglang"]
_INFO_PATH: dict[Dialect, str] = {
    "openai": "/v1/models",
    "generate": "/v1/models",
    "sglang": "/get_model_info",
}


@dataclass(frozen=True)
class HttpOptions:
    """How an `HttpBackend` talks to its server.

    Attributes:
        dialect: "openai" posts `/v1/completions` (vLLM, `rollstream serve`); "generate" posts
            vLLM's tokens-in/tokens-out `/inference/v1/generate` (vLLM, `rollstream serve`), whose
            choices may state `weight_versions` per token range; "sglang" posts `/generate`.
        model: the served model's name; None takes the first of `/v1/models` (openai dialect).
        logprob_mode: what the server's logprobs are of. "auto" believes the server's model card
            (`logprob_mode`, which `rollstream serve` reports) and otherwise assumes "raw", as vLLM
            does unless started with `--logprobs-mode processed_logprobs`.
        allow_raw_logprobs: accept raw logprobs under temperature != 1 or top-k/top-p (recorded as
            "raw" on each sample); by default such a request is refused before it is sent.
        version: the weight version when the server reports none (set it by hand, or `set_version`).
        version_path: where the server states its version; default `/v1/models` or `/get_model_info`.
        timeout_s: the longest wait for one answer, a whole group's generation.
        connect_timeout_s: the longest wait to connect.
        max_in_flight: requests in flight at once through this backend.
        attempts: tries per request before a `RetryableGenerationError` reaches the caller.
        backoff_s: the first wait between tries, doubled each time up to `backoff_max_s`.
        backoff_max_s: the longest wait between tries.
        headers: sent with every request, e.g. {"Authorization": "Bearer ..."} for vLLM's --api-key.
    """

    dialect: Dialect = "openai"
    model: str | None = None
    logprob_mode: Literal["auto", "processed", "raw"] = "auto"
    allow_raw_logprobs: bool = False
    version: int | None = None
    version_path: str | None = None
    timeout_s: float = 300.0
    connect_timeout_s: float = 5.0
    max_in_flight: int = 32
    attempts: int = 5
    backoff_s: float = 0.5
    backoff_max_s: float = 10.0
    headers: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.dialect not in _INFO_PATH:
            raise ValueError(
                f"dialect must be 'openai', 'generate' or 'sglang', got dialect={self.dialect!r}"
            )
        if self.max_in_flight < 1 or self.attempts < 1:
            raise ValueError(
                f"max_in_flight and attempts must be >= 1, got {self.max_in_flight} and {self.attempts}"
            )


class HttpBackend:
    """A `GenerationBackend` over one server's HTTP API.

    Args:
        base_url: the server's root, e.g. "http://127.0.0.1:8000" (without /v1).
        options: see `HttpOptions`.
        transport: an httpx transport to use instead of the network (tests, proxies).
    """

    def __init__(
        self,
        base_url: str,
        options: HttpOptions | None = None,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.options = options or HttpOptions()
        self.base_url = base_url.rstrip("/")
        o = self.options
        self._client = httpx.AsyncClient(
            base_url=self.base_url,
            timeout=httpx.Timeout(o.timeout_s, connect=o.connect_timeout_s),
            limits=httpx.Limits(max_connections=o.max_in_flight, max_keepalive_connections=o.max_in_flight),
            headers=dict(o.headers),
            transport=transport,
        )
        self._slots = asyncio.Semaphore(o.max_in_flight)
        self._fixed_version = o.version
        self._mode: LogprobMode | None = None if o.logprob_mode == "auto" else o.logprob_mode
        self._model = o.model
        self._n_honoured: bool | None = None

    def set_version(self, version: int) -> None:
        """The version to stamp when the server reports none (e.g. after reloading it yourself)."""
        self._fixed_version = version

    async def current_version(self) -> int:
        """The version the server reports now, else the one set by hand."""
        path = self.options.version_path or _INFO_PATH[self.options.dialect]
        version = version_field(await self._call("GET", path))
        if version is not None:
            return version
        if self._fixed_version is not None:
            return self._fixed_version
        raise InvalidRequestError(
            f"{self.base_url}{path} states no numeric weight_version: pass HttpOptions(version=N) "
            "or call set_version(N) with the version the server was loaded with"
        )

    async def model_info(self) -> ModelInfo:
        """The server's model card: id, vocab_size, max length, logprob mode and version where stated."""
        body = await self._call("GET", _INFO_PATH[self.options.dialect])
        card = model_card(body)
        mode = card.get("logprob_mode")
        max_length = card.get("max_model_len", card.get("max_length", card.get("context_length")))
        model_id = card.get("id", card.get("model_path"))
        return ModelInfo(
            model_id=model_id if isinstance(model_id, str) else None,
            vocab_size=_int_or_none(card.get("vocab_size")),
            max_length=_int_or_none(max_length),
            logprob_mode=mode if mode in ("processed", "raw") else None,
            weight_version=version_field(body),
            extra=card,
        )

    async def close(self) -> None:
        """Close the connection pool."""
        await self._client.aclose()

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> list[GeneratedSample]:
        """`params.n` checked samples, stamped from the versions read before and after the requests."""
        prompt = [int(t) for t in prompt_ids]
        if not prompt or min(prompt) < 0:
            raise InvalidRequestError(
                f"the prompt must be non-empty non-negative token ids, got {prompt[:8]}"
            )
        mode = await self._logprob_mode()
        self._refuse_raw(mode, params, where=f"{self.base_url} (logprob mode {mode!r})")
        before = await self.current_version()
        choices = await self._group(prompt, params)
        after = await self.current_version()
        samples = []
        for i, choice in enumerate(choices):
            where = f"{self.base_url}: sample {i}"
            ids = choice.token_ids if choice.token_ids is not None else await self._recover_ids(choice, where)
            check_choice(choice, ids, params, where=where)
            sample_mode: LogprobMode = "raw" if choice.logprob_mode == "raw" else mode
            self._refuse_raw(sample_mode, params, where=where)
            if choice.spans is not None:
                spans, exact = choice.spans, True
            else:
                spans, exact = before_after_spans(len(ids), before, after)
            samples.append(
                GeneratedSample(
                    token_ids=ids,
                    logprobs=choice.logprobs,
                    finish_reason=choice.finish_reason,
                    weight_versions=spans,
                    logprob_mode=sample_mode,
                    sampling=params,
                    text=choice.text,
                    spans_exact=exact,
                )
            )
        return samples

    async def _group(self, prompt: list[int], params: SamplingParams) -> list[Choice]:
        n = params.n
        got: list[Choice] = []
        if n == 1 or self._n_honoured is not False:
            got = await self._request(prompt, params, n=n, seed=params.seed)
        if len(got) > n:
            raise BadResponseError(f"{self.base_url}: asked for {n} samples, got {len(got)}")
        if n > 1:
            if len(got) < n and self._n_honoured is not False:
                log.warning(
                    "%s returned %d of n=%d samples: making one request per missing sample from now on",
                    self.base_url,
                    len(got),
                    n,
                )
            self._n_honoured = len(got) == n if self._n_honoured is None else self._n_honoured
        singles = await asyncio.gather(
            *(
                self._request(prompt, params, n=1, seed=None if params.seed is None else params.seed + i)
                for i in range(len(got), n)
            )
        )
        for single in singles:
            if len(single) != 1:
                raise BadResponseError(f"{self.base_url}: asked for 1 sample, got {len(single)}")
            got.extend(single)
        return got

    async def _request(
        self, prompt: list[int], params: SamplingParams, *, n: int, seed: int | None
    ) -> list[Choice]:
        if self.options.dialect == "sglang":
            sampling: dict[str, Any] = {
                "temperature": params.temperature,
                "top_p": params.top_p,
                "top_k": params.top_k if params.top_k is not None else -1,
                "max_new_tokens": params.max_tokens,
                "stop_token_ids": list(params.stop_token_ids),
                "n": n,
            }
            if seed is not None:
                sampling["sampling_seed"] = seed
            body = {"input_ids": prompt, "sampling_params": sampling, "return_logprob": True}
            return sglang_choices(
                await self._call("POST", "/generate", body), where=f"{self.base_url}/generate"
            )
        if self.options.dialect == "generate":
            sampling = {
                "n": n,
                "max_tokens": params.max_tokens,
                "temperature": params.temperature,
                "top_p": params.top_p,
                "logprobs": 0,
                "stop_token_ids": list(params.stop_token_ids),
            }
            if params.top_k is not None:
                sampling["top_k"] = params.top_k
            if seed is not None:
                sampling["seed"] = seed
            body = {"token_ids": prompt, "sampling_params": sampling}
            if model := await self._model_name():
                body["model"] = model
            path = "/inference/v1/generate"
            return generate_choices(await self._call("POST", path, body), where=f"{self.base_url}{path}")
        request: dict[str, Any] = {
            "prompt": prompt,
            "n": n,
            "max_tokens": params.max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "logprobs": 1,
            "return_token_ids": True,
            "stop_token_ids": list(params.stop_token_ids),
        }
        if params.top_k is not None:
            request["top_k"] = params.top_k
        if seed is not None:
            request["seed"] = seed
        if model := await self._model_name():
            request["model"] = model
        path = "/v1/completions"
        return completion_choices(await self._call("POST", path, request), where=f"{self.base_url}{path}")

    async def tokenize(self, text: str) -> list[int]:
        """A text prompt's ids from the server's `/tokenize`, kept only if `/detokenize` gives the text back.

        Raises:
            TokenizerMismatchError: the server's tokenizer refuses the text (HTTP 400), or its ids
                detokenize to other text; the task cannot succeed on any attempt.
            InvalidRequestError: the server has no tokenize endpoint, or answered it with garbage.
            RetryableGenerationError: the server is unavailable for now.
        """
        where = f"{self.base_url}/tokenize"
        try:
            ids, back = await self._round_trip(text)
        except (RetryableGenerationError, TokenizerMismatchError):
            raise
        except InvalidRequestError as exc:
            if exc.status not in (400, 422):
                raise InvalidRequestError(
                    f"{where} cannot tokenize the prompt ({exc}); start the server with its tokenizer "
                    "(vLLM serves /tokenize and /detokenize; rollstream serve needs --tokenizer), give the "
                    "worker --tokenizer FILE, or submit the task with token ids"
                ) from exc
            raise TokenizerMismatchError(
                f"{where}: the server's tokenizer refuses the prompt {text!r:.80} ({exc}); submit the task "
                "with the model's token ids"
            ) from exc
        except GenerationError as exc:
            raise InvalidRequestError(
                f"{where} cannot tokenize the prompt ({exc}); start the server with its tokenizer "
                "(vLLM serves /tokenize and /detokenize; rollstream serve needs --tokenizer), give the "
                "worker --tokenizer FILE, or submit the task with token ids"
            ) from exc
        if back != text:
            raise TokenizerMismatchError(
                f"{where}: the prompt's {len(ids)} ids detokenize to {back!r:.80} rather than the prompt "
                f"{text!r:.80}: the server's tokenizer cannot represent this text exactly; submit the task "
                "with the model's token ids"
            )
        return ids

    async def _round_trip(self, text: str) -> tuple[list[int], str | None]:
        """`text` through `/tokenize` and its ids back through `/detokenize`, unchecked."""
        extra = {"model": self._model} if self._model else {}
        tokenized = await self._call(
            "POST", "/tokenize", {"prompt": text, "add_special_tokens": False, **extra}
        )
        ids = tokenized.get("tokens") if isinstance(tokenized, dict) else None
        if not isinstance(ids, list) or any(not isinstance(t, int) or isinstance(t, bool) for t in ids):
            raise BadResponseError(f"/tokenize answered {tokenized!r:.200}, not {{'tokens': [ids]}}")
        detokenized = await self._call("POST", "/detokenize", {"tokens": ids, **extra})
        back = detokenized.get("prompt") if isinstance(detokenized, dict) else None
        return [int(t) for t in ids], back if isinstance(back, str) else None

    async def _recover_ids(self, choice: Choice, where: str) -> list[int]:
        fix = "ask the server for token ids (vLLM: return_token_ids; SGLang: output_ids)"
        if choice.text is None:
            raise BadResponseError(f"{where}: the server sent neither token ids nor text; {fix}")
        try:
            ids, text = await self._round_trip(choice.text)
        except RetryableGenerationError:
            raise
        except GenerationError as exc:
            raise BadResponseError(
                f"{where}: the server sent no token ids and /tokenize could not recover them ({exc}); {fix}"
            ) from exc
        if text != choice.text or len(ids) != len(choice.logprobs):
            raise BadResponseError(
                f"{where}: the server sent no token ids and the tokenize round trip does not verify: "
                f"{len(ids)} ids for {len(choice.logprobs)} logprobs, detokenized text "
                f"{'equal to' if text == choice.text else 'different from'} the sample's; refusing to "
                f"guess the tokens; {fix}"
            )
        return ids

    async def _logprob_mode(self) -> LogprobMode:
        if self._mode is None:
            stated = (await self.model_info()).logprob_mode
            self._mode = stated or "raw"
        return self._mode

    def _refuse_raw(self, mode: LogprobMode, params: SamplingParams, *, where: str) -> None:
        if mode == "raw" and params.truncates and not self.options.allow_raw_logprobs:
            raise LogprobModeError(
                f"{where}: the server reports raw logprobs, which are not the sampling logprobs at "
                f"temperature {params.temperature}, top_p {params.top_p}, top_k {params.top_k}. Start vLLM "
                "with --logprobs-mode processed_logprobs and pass HttpOptions(logprob_mode='processed'), "
                "or sample at temperature 1 without top-k/top-p, or pass allow_raw_logprobs=True to "
                "record raw logprobs knowingly"
            )

    async def _model_name(self) -> str | None:
        if self._model is None:
            self._model = (await self.model_info()).model_id or ""
        return self._model or None

    async def _call(self, method: str, path: str, body: Any = None) -> Any:
        o = self.options
        result: Any = None
        try:
            async for attempt in tenacity.AsyncRetrying(
                stop=tenacity.stop_after_attempt(o.attempts),
                wait=tenacity.wait_exponential(multiplier=o.backoff_s, max=o.backoff_max_s),
                retry=tenacity.retry_if_exception_type(RetryableGenerationError),
                before_sleep=self._log_retry,
                reraise=True,
            ):
                with attempt:
                    result = await self._once(method, path, body)
        except RetryableGenerationError as exc:
            raise RetryableGenerationError(f"{exc} (gave up after {o.attempts} attempts)") from exc
        return result

    async def _once(self, method: str, path: str, body: Any) -> Any:
        url = f"{self.base_url}{path}"
        async with self._slots:
            try:
                response = await self._client.request(method, path, json=body)
            except httpx.TimeoutException as exc:
                raise RetryableGenerationError(
                    f"{method} {url}: no answer within the timeout ({type(exc).__name__}); "
                    "raise HttpOptions(timeout_s=...) for long generations"
                ) from exc
            except httpx.TransportError as exc:
                raise RetryableGenerationError(f"{method} {url}: connection failed: {exc!r}") from exc
        status = response.status_code
        if status >= 500 or status == 429:
            raise RetryableGenerationError(f"{method} {url}: HTTP {status}: {response.text[:300]}")
        if status >= 400:
            refused = InvalidRequestError(
                f"{method} {url}: the server refused the request with HTTP {status}: {response.text[:300]}"
            )
            refused.status = status
            raise refused
        try:
            return response.json()
        except ValueError as exc:
            raise BadResponseError(
                f"{method} {url}: HTTP {status} answer is not JSON: {response.text[:200]!r}"
            ) from exc

    def _log_retry(self, state: tenacity.RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome else None
        wait = state.next_action.sleep if state.next_action else 0.0
        log.warning(
            "attempt %d of %d failed: %s; retrying in %.2f s",
            state.attempt_number,
            self.options.attempts,
            error,
            wait,
        )


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
