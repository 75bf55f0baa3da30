"""Policies: the interface, packed against padded scoring, attention boundaries, the registry, sampling."""

from __future__ import annotations

import math

import pytest
import torch

from consumers.exceptions import PolicyInputError
from consumers.policies import (
    DEFAULT_VOCAB_SIZE,
    Policy,
    PolicySpecError,
    TinyPolicy,
    TransformerPolicy,
    load_policy,
    policy_spec_names,
    sample,
    shifted_entropy,
    shifted_logprobs,
    token_entropy_packed,
    token_entropy_padded,
    token_logprobs_packed,
    token_logprobs_padded,
)

LENGTHS = [5, 1, 9, 3, 7, 2]
SHIPPED = [("tiny", 18, {"dim": 16}), ("tiny", DEFAULT_VOCAB_SIZE, {"dim": 16}), ("transformer", 18, {"dim": 32}),
           ("transformer", 1000, {"dim": 32, "layers": 3, "heads": 2})]  # fmt: skip


def _close(actual: torch.Tensor, expected: torch.Tensor, atol: float = 1e-6) -> None:
    """Same shape, largest difference within `atol` (torch.testing's first call costs seconds of imports)."""
    assert actual.shape == expected.shape
    assert float((actual - expected).detach().abs().max()) <= atol, (actual, expected)


@pytest.fixture(autouse=True)
def _seeded() -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)


def _policy(name: str, vocab: int, kwargs: dict[str, int]) -> Policy:
    policy = load_policy(name, vocab_size=vocab, **kwargs)
    with torch.no_grad():  # spread the logits, so that misaligned scores cannot agree by chance
        for parameter in policy.parameters():  # type: ignore[attr-defined]
            parameter.normal_(0.0, 0.3)
    return policy


