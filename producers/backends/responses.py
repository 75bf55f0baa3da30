"""Reading servers' generation answers into choices, checking every field instead of assuming it.

Three dialects: OpenAI completions (vLLM, `rollstream serve`), vLLM's tokens-in/tokens-out
`/inference/v1/generate` (vLLM, `rollstream serve`) and SGLang's native `/generate`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from producers.backends.base import FinishReason, SamplingParams, VersionSpan, check_spans
from producers.backends.exceptions import BadResponseError


@dataclass(frozen=True)
class Choice:
    """One sample as a server reported it; `token_ids` is None when the server sent none."""

    token_ids: list[int] | None
    logprobs: list[float]
    finish_reason: FinishReason
    text: str | None = None
    spans: list[VersionSpan] | None = None
    logprob_mode: str | None = None


def _each_choice(body: Any, where: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each choice of an answer's `choices` list, in index order, with where it stands."""
    if not isinstance(body, dict) or not isinstance(body.get("choices"), list):
        raise BadResponseError(f"{where}: the answer has no 'choices' list: {_preview(body)}")
    raw = body["choices"]
    if all(isinstance(c, dict) and isinstance(c.get("index"), int) for c in raw):
        raw = sorted(raw, key=lambda c: c["index"])
    for i, choice in enumerate(raw):
        at = f"{where}: choice {i}"
        if not isinstance(choice, dict):
            raise BadResponseError(f"{at} is not an object: {_preview(choice)}")
        yield at, choice


def completion_choices(body: Any, *, where: str) -> list[Choice]:
    """The choices of an OpenAI-style `/v1/completions` answer, in index order."""
    choices = []
    for at, choice in _each_choice(body, where):
        logprobs = choice.get("logprobs")
        if not isinstance(logprobs, dict) or "token_logprobs" not in logprobs:
            raise BadResponseError(
                f"{at} has no logprobs.token_logprobs: the server ignored `logprobs`; "
                "use a server that returns sampling logprobs"
            )
        choices.append(
            Choice(
                token_ids=_ids(choice.get("token_ids"), at=f"{at} token_ids"),
                logprobs=_floats(logprobs["token_logprobs"], at=f"{at} logprobs"),
                finish_reason=_finish(choice.get("finish_reason"), at=at),
                text=_text(choice.get("text"), at=at),
                spans=_spans(choice.get("weight_versions"), at=at),
                logprob_mode=_mode(choice.get("logprob_mode"), at=at),
            )
        )
    return choices


def generate_choices(body: Any, *, where: str) -> list[Choice]:
    """The choices of a vLLM `/inference/v1/generate` answer, in index order.

    Each choice has `token_ids`, `logprobs.content` (one `{"logprob": ...}` per token, chat style)
    and `finish_reason`; `weight_versions` ([[start, end, version], ...]) when the server states
    which weights made which token range.
    """
    choices = []
    for at, choice in _each_choice(body, where):
        logprobs = choice.get("logprobs")
        content = logprobs.get("content") if isinstance(logprobs, dict) else None
        if not isinstance(content, list) or any(
            not isinstance(c, dict) or "logprob" not in c for c in content
        ):
            raise BadResponseError(
                f"{at} has no logprobs.content [{{'logprob': ...}}, ...]: ask with "
                "sampling_params.logprobs = 0 (the sampled token's logprob)"
            )
        ids = _ids(choice.get("token_ids"), at=f"{at} token_ids")
        if ids is None:
            raise BadResponseError(f"{at} has no token_ids: a tokens-out server must return them")
        choices.append(
            Choice(
                token_ids=ids,
                logprobs=_floats([c["logprob"] for c in content], at=f"{at} logprobs"),
                finish_reason=_finish(choice.get("finish_reason"), at=at),
                spans=_spans(choice.get("weight_versions"), at=at),
                logprob_mode=_mode(choice.get("logprob_mode"), at=at),
            )
        )
    return choices


