"""`rollstream serve`: a torch policy behind the OpenAI-compatible API the HTTP backend speaks.

Generation is the producers' `TorchBackend`; this module adds the HTTP surface (completions with
token ids, logprobs and weight-version spans, vLLM's tokens-in/tokens-out generate, model card,
tokenize, weight reload by version, health, Prometheus ``/metrics``), a JSONL log of every sample returned, and a uvicorn
server that stops on SIGTERM.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, cast

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict

from infra.exceptions import InfraError
from infra.serve_metrics import ServeMetrics
from producers.backends import (
    GeneratedSample,
    GenerationError,
    InvalidRequestError,
    PolicyModel,
    SamplingParams,
    Tokenizer,
    TorchBackend,
    WeightsError,
)
from producers.backends.weights import check_compatible, load_weights

log = logging.getLogger(__name__)


class ServeError(InfraError):
    """`rollstream serve` cannot start: a policy, tokenizer or weights file that does not load."""


class GenerateSampling(BaseModel):
    """The sampling parameters of a `/inference/v1/generate` request this server honours."""

    model_config = ConfigDict(extra="ignore")

    n: int = 1
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    seed: int | None = None
    stop_token_ids: list[int] = []


class CompletionRequest(GenerateSampling):
    """The fields of an OpenAI completions request this server honours (the sampling parameters at
    the top level, beside the prompt); others are ignored."""

    prompt: list[int] | str
    model: str | None = None


class GenerateRequest(BaseModel):
    """vLLM's tokens-in/tokens-out request: prompt ids and sampling parameters."""

    model_config = ConfigDict(extra="ignore")

    token_ids: list[int]
    sampling_params: GenerateSampling = GenerateSampling()
    model: str | None = None


class WeightsUpdate(BaseModel):
    """A published version to load: the safetensors file, its sha256 and its number."""

    path: str
    sha256: str
    version: int


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    prompt: str


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    tokens: list[int]


def _error(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status_code=status)