def _layouts(
    vocab: int, lengths: list[int]
) -> tuple[list[torch.Tensor], dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Random sequences, as a right-padded batch (two spare columns) and packed."""
    seqs = [torch.randint(0, vocab, (n,)) for n in lengths]
    width = max(lengths) + 2
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    mask = torch.zeros(len(seqs), width, dtype=torch.bool)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = s
        mask[i, : len(s)] = True
    cu = torch.zeros(len(seqs) + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(torch.tensor(lengths), 0)
    pk = {
        "input_ids": torch.cat(seqs)[None],
        "position_ids": torch.cat([torch.arange(n) for n in lengths])[None],
        "cu_seqlens": cu,
    }
    return seqs, {"input_ids": ids, "attention_mask": mask}, pk


@pytest.mark.parametrize(("name", "vocab", "kwargs"), SHIPPED)
@torch.no_grad()
def test_packed_and_padded_logprobs_agree(name: str, vocab: int, kwargs: dict[str, int]) -> None:
    policy = _policy(name, vocab, kwargs)
    assert isinstance(policy, Policy) and policy.vocab_size == vocab
    _, pad, pk = _layouts(vocab, LENGTHS)
    padded = token_logprobs_padded(policy, **pad)
    packed = token_logprobs_packed(policy, **pk)
    mask = pad["attention_mask"]
    assert packed.shape == (1, sum(LENGTHS)) and padded.shape == mask.shape
    assert float((padded[mask] - packed[0]).abs().max()) < 1e-5
    assert (
        (padded[:, 0] == 0).all()
        and (padded[~mask] == 0).all()
        and (packed[0, pk["cu_seqlens"][:-1].long()] == 0).all()
    )
    assert (padded[:, 1:][mask[:, 1:]] < 0).all()
    if vocab <= 1000:  # full logits: every shipped policy gives them, exactly
        logits = policy(pad["input_ids"], pad["attention_mask"])
        assert logits.shape == (*mask.shape, vocab)
        assert float((policy.packed_logits(**pk)[0] - logits[mask]).abs().max()) < 1e-5
        entropy = token_entropy_padded(policy, **pad)
        assert float((entropy[mask] - token_entropy_packed(policy, **pk)[0]).abs().max()) < 1e-5
        assert (entropy[:, 1:][mask[:, 1:]] > 0).all() and (entropy[:, 0] == 0).all()


@pytest.mark.parametrize(("name", "vocab", "kwargs"), SHIPPED[::2])
@torch.no_grad()
def test_each_score_is_the_next_token_probability_given_the_prefix_alone(
    name: str, vocab: int, kwargs: dict[str, int]
) -> None:
    policy = _policy(name, vocab, kwargs)
    seqs, _, pk = _layouts(vocab, LENGTHS)
    packed = token_logprobs_packed(policy, **pk)[0]
    start = 0
    for seq in seqs:
        for t in range(1, len(seq)):
            prefix = seq[None, :t]
            alone = torch.log_softmax(policy(prefix, torch.ones_like(prefix, dtype=torch.bool))[0, -1], -1)
            assert float((alone[seq[t]] - packed[start + t]).abs()) < 1e-5
        start += len(seq)


@pytest.mark.parametrize(("name", "vocab", "kwargs"), SHIPPED[::2])
def test_packed_sequences_never_see_each_other(name: str, vocab: int, kwargs: dict[str, int]) -> None:
    policy = _policy(name, vocab, kwargs)
    _, _, pk = _layouts(vocab, LENGTHS)
    before = policy.packed_logits(**pk)
    changed = {**pk, "input_ids": pk["input_ids"].clone()}
    cu = pk["cu_seqlens"].tolist()
    changed["input_ids"][0, cu[2] : cu[3]] = (
        changed["input_ids"][0, cu[2] : cu[3]] + 1
    ) % vocab  # sequence 2
    after = policy.packed_logits(**changed)
    outside = torch.ones(cu[-1], dtype=torch.bool)
    outside[cu[2] : cu[3]] = False
    assert torch.equal(before[0, outside], after[0, outside])
    assert not torch.equal(before[0, ~outside], after[0, ~outside])
    # causal within a sequence: changing its last token leaves its earlier logits alone
    last = {**pk, "input_ids": pk["input_ids"].clone()}
    last["input_ids"][0, cu[3] - 1] = (last["input_ids"][0, cu[3] - 1] + 1) % vocab
    assert torch.equal(policy.packed_logits(**last)[0, : cu[3] - 1], before[0, : cu[3] - 1])


def test_gradients_flow_through_packed_scores() -> None:
    for name, vocab, kwargs in SHIPPED[::2]:
        policy = _policy(name, vocab, kwargs)
        _, _, pk = _layouts(vocab, LENGTHS)
        token_logprobs_packed(policy, **pk).sum().backward()
        grads = [p.grad for p in policy.parameters()]  # type: ignore[attr-defined]
        assert all(g is not None for g in grads) and any(
            float(g.abs().sum()) > 0 for g in grads if g is not None
        )


def test_the_transformer_takes_left_padding_and_tiny_refuses_it() -> None:
    policy = _policy("transformer", 18, {"dim": 32})
    seqs, pad, _ = _layouts(18, LENGTHS)
    width = pad["input_ids"].shape[1]
    left_ids = torch.zeros_like(pad["input_ids"])
    left_mask = torch.zeros_like(pad["attention_mask"])
    for i, s in enumerate(seqs):
        left_ids[i, width - len(s) :] = s
        left_mask[i, width - len(s) :] = True
    right = policy(pad["input_ids"], pad["attention_mask"])[pad["attention_mask"]]
    left = policy(left_ids, left_mask)[left_mask]
    assert float((right - left).detach().abs().max()) < 1e-5
    tiny = _policy("tiny", 18, {"dim": 8})
    with pytest.raises(PolicyInputError, match="right padding"):
        tiny(left_ids, left_mask)


def test_tiny_full_logits_are_its_normalized_factorized_scores() -> None:
    tiny = TinyPolicy(vocab_size=18, dim=8)  # 8 classes of 3 tokens: two classes hold none
    states = torch.randn(4, 8)
    full = tiny.full_logprobs(states)
    _close(full.logsumexp(-1), torch.zeros(4))
    direct = torch.stack([tiny.score(states, torch.full((4,), t)) for t in range(18)], dim=1)
    _close(full, direct)


def test_inputs_that_do_not_fit_are_refused_with_the_fix() -> None:
    policy = _policy("transformer", 18, {"dim": 32})
    _, pad, pk = _layouts(18, LENGTHS)
    with pytest.raises(PolicyInputError, match="cumulative sum"):
        token_logprobs_packed(policy, **{**pk, "cu_seqlens": pk["cu_seqlens"] + 1})
    with pytest.raises(PolicyInputError, match=r"\(1, T\)"):
        token_logprobs_packed(policy, pad["input_ids"], pad["input_ids"], pk["cu_seqlens"])
    with pytest.raises(PolicyInputError, match="at least 19"):
        policy(torch.tensor([[3, 18]]), torch.ones(1, 2, dtype=torch.bool))
    with pytest.raises(PolicyInputError, match=r"\(B, L\)"):
        token_logprobs_padded(policy, pad["input_ids"], pad["attention_mask"][:, :-1])
    with pytest.raises(ValueError, match="even width"):
        TransformerPolicy(vocab_size=18, dim=30, heads=4)


def test_load_policy_by_name_or_import_path_and_clear_errors() -> None:
    assert policy_spec_names() == ("tiny", "transformer")
    assert isinstance(load_policy("tiny", vocab_size=40, dim=8), TinyPolicy)
    built = load_policy("consumers.policies.transformer:TransformerPolicy", vocab_size=40, dim=16, heads=2)
    assert isinstance(built, TransformerPolicy) and built.vocab_size == 40
    with pytest.raises(PolicySpecError, match="tiny, transformer"):
        load_policy("gpt", vocab_size=40)
    with pytest.raises(PolicySpecError, match="cannot import module 'no_such_module'"):
        load_policy("no_such_module:make", vocab_size=40)
    with pytest.raises(PolicySpecError, match="no attribute 'nothing'"):
        load_policy("consumers.policies:nothing", vocab_size=40)
    with pytest.raises(PolicySpecError, match="not a torch module"):
        load_policy("collections:OrderedDict", vocab_size=40)
    with pytest.raises(PolicySpecError, match="depth"):
        load_policy("tiny", vocab_size=40, depth=3)
    with pytest.raises(PolicySpecError, match="vocab_size=40 but has vocab_size=41"):
        load_policy("test_consumers_policies:_off_by_one", vocab_size=40)


def _off_by_one(*, vocab_size: int) -> TinyPolicy:
    return TinyPolicy(vocab_size=vocab_size + 1, dim=4)


def test_sample_stops_at_eos_and_reports_the_logprobs_it_drew_with() -> None:
    policy = _policy("transformer", 18, {"dim": 32})
    prompts = [[2, 3, 4], [5], [6, 7]] * 20
    draws = sample(policy, prompts, max_new_tokens=6, eos_id=1, generator=torch.Generator().manual_seed(0))
    again = sample(policy, prompts, max_new_tokens=6, eos_id=1, generator=torch.Generator().manual_seed(0))
    assert draws == again and len(draws) == len(prompts)
    reasons = {d.finish_reason for d in draws}
    assert reasons == {"stop", "length"}
    for d in draws:
        assert len(d.tokens) == len(d.logprobs) <= 6
        assert (d.finish_reason == "stop") == (d.tokens[-1] == 1) and 1 not in d.tokens[:-1]
        assert d.finish_reason == "stop" or len(d.tokens) == 6
    cold = sample(
        policy, prompts[:3], max_new_tokens=4, temperature=0.5, generator=torch.Generator().manual_seed(1)
    )
    for prompt, d in zip(prompts[:3], cold, strict=True):
        ids = torch.tensor([prompt + d.tokens])
        logits = policy(ids, torch.ones_like(ids, dtype=torch.bool))[0]
        at = torch.arange(len(prompt) - 1, ids.shape[1] - 1)
        drawn = torch.log_softmax(logits[at] / 0.5, -1).gather(1, ids[0, at + 1, None]).squeeze(1)
        _close(torch.tensor(d.logprobs), drawn, 1e-5)
    greedy = sample(policy, [[2, 3]], max_new_tokens=3, temperature=0)[0]
    ids = torch.tensor([[2, 3, *greedy.tokens]])
    logits = policy(ids, torch.ones_like(ids, dtype=torch.bool))[0]
    assert greedy.tokens == logits[1:-1].argmax(-1).tolist()
    with pytest.raises(PolicyInputError, match="empty prompt"):
        sample(policy, [[]], max_new_tokens=2)


def test_shifted_scores_from_logits_with_masked_tokens() -> None:
    logits = torch.tensor([[[0.0, float("-inf"), 0.0], [1.0, 2.0, 3.0], [0.0, 0.0, 0.0]]])
    ids = torch.tensor([[2, 0, 1]])
    scored = torch.tensor([[False, True, True]])
    entropy = shifted_entropy(logits, scored)
    _close(entropy[0, :2], torch.tensor([0.0, math.log(2)]))
    logprobs = shifted_logprobs(logits.to(torch.bfloat16), ids, scored)
    assert logprobs.dtype == torch.float32 and logprobs[0, 0] == 0
    assert logprobs[0, 1] == pytest.approx(-math.log(2)) and logprobs[0, 2] == pytest.approx(
        math.log(math.exp(2) / sum(math.exp(v) for v in (1, 2, 3))), abs=2e-2
    )
