"""What a task generator returns for one prompt group, and the signature every generator has."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt


@dataclass(frozen=True)
class GroupContent:
    """The text side of one prompt group.

    Attributes:
        prompt: the problem statement (travels in metadata; the tokens are synthetic).
        fields: verifier inputs shared by the group (expected_answer, unit_tests or gold_fields).
        responses: one response text per sample.
        scores: the reward a correct verifier should give each sample, in [0, 1] for verified
            task types; for 'precomputed' the reward itself.
        sample_metadata: optional extra metadata per sample (e.g. which code candidate it is),
            empty or one mapping per sample.
    """

    prompt: str
    responses: list[str]
    scores: list[float]
    fields: dict[str, Any] = field(default_factory=dict)
    sample_metadata: list[dict[str, str]] = field(default_factory=list)


class TaskGenerator(Protocol):
    """Makes one group: `quality[i]` is sample i's chance to be right, `truncated[i]` marks a cut-off."""

    def __call__(
        self,
        rng: np.random.Generator,
        family: str,
        level: int,
        quality: npt.NDArray[np.float64],
        truncated: npt.NDArray[np.bool_],
    ) -> GroupContent: ...


def cut(rng: np.random.Generator, text: str) -> str:
    """A response cut off mid-way, as when generation hits max_new_tokens."""
    if len(text) < 4:
        return ""
    return text[: int(rng.integers(1, len(text) // 2 + 1))]