def sglang_choices(body: Any, *, where: str) -> list[Choice]:
    """The samples of an SGLang `/generate` answer: one object for n = 1, a list of them for n > 1."""
    items = body if isinstance(body, list) else [body]
    choices = []
    for i, item in enumerate(items):
        at = f"{where}: sample {i}"
        meta = item.get("meta_info") if isinstance(item, dict) else None
        if not isinstance(meta, dict):
            raise BadResponseError(f"{at} has no 'meta_info' object: {_preview(item)}")
        triples = meta.get("output_token_logprobs")
        if not isinstance(triples, list) or any(
            not isinstance(t, list | tuple) or len(t) < 2 for t in triples
        ):
            raise BadResponseError(
                f"{at} has no meta_info.output_token_logprobs [[logprob, token_id, ...], ...]: "
                "send return_logprob: true to a server that honours it"
            )
        logprobs = _floats([t[0] for t in triples], at=f"{at} logprobs")
        from_triples = _ids([t[1] for t in triples], at=f"{at} output_token_logprobs ids")
        output_ids = _ids(item.get("output_ids"), at=f"{at} output_ids")
        if output_ids is not None and from_triples is not None and output_ids != from_triples:
            raise BadResponseError(
                f"{at}: output_ids {output_ids[:8]}... differ from the ids of output_token_logprobs "
                f"{from_triples[:8]}...: the server's tokens and logprobs are misaligned"
            )
        finish = meta.get("finish_reason")
        choices.append(
            Choice(
                token_ids=output_ids if output_ids is not None else from_triples,
                logprobs=logprobs,
                finish_reason=_finish(finish.get("type") if isinstance(finish, dict) else finish, at=at),
                text=_text(item.get("text"), at=at),
            )
        )
    return choices


def check_choice(choice: Choice, token_ids: list[int], params: SamplingParams, *, where: str) -> None:
    """Refuse a sample whose ids and logprobs are not one to one, or that is longer than asked."""
    if len(token_ids) != len(choice.logprobs):
        raise BadResponseError(
            f"{where}: {len(token_ids)} token ids but {len(choice.logprobs)} logprobs; "
            "tokens and logprobs must align one to one"
        )
    if len(token_ids) > params.max_tokens:
        raise BadResponseError(
            f"{where}: {len(token_ids)} tokens, more than max_tokens {params.max_tokens}: "
            "the server did not honour the limit"
        )
    if not token_ids:
        raise BadResponseError(f"{where}: no tokens generated (finish_reason {choice.finish_reason!r})")
    if choice.spans is not None and (why := check_spans(choice.spans, len(token_ids))):
        raise BadResponseError(f"{where}: weight_versions: {why}")


def version_field(body: Any) -> int | None:
    """The weight version in a `/v1/models` or `/get_model_info` answer, if it states a number."""
    candidates: list[Any] = []
    if isinstance(body, dict):
        candidates.append(body.get("weight_version"))
        data = body.get("data")
        if isinstance(data, list) and data and isinstance(data[0], dict):
            candidates.append(data[0].get("weight_version"))
    for value in candidates:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().isdigit():
            return int(value)
    return None


def model_card(body: Any) -> dict[str, Any]:
    """The first model object of `/v1/models` (or the `/get_model_info` object itself)."""
    if isinstance(body, dict):
        data = body.get("data")
        if isinstance(data, list) and data and isinstance(data[0], dict):
            return data[0]
        return body
    return {}


def _ids(value: Any, *, at: str) -> list[int] | None:
    if value is None:
        return None
    if not isinstance(value, list) or any(
        not isinstance(t, int) or isinstance(t, bool) or t < 0 for t in value
    ):
        raise BadResponseError(f"{at} must be a list of non-negative ints, got {_preview(value)}")
    return list(value)


def _floats(value: Any, *, at: str) -> list[float]:
    if not isinstance(value, list):
        raise BadResponseError(f"{at} must be a list of numbers, got {_preview(value)}")
    out = []
    for i, x in enumerate(value):
        if not isinstance(x, int | float) or isinstance(x, bool) or not math.isfinite(x):
            raise BadResponseError(f"{at}[{i}] is {x!r}: every logprob must be a finite number")
        out.append(float(x))
    return out


def _finish(value: Any, *, at: str) -> FinishReason:
    if value == "stop" or value == "length":
        return value
    raise BadResponseError(
        f"{at}: finish_reason {value!r} is neither 'stop' nor 'length': the generation was cut off "
        "or aborted by the server"
    )


def _text(value: Any, *, at: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise BadResponseError(f"{at}: text must be a string, got {_preview(value)}")


def _spans(value: Any, *, at: str) -> list[VersionSpan] | None:
    if value is None:
        return None
    if not isinstance(value, list) or any(
        not isinstance(s, list | tuple) or len(s) != 3 or any(not isinstance(x, int) for x in s)
        for s in value
    ):
        raise BadResponseError(
            f"{at}: weight_versions must be [[start, end, version], ...], got {_preview(value)}"
        )
    return [VersionSpan(*s) for s in value]


def _mode(value: Any, *, at: str) -> str | None:
    if value is None or value in ("processed", "raw"):
        return value
    raise BadResponseError(f"{at}: logprob_mode {value!r} is neither 'processed' nor 'raw'")


def _preview(value: Any, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."