class ResponseLog:
    """Appends one JSON line per returned sample; each line is flushed before the answer leaves."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._stream = path.open("a", encoding="utf-8")
        self._lock = threading.Lock()

    def write(self, lines: list[dict[str, Any]]) -> None:
        text = "".join(json.dumps(line, allow_nan=False) + "\n" for line in lines)
        with self._lock:
            self._stream.write(text)
            self._stream.flush()

    def close(self) -> None:
        with self._lock:
            self._stream.close()


class PolicyServer:
    """The HTTP surface over one `TorchBackend`; `app` is the FastAPI application.

    Args:
        backend: generates and holds the weights (swapped by version).
        model_id: the name in `/v1/models` and in every answer.
        tokenizer: enables `/tokenize`, `/detokenize` and each choice's `text`.
        response_log: where every returned sample is logged (JSONL), if anywhere.
    """

    def __init__(
        self,
        backend: TorchBackend,
        *,
        model_id: str,
        tokenizer: Tokenizer | None = None,
        response_log: Path | None = None,
    ) -> None:
        self.backend = backend
        self.model_id = model_id
        self.tokenizer = tokenizer
        self.log = ResponseLog(response_log) if response_log else None
        self.follow: tuple[str, float] | None = None
        self._updating = asyncio.Lock()
        self.app = FastAPI(title="rollstream serve", docs_url=None, redoc_url=None)
        self.app.add_api_route("/v1/completions", self.completions, methods=["POST"])
        self.app.add_api_route("/inference/v1/generate", self.generate, methods=["POST"])
        self.app.add_api_route("/v1/models", self.models, methods=["GET"])
        self.app.add_api_route("/tokenize", self.tokenize, methods=["POST"])
        self.app.add_api_route("/detokenize", self.detokenize, methods=["POST"])
        self.app.add_api_route("/update_weights_from_disk", self.update_weights, methods=["POST"])
        self.app.add_api_route("/health", self.health, methods=["GET"])
        self.metrics = ServeMetrics(lambda: self.backend.version)
        self.metrics.install(self.app)

    async def completions(self, request: CompletionRequest) -> Any:
        """Samples for a token-id prompt, with token ids, processed logprobs and version spans."""
        if isinstance(request.prompt, str):
            return _error(400, "give the prompt as token ids (POST /tokenize turns text into ids)")
        answer = await self._sample(request.prompt, request, prefix="cmpl")
        if isinstance(answer, JSONResponse):
            return answer
        request_id, samples = answer
        choices = []
        for index, sample in enumerate(samples):
            logprobs: dict[str, Any] = {"token_logprobs": sample.logprobs}
            if self.tokenizer is not None:
                logprobs["tokens"] = [self.tokenizer.decode([t]) for t in sample.token_ids]
            choices.append(
                {
                    "index": index,
                    "text": sample.text,
                    "token_ids": sample.token_ids,
                    "logprobs": logprobs,
                    "finish_reason": sample.finish_reason,
                    "weight_versions": [list(span) for span in sample.weight_versions],
                    "logprob_mode": sample.logprob_mode,
                }
            )
        completion_tokens = sum(len(s.token_ids) for s in samples)
        return {
            "id": request_id,
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.model_id,
            "choices": choices,
            "usage": {
                "prompt_tokens": len(request.prompt),
                "completion_tokens": completion_tokens,
                "total_tokens": len(request.prompt) * len(samples) + completion_tokens,
            },
            "logprob_mode": "processed",
        }

    async def generate(self, request: GenerateRequest) -> Any:
        """vLLM's tokens-in/tokens-out answer: token ids, chat-style logprobs, spans per token range."""
        answer = await self._sample(request.token_ids, request.sampling_params, prefix="gen")
        if isinstance(answer, JSONResponse):
            return answer
        request_id, samples = answer
        choices = []
        for index, sample in enumerate(samples):
            content = [
                {
                    "token": self.tokenizer.decode([t]) if self.tokenizer is not None else f"token_id:{t}",
                    "logprob": logprob,
                    "top_logprobs": [],
                }
                for t, logprob in zip(sample.token_ids, sample.logprobs, strict=True)
            ]
            choices.append(
                {
                    "index": index,
                    "token_ids": sample.token_ids,
                    "logprobs": {"content": content},
                    "finish_reason": sample.finish_reason,
                    "weight_versions": [list(span) for span in sample.weight_versions],
                    "logprob_mode": sample.logprob_mode,
                }
            )
        return {"request_id": request_id, "choices": choices}

    async def _sample(
        self, prompt: list[int], sampling: CompletionRequest | GenerateSampling, *, prefix: str
    ) -> tuple[str, list[GeneratedSample]] | JSONResponse:
        """Generate, log every sample, and return them with a request id; an error as its answer."""
        try:
            params = SamplingParams(
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                top_k=sampling.top_k if sampling.top_k and sampling.top_k > 0 else None,
                max_tokens=sampling.max_tokens,
                stop_token_ids=tuple(sampling.stop_token_ids),
                seed=sampling.seed,
                n=sampling.n,
            )
            started = time.monotonic()
            samples = await self.backend.generate(prompt, params)
            self.metrics.generated(
                time.monotonic() - started, len(samples), sum(len(s.token_ids) for s in samples)
            )
        except (ValueError, InvalidRequestError) as exc:
            return _error(400, str(exc))
        except GenerationError as exc:
            return _error(500, str(exc), "server_error")
        request_id = f"{prefix}-{uuid.uuid4().hex}"
        if self.log is not None:
            lines = [
                {
                    "request_id": request_id,
                    "index": index,
                    "prompt_ids": prompt,
                    "token_ids": sample.token_ids,
                    "logprobs": sample.logprobs,
                    "finish_reason": sample.finish_reason,
                    "weight_versions": [list(span) for span in sample.weight_versions],
                }
                for index, sample in enumerate(samples)
            ]
            await asyncio.to_thread(self.log.write, lines)
        return request_id, samples

    async def models(self) -> dict[str, Any]:
        """The model card: id, vocab_size, max_model_len, weight_version, logprob_mode."""
        info = await self.backend.model_info()
        card = {
            "id": self.model_id,
            "object": "model",
            "owned_by": "rollstream",
            "vocab_size": info.vocab_size,
            "max_model_len": info.max_length,
            "weight_version": info.weight_version,
            "logprob_mode": info.logprob_mode,
        }
        return {"object": "list", "data": [card]}

    async def tokenize(self, request: TokenizeRequest) -> Any:
        """Text to token ids with the loaded tokenizer: {"tokens": [...], "count": n}."""
        if self.tokenizer is None:
            return _error(404, "no tokenizer loaded: start rollstream serve with --tokenizer FILE")
        try:
            tokens = self.tokenizer.encode(request.prompt)
        except ValueError as exc:  # a character outside the vocabulary
            return _error(400, f"the prompt cannot be tokenized: {exc}")
        vocab = self.backend.vocab_size
        if outside := [t for t in tokens if not 0 <= t < vocab]:
            return _error(
                400,
                f"the tokenizer gives ids {outside[:5]} outside the model's vocabulary [0, {vocab}): "
                "it is not the model's tokenizer",
            )
        return {"tokens": tokens, "count": len(tokens), "max_model_len": self.backend.max_length}

    async def detokenize(self, request: DetokenizeRequest) -> Any:
        """Token ids to text with the loaded tokenizer: {"prompt": text}."""
        if self.tokenizer is None:
            return _error(404, "no tokenizer loaded: start rollstream serve with --tokenizer FILE")
        try:
            return {"prompt": self.tokenizer.decode(request.tokens)}
        except ValueError as exc:  # an id outside the vocabulary
            return _error(400, f"the tokens cannot be detokenized: {exc}")

    async def update_weights(self, request: WeightsUpdate) -> Any:
        """Load a published version off the request path and swap it in; 400 when it is refused."""
        async with self._updating:
            try:
                await self.backend.set_weights(request.path, version=request.version, sha256=request.sha256)
            except WeightsError as exc:
                self.metrics.reloads.labels("refused").inc()
                return _error(400, str(exc))
        self.metrics.reloads.labels("loaded").inc()
        return {"success": True, "weight_version": self.backend.version, "message": f"loaded {request.path}"}

    async def follow_versions(self, lake_uri: str, interval_s: float) -> None:
        """Poll the lake's policies table; load and swap in each newer version (sha256 checked)."""
        from consumers.weights import PolicyWatcher
        from consumers.weights import load_weights as load_published

        watcher = PolicyWatcher(lake_uri)
        while True:
            try:
                record = await asyncio.to_thread(watcher.latest)
                if record is not None and record.number > self.backend.version:
                    tensors = await asyncio.to_thread(load_published, record)
                    async with self._updating:
                        await self.backend.set_weights(tensors, version=record.number)
                    self.metrics.reloads.labels("loaded").inc()
                    log.info("serving policy version %d (step %d)", record.number, record.step)
            except Exception as exc:  # a version that does not load now may load at the next poll
                self.metrics.reloads.labels("failed").inc()
                log.warning("following %s: %s", lake_uri, exc)
            await asyncio.sleep(interval_s)

    async def health(self) -> dict[str, Any]:
        """Liveness and the version being served."""
        return {"status": "ok", "weight_version": self.backend.version}


