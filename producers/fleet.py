"""A deterministic synthetic rollout fleet: the trajectories many rollout workers would publish.

Used by the demo, the tests and the benchmarks. Everything, ids and timestamps included, derives
from one seed: two fleets with the same seed and settings yield identical records, so a run can
be replayed exactly. Lengths are heavy-tailed (lognormal, clipped at 32k tokens), as real rollouts
are: most responses are a few hundred tokens, a few run to many thousands.
"""

from __future__ import annotations

import uuid
from collections import deque
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime, timedelta
from math import log

import numpy as np
import numpy.typing as npt

from producers.catalog import MAX_TOKENS, Domain, build_catalog
from producers.exceptions import FleetConfigError
from producers.tasks import GENERATORS
from schemas import TrajectoryRecord
from schemas.profile import WorkloadProfile

VOCAB_SIZE = 32_000
FLEET_EPOCH = datetime(2025, 1, 1, tzinfo=UTC)
PROMPT_SIGMA = 0.8
RESPONSE_SIGMA = 0.9
# A prompt group shares a length offset and a difficulty: samples of one prompt resemble each other.
GROUP_SIGMA = 0.35
DIFFICULTY_CONCENTRATION = 4.0
GROUP_INTERVAL_MS = 25.0
DECODE_MS_PER_TOKEN = 2
# Each task type's context profile: a multiplier on the workload profile's share of each bucket
# (by name; a bucket not named keeps its share). Extraction reads long documents, math is short.
CONTEXT_PROFILES: dict[str, dict[str, float]] = {
    "math": {"short": 1.5},
    "code": {"long": 1.3, "ultra_long": 1.5},
    "extraction": {"long": 1.5, "ultra_long": 3.0},
    "precomputed": {},
}
# Ultra-long samples: 600k to 1M response tokens with logprobs (4.8 to 8 MB), beyond every domain's
# cap and past rollouts.raw's 4 MiB, so a publisher with an ultra topic routes them there.
ULTRA_TOKENS = (600_000, 1_000_000)


