"""`CharTokenizer`: a character-level vocabulary, one token per character plus named special tokens.

The tokenizer file is JSON, shared by whoever tokenizes prompts and whoever decodes responses:

    {"type": "char", "name": "arithmetic-char-v1", "tokens": ["<pad>", "<eos>", "0", ...],
     "eos": "<eos>", "pad": "<pad>"}

A token's id is its index in `tokens`. Every token but the special ones (`eos`, `pad`) is exactly
one character; special tokens are never produced by `encode`, only by a model.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from schemas.exceptions import RollstreamError

TOKENIZER_TYPE = "char"


class TokenizerError(RollstreamError, ValueError):
    """A tokenizer file or vocabulary is invalid, or text or ids do not fit the vocabulary."""


class CharTokenizer:
    """Characters to ids and back over a fixed vocabulary.

    Args:
        tokens: the vocabulary in id order: single characters and the special tokens.
        eos: the end-of-sequence token, one of `tokens`.
        pad: the padding token, one of `tokens`, or None.
        name: a name for the vocabulary, recorded with tasks that carry text.
    """

    def __init__(
        self, tokens: Sequence[str], *, eos: str, pad: str | None = None, name: str = "char"
    ) -> None:
        specials = {eos} | ({pad} if pad is not None else set())
        if len(set(tokens)) != len(tokens):
            repeated = sorted({t for t in tokens if tokens.count(t) > 1})
            raise TokenizerError(
                f"tokenizer {name!r} lists tokens more than once: {repeated}; list each once"
            )
        missing = sorted(specials - set(tokens))
        if missing:
            raise TokenizerError(
                f"tokenizer {name!r}: special tokens {missing} are not in its tokens; add them"
            )
        if pad == eos:
            raise TokenizerError(
                f"tokenizer {name!r}: pad and eos are both {eos!r}; give padding its own token"
            )
        wide = [t for t in tokens if t not in specials and len(t) != 1]
        if wide:
            raise TokenizerError(
                f"tokenizer {name!r}: tokens {wide[:5]} are not single characters; a char tokenizer has one "
                "character per token besides eos and pad"
            )
        self.tokens: tuple[str, ...] = tuple(tokens)
        self.eos = eos
        self.pad = pad
        self.name = name
        self._ids = {t: i for i, t in enumerate(self.tokens) if t not in specials}
        self.eos_id = self.tokens.index(eos)
        self.pad_id: int | None = None if pad is None else self.tokens.index(pad)

    @property
    def vocab_size(self) -> int:
        """The number of ids, specials included: ids lie in [0, vocab_size)."""
        return len(self.tokens)

    def encode(self, text: str) -> list[int]:
        """One id per character; raises TokenizerError on a character outside the vocabulary."""
        try:
            return [self._ids[ch] for ch in text]
        except KeyError as err:
            raise TokenizerError(
                f"{err.args[0]!r} (in {text[:40]!r}) is not in tokenizer {self.name!r}, whose characters are "
                f"{''.join(sorted(self._ids))!r}: use another tokenizer or drop the character"
            ) from None

    def decode(self, ids: Iterable[int]) -> str:
        """The text of `ids` up to the first eos (excluded); pad ids are dropped."""
        out = []
        for i in ids:
            if not 0 <= i < len(self.tokens):
                raise TokenizerError(
                    f"id {i} is outside tokenizer {self.name!r}'s vocabulary [0, {self.vocab_size})"
                )
            if i == self.eos_id:
                break
            if i != self.pad_id:
                out.append(self.tokens[i])
        return "".join(out)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (see the module)."""
        return {
            "type": TOKENIZER_TYPE,
            "name": self.name,
            "tokens": list(self.tokens),
            "eos": self.eos,
            "pad": self.pad,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CharTokenizer:
        """A tokenizer from its JSON form; raises TokenizerError if it is not a valid char tokenizer."""
        if data.get("type") != TOKENIZER_TYPE:
            raise TokenizerError(f"tokenizer type must be {TOKENIZER_TYPE!r}, got {data.get('type')!r}")
        tokens, eos, pad = data.get("tokens"), data.get("eos"), data.get("pad")
        if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
            raise TokenizerError(f"tokenizer 'tokens' must be a list of strings, got {tokens!r:.80}")
        if not isinstance(eos, str) or not (pad is None or isinstance(pad, str)):
            raise TokenizerError(
                f"tokenizer 'eos' must be a string and 'pad' a string or null, got {eos!r}, {pad!r}"
            )
        return cls(tokens, eos=eos, pad=pad, name=str(data.get("name", "char")))

    def save(self, path: str | Path) -> None:
        """Write the JSON file."""
        Path(path).write_text(json.dumps(self.to_dict(), indent=1) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> CharTokenizer:
        """Read a JSON tokenizer file; raises TokenizerError if it is missing or invalid."""
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise TokenizerError(f"cannot read tokenizer file {str(path)!r}: {err}") from err
        if not isinstance(data, dict):
            raise TokenizerError(f"tokenizer file {str(path)!r} must hold a JSON object")
        return cls.from_dict(data)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CharTokenizer) and self.to_dict() == other.to_dict()

    def __hash__(self) -> int:
        return hash((self.tokens, self.eos, self.pad, self.name))

    def __repr__(self) -> str:
        return f"CharTokenizer(name={self.name!r}, vocab_size={self.vocab_size})"


ARITHMETIC_TOKENIZER = CharTokenizer(
    ["<pad>", "<eos>", *"0123456789", "+", "-", "*", "=", "?", " "],
    eos="<eos>",
    pad="<pad>",
    name="arithmetic-char-v1",
)
"""Digits, `+ - * = ?` and space; pad is id 0 (the replay batches' PAD_ID), eos id 1."""