def load_policy(spec: str, *, vocab_size: int) -> PolicyModel:
    """The policy named by `spec`, through `consumers.policies` ("tiny", "transformer", "module:factory")."""
    try:
        from consumers.policies import load_policy as load
    except ModuleNotFoundError as exc:  # a checkout without the policies package: import paths only
        if exc.name not in ("consumers.policies", "consumers"):
            raise
        module, sep, factory = spec.partition(":")
        if not sep:
            raise ServeError(
                f"--policy {spec!r}: consumers.policies is missing here; give module:factory"
            ) from exc
        try:
            return cast(PolicyModel, getattr(importlib.import_module(module), factory)(vocab_size=vocab_size))
        except (ImportError, AttributeError, TypeError) as err:
            raise ServeError(f"--policy {spec!r} does not load: {err}") from err
    return cast(PolicyModel, load(spec, vocab_size=vocab_size))


def load_tokenizer(spec: str) -> Tokenizer:
    """A tokenizer file (`schemas.tokenizer.CharTokenizer.load`), or `module:factory` when no such file."""
    path = Path(spec)
    if not path.exists() and ":" in spec:
        module, _, factory = spec.partition(":")
        try:
            return cast(Tokenizer, getattr(importlib.import_module(module), factory)())
        except (ImportError, AttributeError, TypeError) as exc:
            raise ServeError(f"--tokenizer {spec!r} does not load: {exc}") from exc
    if not path.exists():
        raise ServeError(f"--tokenizer {spec}: no such file")
    try:
        from schemas.tokenizer import CharTokenizer
    except ModuleNotFoundError as exc:
        raise ServeError("--tokenizer FILE needs schemas.tokenizer, which is not in this checkout") from exc
    return CharTokenizer.load(path)


