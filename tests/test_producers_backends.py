"""Generation backends: the torch backend's logprobs and version spans, the HTTP backend's checks
against scripted servers that misbehave the ways real ones do (HAZARDS.md)."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from backend_support import CausalMeanPolicy, FakeServer, completion, model_card
from safetensors.torch import save_file

from producers.backends import (
    BadResponseError,
    HttpBackend,
    HttpOptions,
    InvalidRequestError,
    LogprobModeError,
    RetryableGenerationError,
    SamplingParams,
    TorchBackend,
    VersionSpan,
    WeightsError,
    file_sha256,
)

FAST = HttpOptions(attempts=3, backoff_s=0.01, backoff_max_s=0.02, timeout_s=10)


def reference_logprob(logits: torch.Tensor, token: int, params: SamplingParams) -> float:
    """log p(token) under temperature, then top-k, then top-p, computed row by row in float64."""
    scaled = [x / params.temperature for x in logits.double().tolist()]
    order = sorted(range(len(scaled)), key=lambda i: -scaled[i])
    kept = order[: params.top_k] if params.top_k else order
    peak = max(scaled[i] for i in kept)
    weights = {i: math.exp(scaled[i] - peak) for i in kept}
    total = sum(weights.values())
    nucleus, mass = [], 0.0
    for i in kept:
        if mass >= params.top_p:
            break
        nucleus.append(i)
        mass += weights[i] / total
    if token not in nucleus:
        return -math.inf
    return math.log(weights[token] / sum(weights[i] for i in nucleus))


def make_policy(kind: str, vocab_size: int) -> torch.nn.Module:
    if kind == "transformer":
        from consumers.policies import load_policy

        return load_policy("transformer", vocab_size=vocab_size)  # type: ignore[return-value]
    return CausalMeanPolicy(vocab_size)


@pytest.mark.parametrize(
    ("kind", "temperature", "top_k", "top_p"),
    [
        ("stand-in", 0.7, 12, 0.9),
        ("stand-in", 0.4, None, 0.3),
        ("stand-in", 1.5, 3, 1.0),
        ("transformer", 0.7, 12, 0.9),
    ],
)
def test_torch_logprobs_equal_a_recomputation_of_the_processed_distribution(
    kind: str, temperature: float, top_k: int | None, top_p: float
) -> None:
    model = make_policy(kind, 40)
    backend = TorchBackend(model, eos_id=None)
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, max_tokens=10, n=4, seed=11)
    prompt = [3, 1, 4, 1, 5]
    samples = asyncio.run(backend.generate(prompt, params))
    assert len(samples) == 4
    if top_p > 0.5:
        assert len({tuple(s.token_ids) for s in samples}) > 1, "a group of 4 drew 4 equal samples"
    for sample in samples:
        assert sample.finish_reason == "length" and len(sample.token_ids) == 10
        assert sample.weight_versions == [VersionSpan(0, 10, 0)] and sample.logprob_mode == "processed"
        full = torch.tensor([prompt + sample.token_ids])
        with torch.no_grad():
            logits = model(full, torch.ones_like(full, dtype=torch.bool))[0]
        for t, (token, logprob) in enumerate(zip(sample.token_ids, sample.logprobs, strict=True)):
            expected = reference_logprob(logits[len(prompt) + t - 1], token, params)
            assert math.isfinite(expected), f"token {t} was drawn from outside top-k/top-p"
            assert logprob == pytest.approx(expected, abs=1e-5)
    again = asyncio.run(backend.generate(prompt, params))
    assert [s.token_ids for s in again] == [s.token_ids for s in samples], "the same seed drew differently"


def test_torch_greedy_stops_at_eos_and_stop_ids() -> None:
    model = CausalMeanPolicy(30)
    prompt = [2, 7]
    with torch.no_grad():
        first = int(model(torch.tensor([prompt]), torch.ones(1, 2, dtype=torch.bool))[0, -1].argmax())
    stop_at_first = TorchBackend(model, eos_id=first)
    [sample] = asyncio.run(stop_at_first.generate(prompt, SamplingParams(temperature=0, max_tokens=5)))
    assert sample.token_ids == [first] and sample.finish_reason == "stop" and sample.logprobs == [0.0]
    plain = TorchBackend(model, eos_id=None)
    [free] = asyncio.run(plain.generate(prompt, SamplingParams(temperature=0, max_tokens=6)))
    stop = free.token_ids[2]
    [cut] = asyncio.run(
        plain.generate(prompt, SamplingParams(temperature=0, max_tokens=6, stop_token_ids=(stop,)))
    )
    assert cut.token_ids == free.token_ids[: free.token_ids.index(stop) + 1] and cut.finish_reason == "stop"


class SwappingPolicy(CausalMeanPolicy):
    """Stages new weights into its backend during its `at`-th call, as a learner publishing would."""

    def __init__(self, vocab_size: int, at: int, new: dict[str, torch.Tensor]) -> None:
        super().__init__(vocab_size)
        self.calls, self.at, self.new = 0, at, new
        self.backend: TorchBackend | None = None

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        out = super().forward(input_ids, attention_mask)
        if self.calls == self.at and self.backend is not None:
            self.backend.stage_weights(self.new, version=7)
        self.calls += 1
        return out


def test_torch_swap_mid_generation_records_the_span_change_at_the_first_new_token() -> None:
    new_model = CausalMeanPolicy(25, seed=5)
    model = SwappingPolicy(25, at=3, new=new_model.state_dict())
    old_model = CausalMeanPolicy(25)
    backend = TorchBackend(model, version=6)
    model.backend = backend
    params = SamplingParams(max_tokens=8, n=2, seed=1)
    prompt = [1, 2, 3]
    samples = asyncio.run(backend.generate(prompt, params))
    assert backend.version == 7
    for sample in samples:
        assert sample.weight_versions == [VersionSpan(0, 4, 6), VersionSpan(4, 8, 7)]
        assert sample.policy_version == 6 and sample.spans_exact
        full = torch.tensor([prompt + sample.token_ids])
        mask = torch.ones_like(full, dtype=torch.bool)
        with torch.no_grad():
            old = torch.log_softmax(old_model(full, mask)[0], -1)
            new = torch.log_softmax(new_model(full, mask)[0], -1)
        for t, token in enumerate(sample.token_ids):
            made_by = old if t < 4 else new
            assert sample.logprobs[t] == pytest.approx(float(made_by[len(prompt) + t - 1, token]), abs=1e-5)


def test_torch_set_weights_checks_version_sha256_and_shapes(tmp_path: Path) -> None:
    backend = TorchBackend(CausalMeanPolicy(20), version=1)
    path = tmp_path / "v2.safetensors"
    save_file(CausalMeanPolicy(20, seed=3).state_dict(), str(path))
    with pytest.raises(WeightsError, match="sha256"):
        asyncio.run(backend.set_weights(path, version=2, sha256="0" * 64))
    with pytest.raises(WeightsError, match="not newer"):
        asyncio.run(backend.set_weights(path, version=1, sha256=file_sha256(path)))
    with pytest.raises(WeightsError, match="shape"):
        asyncio.run(backend.set_weights(CausalMeanPolicy(21).state_dict(), version=2))
    assert backend.version == 1
    asyncio.run(backend.set_weights(path, version=2, sha256=file_sha256(path)))
    assert backend.version == 2
    [sample] = asyncio.run(backend.generate([1], SamplingParams(max_tokens=3)))
    assert sample.weight_versions == [VersionSpan(0, 3, 2)]
    with pytest.raises(InvalidRequestError, match="outside the vocabulary"):
        asyncio.run(backend.generate([20], SamplingParams(max_tokens=3)))


@pytest.fixture
def fake() -> Iterator[Any]:
    servers: list[FakeServer] = []

    def start(routes: dict[tuple[str, str], Any]) -> FakeServer:
        servers.append(FakeServer(routes))
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


def generate(url: str, prompt: list[int], params: SamplingParams, options: HttpOptions = FAST) -> list[Any]:
    async def run() -> list[Any]:
        backend = HttpBackend(url, options)
        try:
            return await backend.generate(prompt, params)
        finally:
            await backend.close()

    return asyncio.run(run())


def test_http_one_choice_for_n_gets_separate_requests(fake: Any) -> None:
    counter = iter(range(100))

    def one_choice(body: Any) -> tuple[int, Any]:
        k = next(counter)
        return 200, completion([k, k + 1], [-0.5, -0.25])

    server = fake({("GET", "/v1/models"): model_card(), ("POST", "/v1/completions"): one_choice})

    async def run() -> tuple[list[Any], list[Any]]:
        backend = HttpBackend(server.url, FAST)
        params = SamplingParams(n=4, max_tokens=4, seed=10)
        first = await backend.generate([1, 2], params)
        second = await backend.generate([1, 2], params)
        await backend.close()
        return first, second

    first, second = asyncio.run(run())
    assert len(first) == len(second) == 4
    assert len({tuple(s.token_ids) for s in first + second}) == 8
    asked = [(body["n"], body.get("seed")) for body in server.calls("POST", "/v1/completions")]
    # The first request asks for n = 4; the three separate ones run at once, in any order.
    assert asked[0] == (4, 10) and sorted(asked[1:4]) == [(1, 11), (1, 12), (1, 13)]
    assert sorted(asked[4:]) == [(1, 10), (1, 11), (1, 12), (1, 13)], "the second group asked for n > 1 again"
    assert all(
        body["prompt"] == [1, 2] and body["return_token_ids"]
        for body in server.calls("POST", "/v1/completions")
    )


def tokenizer_routes(ids: list[int], detokenized: str) -> dict[tuple[str, str], Any]:
    return {
        ("POST", "/tokenize"): lambda body: (200, {"tokens": ids, "count": len(ids)}),
        ("POST", "/detokenize"): lambda body: (200, {"prompt": detokenized}),
    }


def test_http_missing_token_ids_recovered_only_when_the_round_trip_verifies(fake: Any) -> None:
    base = {
        ("GET", "/v1/models"): model_card(),
        ("POST", "/v1/completions"): lambda body: (200, completion(None, [-1.0, -2.0], text="ab")),
    }
    good = fake(base | tokenizer_routes([1, 2], "ab"))
    [sample] = generate(good.url, [5], SamplingParams(max_tokens=2))
    assert sample.token_ids == [1, 2] and sample.logprobs == [-1.0, -2.0]
    assert good.calls("POST", "/tokenize")[0]["prompt"] == "ab"

    wrong_count = fake(base | tokenizer_routes([1, 2, 3], "ab"))
    with pytest.raises(BadResponseError, match="does not verify: 3 ids for 2 logprobs"):
        generate(wrong_count.url, [5], SamplingParams(max_tokens=2))
    wrong_text = fake(base | tokenizer_routes([1, 2], "a b"))
    with pytest.raises(BadResponseError, match=r"does not verify.*different from"):
        generate(wrong_text.url, [5], SamplingParams(max_tokens=2))
    no_tokenizer = fake(base)
    with pytest.raises(BadResponseError, match="no token ids"):
        generate(no_tokenizer.url, [5], SamplingParams(max_tokens=2))


def test_http_retries_a_500_then_succeeds(fake: Any) -> None:
    answers = iter([(500, b"overloaded"), (503, b"warming up"), (200, completion([4, 2], [-0.1, -0.2]))])
    server = fake(
        {("GET", "/v1/models"): model_card(), ("POST", "/v1/completions"): lambda body: next(answers)}
    )
    [sample] = generate(server.url, [1], SamplingParams(max_tokens=2))
    assert sample.token_ids == [4, 2] and len(server.calls("POST", "/v1/completions")) == 3


def test_http_gives_up_retryably_when_the_server_stays_down(fake: Any) -> None:
    server = fake(
        {("GET", "/v1/models"): model_card(), ("POST", "/v1/completions"): lambda body: (502, b"bad gateway")}
    )
    with pytest.raises(RetryableGenerationError, match=r"HTTP 502.*gave up after 3 attempts"):
        generate(server.url, [1], SamplingParams(max_tokens=2))
    assert len(server.calls("POST", "/v1/completions")) == 3
    gone = FakeServer({})
    gone.stop()
    with pytest.raises(RetryableGenerationError, match="connection failed"):
        generate(gone.url, [1], SamplingParams(max_tokens=2))


def test_http_garbage_json_is_not_retried(fake: Any) -> None:
    server = fake(
        {("GET", "/v1/models"): model_card(), ("POST", "/v1/completions"): lambda body: (200, b"{choices: [")}
    )
    with pytest.raises(BadResponseError, match="not JSON") as caught:
        generate(server.url, [1], SamplingParams(max_tokens=2))
    assert not caught.value.retryable and len(server.calls("POST", "/v1/completions")) == 1


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        (completion([1, 2, 3], [-1.0, -1.0]), "3 token ids but 2 logprobs"),
        (
            {
                "choices": [
                    {
                        "token_ids": [1],
                        "logprobs": {"token_logprobs": [float("nan")]},
                        "finish_reason": "length",
                    }
                ]
            },
            "finite",
        ),
        (completion([1, 2, 3, 4], [-1.0] * 4), "more than max_tokens 3"),
        (
            {
                "choices": [
                    {"token_ids": [1], "logprobs": {"token_logprobs": [-1.0]}, "finish_reason": "abort"}
                ]
            },
            "finish_reason 'abort'",
        ),
        ({"choices": [{"token_ids": [1], "finish_reason": "stop"}]}, "no logprobs"),
        (completion([1], [-1.0], n=2), "asked for 1 samples, got 2"),
        ({"error": "nope"}, "no 'choices'"),
    ],
    ids=["misaligned", "nan", "too-long", "aborted", "no-logprobs", "extra-choices", "no-choices"],
)
def test_http_refuses_bad_answers(fake: Any, answer: Any, error: str) -> None:
    server = fake(
        {("GET", "/v1/models"): model_card(), ("POST", "/v1/completions"): lambda body: (200, answer)}
    )
    with pytest.raises(BadResponseError, match=error):
        generate(server.url, [1], SamplingParams(max_tokens=3))


def test_http_refuses_truncated_sampling_against_raw_logprobs(fake: Any) -> None:
    server = fake(
        {
            ("GET", "/v1/models"): model_card(mode=None),
            ("POST", "/v1/completions"): lambda body: (200, completion([1], [-1.0])),
        }
    )
    with pytest.raises(LogprobModeError, match=r"raw logprobs.*temperature 0\.7"):
        generate(server.url, [1], SamplingParams(temperature=0.7, max_tokens=1))
    assert server.calls("POST", "/v1/completions") == [], "the refused request was sent"
    [at_one] = generate(server.url, [1], SamplingParams(temperature=1.0, max_tokens=1))
    assert at_one.logprob_mode == "raw"
    knowingly = HttpOptions(attempts=1, allow_raw_logprobs=True)
    [raw] = generate(server.url, [1], SamplingParams(temperature=0.7, max_tokens=1), knowingly)
    assert raw.logprob_mode == "raw" and raw.sampling.temperature == 0.7
    declared = HttpOptions(attempts=1, logprob_mode="processed")
    [processed] = generate(server.url, [1], SamplingParams(temperature=0.7, top_k=5, max_tokens=1), declared)
    assert processed.logprob_mode == "processed"


def test_http_version_change_during_a_request_records_an_inexact_span(fake: Any) -> None:
    version = [3]

    def swap_while_generating(body: Any) -> tuple[int, Any]:
        version[0] = 4
        return 200, completion([1, 2, 3], [-1.0] * 3)

    server = fake(
        {
            ("GET", "/v1/models"): lambda body: (
                200,
                {"data": [{"id": "m", "weight_version": version[0], "logprob_mode": "processed"}]},
            ),
            ("POST", "/v1/completions"): swap_while_generating,
        }
    )
    [sample] = generate(server.url, [1], SamplingParams(max_tokens=3), HttpOptions(attempts=1, model="m"))
    assert sample.weight_versions == [VersionSpan(0, 3, 3), VersionSpan(3, 3, 4)]
    assert not sample.spans_exact and sample.policy_version == 3


def test_http_without_a_server_version_needs_one_set_by_hand(fake: Any) -> None:
    server = fake(
        {
            ("GET", "/v1/models"): model_card(version=None),
            ("POST", "/v1/completions"): lambda body: (200, completion([1], [-1.0])),
        }
    )
    with pytest.raises(InvalidRequestError, match="set_version"):
        generate(server.url, [1], SamplingParams(max_tokens=1))
    [sample] = generate(server.url, [1], SamplingParams(max_tokens=1), HttpOptions(attempts=1, version=9))
    assert sample.weight_versions == [VersionSpan(0, 1, 9)]


def test_http_sglang_dialect(fake: Any) -> None:
    def answer(body: Any) -> tuple[int, Any]:
        n = body["sampling_params"]["n"]
        return 200, [
            {
                "text": "xy",
                "output_ids": [7 + i, 8],
                "meta_info": {
                    "output_token_logprobs": [[-0.5, 7 + i, None], [-1.5, 8, None]],
                    "finish_reason": {"type": "stop"},
                },
            }
            for i in range(n)
        ]

    server = fake(
        {
            ("GET", "/get_model_info"): lambda body: (200, {"model_path": "m", "weight_version": "5"}),
            ("POST", "/generate"): answer,
        }
    )
    options = HttpOptions(dialect="sglang", attempts=1, logprob_mode="processed")
    samples = generate(server.url, [1, 2], SamplingParams(n=3, max_tokens=2, temperature=0.6), options)
    assert [s.token_ids for s in samples] == [[7, 8], [8, 8], [9, 8]]
    assert all(s.logprobs == [-0.5, -1.5] and s.weight_versions == [VersionSpan(0, 2, 5)] for s in samples)
    [body] = server.calls("POST", "/generate")
    assert (
        body["input_ids"] == [1, 2]
        and body["return_logprob"]
        and body["sampling_params"]["max_new_tokens"] == 2
    )
