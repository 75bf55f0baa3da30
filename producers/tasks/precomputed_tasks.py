"""Tasks scored by the worker itself (a reward model, a simulator): the reward travels in the record.

Each family has its own reward scale, as real reward models do; per-domain normalization downstream
is what makes them comparable.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from producers.tasks.base import GroupContent, cut

# family: (mean, standard deviation) of the reward model's raw scores.
SCALES: dict[str, tuple[float, float]] = {
    "chat": (0.0, 1.0),
    "tool-use": (0.5, 0.25),
    "summarization": (-2.0, 3.0),
    "safety": (4.0, 0.5),
}
FAMILIES = tuple(SCALES)


def generate(
    rng: np.random.Generator,
    family: str,
    level: int,
    quality: npt.NDArray[np.float64],
    truncated: npt.NDArray[np.bool_],
) -> GroupContent:
    """One prompt and, per sample, a reward drawn around the family's scale (higher for higher quality)."""
    mean, std = SCALES[family]
    prompt = f"[{family} prompt, level {level}] Respond helpfully to request #{int(rng.integers(10**6))}."
    rewards = mean + std * (2.0 * (quality - 0.5) + 0.5 * rng.standard_normal(len(quality)))
    rewards = np.where(truncated, mean - 2.0 * std, rewards)
    text = f"Here is a {family} response to the request, as the policy wrote it."
    responses = [cut(rng, text) if c else text for c in truncated.tolist()]
    return GroupContent(prompt=prompt, responses=responses, scores=[float(r) for r in rewards.tolist()])