@dataclass(frozen=True)
class ServeOptions:
    """What `rollstream serve` serves and where.

    Attributes:
        policy: "tiny", "transformer" or "module:factory" (see `load_policy`).
        vocab_size: the policy's vocabulary; None takes the tokenizer's.
        weights: a safetensors state dict to start from, with its `sha256`; None keeps the policy's own.
        version: the version of the starting weights.
        tokenizer: a tokenizer file or `module:factory`; None serves token ids only.
        eos_id: the token that ends a sample; None takes the tokenizer's `eos_id`, if it has one.
        host: the address to bind; 127.0.0.1 keeps it on this machine.
        port: the port; 0 picks a free one (the listening line says which).
        response_log: a JSONL file of every returned sample.
        follow_lake: a lake whose ``policies`` table the server polls, loading each newer version
            (sha256 checked) and swapping it in while it keeps serving; None: only explicit updates.
        follow_interval_s: seconds between polls of that table.
    """

    policy: str
    vocab_size: int | None = None
    weights: Path | None = None
    sha256: str | None = None
    version: int = 0
    tokenizer: str | None = None
    eos_id: int | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    response_log: Path | None = None
    follow_lake: str | None = None
    follow_interval_s: float = 0.5


def build_server(options: ServeOptions) -> PolicyServer:
    """Load the policy, tokenizer and starting weights named by `options`."""
    tokenizer = load_tokenizer(options.tokenizer) if options.tokenizer else None
    vocab_size = options.vocab_size or getattr(tokenizer, "vocab_size", None)
    if not isinstance(vocab_size, int):
        raise ServeError("give --vocab-size (or a --tokenizer that states its vocab_size)")
    model = load_policy(options.policy, vocab_size=vocab_size)
    if options.weights is not None:
        if not options.sha256:
            raise ServeError(f"--weights {options.weights}: give its --sha256 from the version's record")
        try:
            tensors = load_weights(options.weights, options.sha256)
            check_compatible(tensors, model.state_dict(), source=str(options.weights))
        except WeightsError as exc:
            raise ServeError(str(exc)) from exc
        model.load_state_dict(tensors, strict=True)
    eos_id = options.eos_id if options.eos_id is not None else getattr(tokenizer, "eos_id", None)
    backend = TorchBackend(
        model,
        version=options.version,
        eos_id=eos_id if isinstance(eos_id, int) else None,
        tokenizer=tokenizer,
        model_id=options.policy,
    )
    server = PolicyServer(
        backend, model_id=options.policy, tokenizer=tokenizer, response_log=options.response_log
    )
    if options.follow_lake is not None:
        server.follow = (options.follow_lake, options.follow_interval_s)
    return server


def run(server: PolicyServer, *, host: str, port: int, announce: Callable[[str], None]) -> int:
    """Serve until SIGTERM (returns 0) or Ctrl-C (returns 130); `announce` gets the URL once listening."""
    import uvicorn

    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ServeError(
            f"cannot listen on {host}:{port}: {exc}; pick another --port (0: any free one)"
        ) from exc
    sock.listen(128)
    bound = sock.getsockname()[1]
    config = uvicorn.Config(
        server.app, log_level="warning", access_log=False, lifespan="off", timeout_graceful_shutdown=10
    )
    userver = uvicorn.Server(config)
    stopped_by: list[int] = []

    def note(sig: int, _frame: FrameType | None) -> None:
        stopped_by.append(sig)

    # uvicorn handles both signals while serving, then restores these and re-raises what it caught.
    previous = {sig: signal.signal(sig, note) for sig in (signal.SIGTERM, signal.SIGINT)}

    async def serve() -> None:
        task = asyncio.create_task(userver.serve(sockets=[sock]))
        follower = None
        if server.follow is not None:
            follower = asyncio.create_task(server.follow_versions(*server.follow))
            task.add_done_callback(lambda _: follower.cancel())
        while not userver.started and not task.done():
            await asyncio.sleep(0.02)
        if userver.started:
            shown = f"[{host}]" if ":" in host else host
            announce(f"http://{shown}:{bound}")
        await task

    try:
        asyncio.run(serve())
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        sock.close()
        if server.log is not None:
            server.log.close()
    return 130 if signal.SIGINT in stopped_by else 0
