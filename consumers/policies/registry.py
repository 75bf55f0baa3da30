"""`load_policy`: a policy by name ("tiny", "transformer") or by import path ("module:factory")."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from torch import nn

from consumers.policies.base import Policy
from consumers.policies.exceptions import PolicySpecError
from consumers.policies.tiny import TinyPolicy
from consumers.policies.transformer import TransformerPolicy

_SHIPPED: dict[str, Callable[..., nn.Module]] = {"tiny": TinyPolicy, "transformer": TransformerPolicy}


def policy_spec_names() -> tuple[str, ...]:
    """The names of the shipped policies, for help texts and settings checks."""
    return tuple(_SHIPPED)


def load_policy(spec: str, *, vocab_size: int, **kwargs: Any) -> Policy:
    """Build a policy: `factory(vocab_size=vocab_size, **kwargs)` for a shipped name or "module:factory".

    The result must be a torch module with `vocab_size`, `forward(input_ids, attention_mask)` and
    `packed_logits(input_ids, position_ids, cu_seqlens)`.

    Raises:
        PolicySpecError: an unknown name, a module or attribute that does not import, a factory that
            fails on these arguments, or a result that is not such a policy.
    """
    factory = _SHIPPED.get(spec) or _imported(spec)
    try:
        policy = factory(vocab_size=vocab_size, **kwargs)
    except TypeError as err:
        raise PolicySpecError(
            f"policy {spec!r} does not take vocab_size={vocab_size} and {sorted(kwargs)}: {err}; "
            "pass only the arguments its factory accepts"
        ) from err
    if not isinstance(policy, nn.Module) or not isinstance(policy, Policy):
        raise PolicySpecError(
            f"policy {spec!r} returned {type(policy).__name__}, which is not a torch module with vocab_size, "
            "forward(input_ids, attention_mask) and packed_logits(input_ids, position_ids, cu_seqlens)"
        )
    if policy.vocab_size != vocab_size:
        raise PolicySpecError(
            f"policy {spec!r} was asked for vocab_size={vocab_size} but has vocab_size={policy.vocab_size}: "
            "make its factory honour the vocab_size argument"
        )
    return policy


def _imported(spec: str) -> Callable[..., Any]:
    module_name, colon, attribute = spec.partition(":")
    if not colon or not module_name or not attribute:
        raise PolicySpecError(
            f"unknown policy {spec!r}: use one of {', '.join(policy_spec_names())} or an import path "
            "'package.module:factory'"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise PolicySpecError(
            f"policy {spec!r}: cannot import module {module_name!r} ({err}); check the path and PYTHONPATH"
        ) from err
    factory = module
    for part in attribute.split("."):
        factory = getattr(factory, part, None)  # type: ignore[assignment]
        if factory is None:
            raise PolicySpecError(f"policy {spec!r}: module {module_name!r} has no attribute {attribute!r}")
    if not callable(factory):
        raise PolicySpecError(f"policy {spec!r}: {attribute!r} in {module_name!r} is not callable")
    return factory
