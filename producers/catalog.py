"""The fleet's task domains: names, task types and the statistics each domain's samples follow.

The catalog depends only on its size, never on the fleet's seed, so a domain keeps its name and
character across runs (per-domain reward statistics stay meaningful between demos).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from producers.exceptions import FleetConfigError
from producers.tasks import FAMILIES, TASK_TYPES
from schemas.domains import DomainRegistry, default_domains

CATALOG_SEED = 0x5EED
MAX_TOKENS = 32_768
# Share of domains per task type; 'precomputed' gets a few, 'math' whatever remains.
_SHARES = {"code": 0.30, "extraction": 0.23, "precomputed": 0.10}
# Median lengths in tokens per task type: (prompt, response).
_MEDIANS = {"math": (250, 550), "code": (300, 450), "extraction": (700, 150), "precomputed": (250, 350)}
_MAX_NEW_TOKENS = np.array([4096, 8192, 16_384, MAX_TOKENS])


@dataclass(frozen=True)
class Domain:
    """One task domain, such as 'math/algebra-017'.

    Attributes:
        name: '<task_type>/<family>-<index within the task type, 3 digits>'.
        task_type: the verifier family ('math', 'code', 'extraction', 'precomputed').
        family: the generator within the task type (e.g. 'algebra', 'fizzbuzz', 'invoice').
        level: difficulty 1-3: bigger numbers, more test cases.
        skill: the policy's mean chance of a right sample in this domain.
        prompt_median: median prompt length in tokens.
        response_median: median response length in tokens.
        max_new_tokens: the generation cap; a response that reaches it finishes with 'length'.
        weight: the domain's share of traffic (the catalog's weights sum to 1).
    """

    name: str
    task_type: str
    family: str
    level: int
    skill: float
    prompt_median: float
    response_median: float
    max_new_tokens: int
    weight: float


def _counts(num_domains: int) -> dict[str, int]:
    counts = {t: max(1, round(num_domains * share)) for t, share in _SHARES.items()}
    counts["math"] = num_domains - sum(counts.values())
    return {t: counts[t] for t in TASK_TYPES}


def build_catalog(num_domains: int = 320, registry: DomainRegistry | None = None) -> tuple[Domain, ...]:
    """Make `num_domains` domains over every task type, with Zipf-like traffic weights.

    Every domain must be in the domain registry (default `schemas/domains.toml`) with the same
    task type: the fleet emits only domains the stream stage knows how to judge.
    """
    if num_domains < len(TASK_TYPES):
        raise FleetConfigError(
            f"num_domains must be at least {len(TASK_TYPES)} so every task type has a domain, got {num_domains}"
        )
    rng = np.random.default_rng(CATALOG_SEED)
    specs = [(t, i) for t, count in _counts(num_domains).items() for i in range(count)]
    raw_weights = 1.0 / np.arange(1, num_domains + 1) ** 0.6
    weights = raw_weights[rng.permutation(num_domains)] / raw_weights.sum()
    domains = []
    for (task_type, index), weight in zip(specs, weights.tolist(), strict=True):
        families = FAMILIES[task_type]
        prompt_median, response_median = _MEDIANS[task_type]
        domains.append(
            Domain(
                name=f"{task_type}/{families[index % len(families)]}-{index:03d}",
                task_type=task_type,
                family=families[index % len(families)],
                level=1 + (index // len(families)) % 3,
                skill=float(rng.uniform(0.15, 0.9)),
                prompt_median=float(prompt_median * rng.lognormal(0.0, 0.35)),
                response_median=float(response_median * rng.lognormal(0.0, 0.35)),
                max_new_tokens=int(rng.choice(_MAX_NEW_TOKENS, p=[0.3, 0.3, 0.25, 0.15])),
                weight=weight,
            )
        )
    registry = registry if registry is not None else default_domains()
    for domain in domains:
        spec = registry.get(domain.name)
        if spec is None or spec.task_type != domain.task_type:
            raise FleetConfigError(
                f"domain {domain.name!r} ({domain.task_type}) is not in the domain registry "
                f"{registry.source} with that task type; num_domains={num_domains} may exceed what "
                "the registry lists, or add the domain there"
            )
    return tuple(domains)
