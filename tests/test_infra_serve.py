"""`rollstream serve` as a real subprocess on loopback, driven by the HTTP backend."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from backend_support import CausalMeanPolicy, CharTokenizer
from safetensors.torch import save_file

from producers.backends import (
    BadResponseError,
    HttpBackend,
    HttpOptions,
    ModelInfo,
    SamplingParams,
    TokenizerMismatchError,
    VersionSpan,
    file_sha256,
)
from producers.backends.http import Dialect
from producers.backends.responses import generate_choices

ROOT = Path(__file__).resolve().parents[1]
VOCAB = CharTokenizer.vocab_size
START_TIMEOUT_S = 90


@dataclass
class Served:
    url: str
    log: Path
    process: subprocess.Popen[str]

    def logged(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.log.read_text().splitlines()]


def start(tmp: Path, *extra: str) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")]))
    command = [sys.executable, "-m", "infra.cli", "serve", "--policy", "backend_support:causal_policy"]
    command += ["--vocab-size", str(VOCAB), "--port", "0", *extra]
    return subprocess.Popen(
        command, cwd=tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def listening_url(process: subprocess.Popen[str]) -> str:
    """The URL the server prints once it listens; fails with its stderr when it exits first."""
    found: list[str] = []
    reader = threading.Thread(
        target=lambda: found.append(process.stdout.readline() if process.stdout else "")
    )
    reader.start()
    reader.join(START_TIMEOUT_S)
    line = found[0] if found else ""
    if not line.startswith("listening on "):
        process.kill()
        _, err = process.communicate(timeout=30)
        raise AssertionError(f"rollstream serve did not start: stdout {line!r}, stderr {err[-2000:]}")
    return line.split()[-1]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("serve")
    log = tmp / "responses.jsonl"
    process = start(tmp, "--tokenizer", "backend_support:CharTokenizer", "--response-log", str(log))
    try:
        yield Served(listening_url(process), log, process)
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGTERM)
        try:
            _, err = process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            raise
    assert process.returncode == 0, f"rollstream serve exited {process.returncode} on SIGTERM: {err[-2000:]}"


def drive(
    url: str, prompt: list[int], params: SamplingParams, dialect: Dialect = "openai"
) -> tuple[list[Any], ModelInfo]:
    async def run() -> tuple[list[Any], ModelInfo]:
        backend = HttpBackend(url, HttpOptions(dialect=dialect, attempts=2, backoff_s=0.05))
        try:
            return await backend.generate(prompt, params), await backend.model_info()
        finally:
            await backend.close()

    return asyncio.run(run())


def test_a_group_is_exactly_what_the_server_logged(served: Served) -> None:
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    params = SamplingParams(temperature=0.8, top_k=10, top_p=0.95, max_tokens=12, n=4, seed=7)
    samples, info = drive(served.url, prompt, params)
    assert (info.vocab_size, info.logprob_mode, info.max_length) == (VOCAB, "processed", 512)
    logged = [line for line in served.logged() if line["prompt_ids"] == prompt]
    assert len(samples) == len(logged) == 4 and len({line["request_id"] for line in logged}) == 1
    version = info.weight_version
    for sample, line in zip(samples, sorted(logged, key=lambda line: line["index"]), strict=True):
        assert sample.token_ids == line["token_ids"] and sample.logprobs == line["logprobs"]
        assert sample.finish_reason == line["finish_reason"]
        assert (
            sample.weight_versions == [VersionSpan(0, len(sample.token_ids), version)] and sample.spans_exact
        )
        assert sample.logprob_mode == "processed" and sample.text == CharTokenizer().decode(sample.token_ids)
        assert all(-50 < lp <= 0 for lp in sample.logprobs)


def test_the_tokens_in_tokens_out_dialect_is_exactly_what_the_server_logged(served: Served) -> None:
    prompt = [2, 7, 1, 8, 2, 8]
    params = SamplingParams(temperature=0.7, top_k=8, max_tokens=10, n=3, seed=11)
    samples, info = drive(served.url, prompt, params, dialect="generate")
    logged = sorted(
        (line for line in served.logged() if line["prompt_ids"] == prompt), key=lambda x: x["index"]
    )
    assert len(samples) == len(logged) == 3 and logged[0]["request_id"].startswith("gen-")
    for sample, line in zip(samples, logged, strict=True):
        assert (sample.token_ids, sample.logprobs) == (line["token_ids"], line["logprobs"])
        assert [list(span) for span in sample.weight_versions] == line["weight_versions"]
        assert sample.spans_exact and sample.weight_versions[0].version == info.weight_version
        assert sample.logprob_mode == "processed" and sample.sampling == params


def test_the_generate_dialect_takes_the_servers_spans_per_token_range() -> None:
    content = [
        {"token": "a", "logprob": -0.5},
        {"token": "b", "logprob": -1.0},
        {"token": "c", "logprob": -2.0},
    ]
    body = {
        "request_id": "r",
        "choices": [
            {
                "index": 0,
                "token_ids": [1, 2, 3],
                "logprobs": {"content": content},
                "finish_reason": "length",
                "weight_versions": [[0, 2, 4], [2, 3, 5]],
            }
        ],
    }
    (choice,) = generate_choices(body, where="test")
    assert choice.spans == [VersionSpan(0, 2, 4), VersionSpan(2, 3, 5)]
    assert (choice.token_ids, choice.logprobs) == ([1, 2, 3], [-0.5, -1.0, -2.0])
    body["choices"][0]["logprobs"] = None  # type: ignore[index]
    with pytest.raises(BadResponseError, match=r"logprobs\.content"):
        generate_choices(body, where="test")


def test_tokenize_round_trip(served: Served) -> None:
    with httpx.Client(base_url=served.url, timeout=30) as client:
        ids = client.post("/tokenize", json={"prompt": "hello"}).json()["tokens"]
        assert ids == CharTokenizer().encode("hello")
        assert client.post("/detokenize", json={"tokens": ids}).json() == {"prompt": "hello"}
        refused = client.post("/v1/completions", json={"prompt": "hello", "max_tokens": 2})
        assert refused.status_code == 400 and "token ids" in refused.json()["error"]["message"]
        too_long = client.post("/v1/completions", json={"prompt": [1] * 510, "max_tokens": 5})
        assert too_long.status_code == 400 and "max length 512" in too_long.json()["error"]["message"]


def test_the_backend_tokenizes_text_only_when_the_round_trip_verifies(served: Served) -> None:
    async def run() -> tuple[list[int], str, str]:
        backend = HttpBackend(served.url, HttpOptions(attempts=2, backoff_s=0.05))
        try:
            ids = await backend.tokenize("hello")
            with pytest.raises(TokenizerMismatchError) as disagreeing:
                await backend.tokenize("hel`lo")  # "`" encodes to id 0, which decodes to nothing
            with pytest.raises(TokenizerMismatchError) as refused:
                await backend.tokenize("hello world")  # " " encodes to a negative id
            return ids, str(disagreeing.value), str(refused.value)
        finally:
            await backend.close()

    ids, disagreeing, refused = asyncio.run(run())
    assert ids == CharTokenizer().encode("hello")
    assert "detokenize to 'hello'" in disagreeing and "token ids" in disagreeing
    assert "refuses the prompt" in refused


def test_weights_update_refuses_a_wrong_sha256_and_stamps_the_new_version(
    served: Served, tmp_path: Path
) -> None:
    new_model = CausalMeanPolicy(VOCAB, seed=42)
    path = tmp_path / "policy.safetensors"
    save_file(new_model.state_dict(), str(path))
    with httpx.Client(base_url=served.url, timeout=60) as client:
        before = client.get("/health").json()["weight_version"]
        wrong = client.post(
            "/update_weights_from_disk", json={"path": str(path), "sha256": "ab" * 32, "version": before + 1}
        )
        assert wrong.status_code == 400 and "sha256" in wrong.json()["error"]["message"]
        stale = client.post(
            "/update_weights_from_disk",
            json={"path": str(path), "sha256": file_sha256(path), "version": before},
        )
        assert stale.status_code == 400 and "not newer" in stale.json()["error"]["message"]
        assert client.get("/health").json()["weight_version"] == before
        taken = client.post(
            "/update_weights_from_disk",
            json={"path": str(path), "sha256": file_sha256(path), "version": before + 1},
        )
        assert taken.status_code == 200, taken.text
        assert client.get("/v1/models").json()["data"][0]["weight_version"] == before + 1
    prompt = [2, 7, 1, 8]
    samples, info = drive(served.url, prompt, SamplingParams(max_tokens=6, n=2, seed=3))
    assert info.weight_version == before + 1
    for sample in samples:
        assert sample.weight_versions == [VersionSpan(0, len(sample.token_ids), before + 1)]
        full = torch.tensor([prompt + sample.token_ids])
        with torch.no_grad():
            logits = torch.log_softmax(new_model(full, torch.ones_like(full, dtype=torch.bool))[0], -1)
        expected = [float(logits[len(prompt) + t - 1, tok]) for t, tok in enumerate(sample.token_ids)]
        assert sample.logprobs == pytest.approx(expected, abs=1e-5), (
            "the new weights did not make these tokens"
        )
    logged = [line for line in served.logged() if line["prompt_ids"] == prompt]
    assert [line["weight_versions"] for line in logged] == [
        [[0, len(s.token_ids), before + 1]] for s in samples
    ]


def test_serve_refuses_start_up_weights_whose_sha256_differs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from infra.cli import main

    path = tmp_path / "policy.safetensors"
    save_file(CausalMeanPolicy(VOCAB).state_dict(), str(path))
    args = ["serve", "--policy", "backend_support:causal_policy", "--vocab-size", str(VOCAB), "--port", "0"]
    code = main([*args, "--weights", str(path), "--sha256", "0" * 64, "--version", "3"])
    out, err = capsys.readouterr()
    assert code == 2 and "listening" not in out
    assert "rollstream serve: error:" in err and f"has sha256 {file_sha256(path)}" in err