class SyntheticFleet:
    """An endless, seeded stream of prompt groups over a catalog of task domains.

    `trajectories(n)` takes the next `n` records from the stream. Groups come whole and in
    order (sample_index 0..group_size-1); when `n` ends inside a group, the rest of that group
    opens the next call, so a group is never lost and `group_size` is always the declared size.

    Each record's ``metadata`` carries ``prompt`` (the problem statement; the tokens themselves
    are random ids) and ``synthetic_score``: the reward a correct verifier should give (1/0 for
    math and code, the fraction of right fields for extraction, the reward itself for
    'precomputed'), which lets tests check verifiers end to end. A code record also carries
    ``candidate``: which variant its text is (see `producers.tasks.code_tasks`).

    Args:
        seed: drives every random choice of the stream.
        num_domains: size of the domain catalog (see `producers.catalog`).
        group_size: samples per prompt group (N in GRPO).
        policy_version: stamped on each record; may be changed between calls.
        worker_count: how many distinct worker_ids the groups are spread over.
        start_time: simulated clock start for created_at; default a fixed epoch (2025-01-01 UTC)
            so records are reproducible. Pass ``datetime.now(UTC)`` for wall-clock-like times.
        profile: draw prompt and response lengths from this inference workload profile, each task
            type leaning by its `CONTEXT_PROFILES` entry; None keeps the per-domain lognormal.
        group_sizes: (smallest, largest): each group's size drawn uniformly between them,
            replacing `group_size`.
        ultra_share: the chance that a sample is ultra-long (`ULTRA_TOKENS`, finish 'length').
    """

    def __init__(
        self,
        seed: int = 0,
        *,
        num_domains: int = 320,
        group_size: int = 8,
        policy_version: int = 1,
        worker_count: int = 16,
        start_time: datetime | None = None,
        profile: WorkloadProfile | None = None,
        group_sizes: tuple[int, int] | None = None,
        ultra_share: float = 0.0,
    ) -> None:
        if group_sizes is not None and not 1 <= group_sizes[0] <= group_sizes[1]:
            raise FleetConfigError(
                f"group_sizes must be (smallest, largest) with 1 <= smallest <= largest, got {group_sizes}"
            )
        if not 0.0 <= ultra_share <= 1.0:
            raise FleetConfigError(f"ultra_share must lie in [0, 1], got {ultra_share}")
        if group_size < 1:
            raise FleetConfigError(f"group_size must be at least 1, got {group_size}")
        if worker_count < 1:
            raise FleetConfigError(f"worker_count must be at least 1, got {worker_count}")
        if policy_version < 0:
            raise FleetConfigError(f"policy_version must be non-negative, got {policy_version}")
        start = FLEET_EPOCH if start_time is None else start_time
        if start.tzinfo is None:
            raise FleetConfigError(f"start_time must be timezone-aware (e.g. UTC), got {start!r}")
        self.seed = seed
        self.domains: tuple[Domain, ...] = build_catalog(num_domains)
        self.group_size = group_size
        self.policy_version = policy_version
        self.worker_count = worker_count
        self._rng = np.random.default_rng(seed)
        self._cumulative = np.cumsum([d.weight for d in self.domains])
        self._start = start
        self._clock_ms = 0.0
        self._pending: deque[TrajectoryRecord] = deque()
        self.profile = profile
        self.group_sizes = group_sizes
        self.ultra_share = ultra_share
        self._weights = (
            {
                task_type: {b.name: b.share * lean.get(b.name, 1.0) for b in profile.buckets}
                for task_type, lean in CONTEXT_PROFILES.items()
            }
            if profile is not None
            else {}
        )

    def trajectories(self, n: int) -> Iterator[TrajectoryRecord]:
        """Yield the next `n` records of the stream (lazily; stopping early keeps the rest)."""
        if n < 0:
            raise FleetConfigError(f"n must be non-negative, got {n}")
        for _ in range(n):
            if not self._pending:
                self._pending.extend(self._next_group())
            yield self._pending.popleft()

    def _uuid(self) -> str:
        return str(uuid.UUID(bytes=self._rng.bytes(16), version=4))

    def _lengths(self, domain: Domain, size: int) -> tuple[int, npt.NDArray[np.int64]]:
        """A group's prompt length and the response lengths its samples want (before caps)."""
        rng = self._rng
        if self.profile is None:
            prompt_len = int(
                np.clip(round(rng.lognormal(log(domain.prompt_median), PROMPT_SIGMA)), 8, MAX_TOKENS)
            )
            shift = log(domain.response_median) + rng.normal(0.0, GROUP_SIGMA)
            return prompt_len, np.ceil(rng.lognormal(shift, RESPONSE_SIGMA, size=size)).astype(np.int64)
        weights = self._weights.get(domain.task_type)
        draws = [self.profile.sample_length(rng, weights=weights) for _ in range(size)]
        # The group shares its prompt (the first draw's); each sample's response is its own draw.
        prompt_len = min(max(draws[0].prompt_tokens, 1), MAX_TOKENS)
        return prompt_len, np.array([d.response_tokens for d in draws], dtype=np.int64)

    def _next_group(self) -> list[TrajectoryRecord]:
        rng, size = self._rng, self.group_size
        if self.group_sizes is not None:
            size = int(rng.integers(self.group_sizes[0], self.group_sizes[1] + 1))
        index = min(
            int(np.searchsorted(self._cumulative, rng.random() * self._cumulative[-1])), len(self.domains) - 1
        )
        domain = self.domains[index]
        prompt_len, wanted = self._lengths(domain, size)
        hit_cap = wanted >= domain.max_new_tokens
        lengths = np.clip(wanted, 1, domain.max_new_tokens)
        if self.ultra_share > 0:
            ultra = rng.random(size) < self.ultra_share
            if ultra.any():
                lengths[ultra] = rng.integers(ULTRA_TOKENS[0], ULTRA_TOKENS[1] + 1, int(ultra.sum()))
                hit_cap = hit_cap | ultra
        skill = domain.skill * DIFFICULTY_CONCENTRATION
        difficulty = rng.beta(skill, DIFFICULTY_CONCENTRATION - skill)
        content = GENERATORS[domain.task_type](
            rng, domain.family, domain.level, np.full(size, difficulty), hit_cap
        )
        ids = rng.integers(0, VOCAB_SIZE, size=prompt_len + int(lengths.sum()), dtype=np.int32).astype("<i4")
        logprobs = (rng.standard_exponential(int(lengths.sum()), dtype=np.float32) * -0.7 - 1e-3).astype(
            "<f4"
        )
        prompt_tokens = ids[:prompt_len].tobytes()
        group_id = self._uuid()
        worker_id = f"worker-{int(rng.integers(self.worker_count)):03d}"
        self._clock_ms += rng.exponential(GROUP_INTERVAL_MS)
        base_ms = int(self._clock_ms)
        fields, notes = content.fields, content.sample_metadata
        is_precomputed = domain.task_type == "precomputed"
        records: list[TrajectoryRecord] = []
        offset = 0
        for i, length in enumerate(lengths.tolist()):
            score = content.scores[i]
            records.append(
                {
                    "trajectory_id": self._uuid(),
                    "group_id": group_id,
                    "sample_index": i,
                    "group_size": size,
                    "domain": domain.name,
                    "task_type": domain.task_type,
                    "policy_version": self.policy_version,
                    "prompt_tokens": prompt_tokens,
                    "response_tokens": ids[prompt_len + offset : prompt_len + offset + length].tobytes(),
                    "response_logprobs": logprobs[offset : offset + length].tobytes(),
                    "response_text": content.responses[i],
                    "finish_reason": "length" if hit_cap[i] else "stop",
                    "expected_answer": fields.get("expected_answer"),
                    "unit_tests": fields.get("unit_tests"),
                    "gold_fields": fields.get("gold_fields"),
                    "precomputed_reward": score if is_precomputed else None,
                    "worker_id": worker_id,
                    "created_at": self._start
                    + timedelta(milliseconds=base_ms + length * DECODE_MS_PER_TOKEN),
                    "metadata": {
                        "source": "synthetic-fleet",
                        "prompt": content.prompt,
                        "synthetic_score": f"{score:.6g}",
                        **(notes[i] if notes else {}),
                    },
                }
            )
            offset += length
        return records


def without_code(records: Iterable[TrajectoryRecord]) -> Iterator[TrajectoryRecord]:
    """Code samples become precomputed samples with the same rewards (their ``synthetic_score``).

    For tests and benchmarks of groups, offsets and workers, where thousands of sandboxed runs
    would dominate the time (the sandbox has its own tests and benchmark).
    """
    for r in records:
        if r["task_type"] == "code":
            r = {
                **r,
                "task_type": "precomputed",
                "domain": "precomputed/chat-000",
                "unit_tests": None,
                "precomputed_reward": float(r["metadata"]["synthetic_score"]),
            }
        yield r
