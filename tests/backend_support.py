"""Stand-ins for the backend and server tests: a causal policy, a tokenizer, a scripted HTTP server.

`rollstream serve --policy backend_support:causal_policy` loads it (with tests/ on PYTHONPATH).
"""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import torch
from torch import nn


class CausalMeanPolicy(nn.Module):
    """Embedding, running mean over the prefix, linear head: logits at t depend on tokens 0..t."""

    def __init__(self, vocab_size: int, dim: int = 16, seed: int = 0) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.max_length = 512
        generator = torch.Generator().manual_seed(seed)
        self.embed = nn.Embedding(vocab_size, dim)
        self.head = nn.Linear(dim, vocab_size)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=generator) * 0.5)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        weights = attention_mask.float().unsqueeze(-1)
        summed = torch.cumsum(self.embed(input_ids) * weights, dim=1)
        counts = torch.cumsum(weights, dim=1).clamp_min(1.0)
        return self.head(torch.tanh(summed / counts))

    def packed_logits(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, cu_seqlens: torch.Tensor
    ) -> torch.Tensor:
        bounds = cu_seqlens.tolist()
        parts = [
            self.forward(input_ids[:, a:b], torch.ones(1, b - a, dtype=torch.bool))
            for a, b in itertools.pairwise(bounds)
        ]
        return torch.cat(parts, dim=1)


def causal_policy(*, vocab_size: int, **_: object) -> CausalMeanPolicy:
    """The `module:factory` entry point `rollstream serve --policy` calls."""
    return CausalMeanPolicy(vocab_size)


class CharTokenizer:
    """Letters a-z as ids 1..26, id 0 as eos (decoded as nothing)."""

    eos_id = 0
    vocab_size = 27

    def encode(self, text: str) -> list[int]:
        return [ord(c) - 96 for c in text]

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(chr(96 + i) for i in ids if i)

    @classmethod
    def load(cls, path: object) -> CharTokenizer:
        return cls()


Route = Callable[[Any], tuple[int, Any]]


class FakeServer:
    """A scripted HTTP server on 127.0.0.1 (a free port), in a thread: misbehaving on purpose.

    `routes` maps (method, path) to a function of the decoded JSON body returning (status, answer);
    an answer of type bytes is sent as is, anything else as JSON. Every request is recorded.
    """

    def __init__(self, routes: dict[tuple[str, str], Route]) -> None:
        self.routes = routes
        self.requests: list[tuple[str, str, Any]] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self, method: str) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw else None
                fake.requests.append((method, self.path, body))
                route = fake.routes.get((method, self.path))
                status, answer = route(body) if route else (404, {"error": f"no route {self.path}"})
                data = answer if isinstance(answer, bytes) else json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._serve("GET")

            def do_POST(self) -> None:
                self._serve("POST")

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()

    def calls(self, method: str, path: str) -> list[Any]:
        """The bodies of the requests made to one route, in order."""
        return [body for m, p, body in self.requests if (m, p) == (method, path)]

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)


def model_card(
    *, version: int | None = 0, mode: str | None = "processed", vocab_size: int | None = 27
) -> Route:
    """A /v1/models route stating what is given."""
    card: dict[str, Any] = {"id": "fake", "object": "model"}
    for key, value in (("weight_version", version), ("logprob_mode", mode), ("vocab_size", vocab_size)):
        if value is not None:
            card[key] = value
    return lambda _body: (200, {"object": "list", "data": [card]})


def completion(
    token_ids: list[int] | None, logprobs: list[float], *, text: str | None = None, n: int = 1
) -> dict[str, Any]:
    """An OpenAI completions answer of `n` identical choices."""
    choice: dict[str, Any] = {
        "text": text,
        "logprobs": {"token_logprobs": logprobs},
        "finish_reason": "length",
    }
    if token_ids is not None:
        choice["token_ids"] = token_ids
    return {"choices": [dict(choice, index=i) for i in range(n)]}
