"""Toy verifiable tasks a small policy learns on the CPU: single-digit addition, judged as math.

A task's prompt is "a+b=" in `ARITHMETIC_TOKENIZER`'s characters; the policy answers with the
sum's digits and eos ("7<eos>"), so the response text is the bare number, which the math
verifier's final-answer rule (the last non-empty line) reads as the answer and compares with
`expected_answer` exactly. Generation is deterministic per seed.

The registered math domains also try symbolic equality, so an echo of the prompt ("3+4") is
judged equal to "7". With `max_operand` <= 4 a response is at most two tokens and has no room
for it; longer answers want a domain whose options set `symbolic = false`.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from typing import Any

from schemas.tokenizer import ARITHMETIC_TOKENIZER, CharTokenizer

TOY_DOMAIN = "math/arithmetic-000"
"""A registered math domain (schemas/domains.toml), judged by the `math` verifier."""
TOY_TASK_TYPE = "math"


@dataclass(frozen=True)
class ToyTask:
    """One toy task.

    Attributes:
        task_id: unique per (prefix, seed, index).
        prompt_text: e.g. "3+4=".
        expected_answer: e.g. "7", the math verifier's input.
        domain: the registered domain it is judged under.
        task_type: "math".
        max_new_tokens: the longest correct response: the answer's digits and eos.
        tokenizer: the name of the tokenizer whose characters the prompt uses.
    """

    task_id: str
    prompt_text: str
    expected_answer: str
    domain: str = TOY_DOMAIN
    task_type: str = TOY_TASK_TYPE
    max_new_tokens: int = 2
    tokenizer: str = ARITHMETIC_TOKENIZER.name

    def prompt_ids(self, tokenizer: CharTokenizer = ARITHMETIC_TOKENIZER) -> list[int]:
        """The prompt's token ids; raises ValueError if `tokenizer` is not the one the task names."""
        if tokenizer.name != self.tokenizer:
            raise ValueError(
                f"task {self.task_id!r} is written for tokenizer {self.tokenizer!r}, got {tokenizer.name!r}"
            )
        return tokenizer.encode(self.prompt_text)

    def as_dict(self) -> dict[str, Any]:
        """The task as a plain dict (JSON-ready)."""
        return asdict(self)


def addition_pairs(max_operand: int = 4) -> list[tuple[int, int]]:
    """Every (a, b) with 0 <= a, b <= max_operand, in order."""
    _check_operand(max_operand)
    return [(a, b) for a in range(max_operand + 1) for b in range(max_operand + 1)]


def addition_tasks(
    count: int, *, seed: int = 0, max_operand: int = 4, prefix: str = "toy-add"
) -> list[ToyTask]:
    """`count` addition tasks with operands drawn uniformly from 0..max_operand, the same for the same seed.

    Args:
        count: how many tasks.
        seed: the draw's seed; it is part of each task id, so two seeds never share an id.
        max_operand: the largest operand, 0..9 (4 keeps every answer a single digit).
        prefix: the task ids' prefix.
    """
    _check_operand(max_operand)
    if count < 0:
        raise ValueError(f"count must be >= 0, got count={count}")
    rng = random.Random(seed)
    width = len(str(2 * max_operand))
    tasks = []
    for i in range(count):
        a, b = rng.randint(0, max_operand), rng.randint(0, max_operand)
        tasks.append(
            ToyTask(
                task_id=f"{prefix}-{seed}-{i:06d}",
                prompt_text=f"{a}+{b}=",
                expected_answer=str(a + b),
                max_new_tokens=width + 1,
            )
        )
    return tasks


def _check_operand(max_operand: int) -> None:
    if not 0 <= max_operand <= 9:
        raise ValueError(f"max_operand must be a single digit 0..9, got max_operand={max_operand}")
