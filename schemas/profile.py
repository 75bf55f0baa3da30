"""The inference workload profile: named length buckets, their token edges and target shares.

Three stages read it and none may import another (ARCHITECTURE.md, Contracts): the stream stage
files each trajectory under a bucket, the replay buffer samples to the shares, and producers draw
generation lengths from it. A profile is fitted from a trace of real request lengths
(`schemas.profile_fit`) and stored as a small TOML file; its id is a hash of what decides
bucketing and sampling, so a row's `profile_id` names exactly the profile that bucketed it.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import json
import math
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from schemas.exceptions import ProfileError

PROFILE_FORMAT_VERSION = 1
DEFAULT_PROFILE_FILE = "azure_conv_2023.toml"
"""Shipped in schemas/profiles/: fitted from the Azure LLM inference trace (conversation), 2023."""


@dataclass(frozen=True, slots=True)
class Bucket:
    """One length bucket: trajectories of `lower <= prompt + response tokens < upper`.

    Attributes:
        name: the bucket's name, as stored in the `bucket` column (e.g. "short").
        lower: smallest total length in the bucket (inclusive).
        upper: first total length above the bucket (exclusive); None for the last, unbounded one.
        share: the target fraction of trajectories in this bucket, in [0, 1].
        quantiles: total lengths at evenly spaced quantiles (0 to 1) within the bucket, for drawing
            lengths; at least two, non-decreasing.
        prompt_share: the mean fraction of a request's tokens that is prompt (context).
    """

    name: str
    lower: int
    upper: int | None
    share: float
    quantiles: tuple[int, ...]
    prompt_share: float = 0.5


@dataclass(frozen=True, slots=True)
class SampledLength:
    """A drawn request size: prompt and response tokens (the response is at least 1)."""

    prompt_tokens: int
    response_tokens: int

    @property
    def total(self) -> int:
        """Prompt plus response tokens: what the bucket is chosen by."""
        return self.prompt_tokens + self.response_tokens


@dataclass(frozen=True)
class WorkloadProfile:
    """Buckets in increasing length order covering [0, inf), with shares that sum to 1.

    Attributes:
        buckets: the buckets, contiguous: each one's `upper` is the next one's `lower`.
        source: where the profile came from (the trace file, and its attribution).
        method: how it was fitted ("quantiles 0.5,0.9" or "edges 1024,4096").
    """

    buckets: tuple[Bucket, ...]
    source: str = ""
    method: str = ""
    _edges: npt.NDArray[np.int64] = field(init=False, repr=False, compare=False)
    _uppers: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _check_buckets(self.buckets)
        uppers = [b.upper for b in self.buckets[:-1]]
        object.__setattr__(self, "_edges", np.asarray(uppers, dtype=np.int64))
        object.__setattr__(self, "_uppers", tuple(self._edges.tolist()))  # for bisect, per row

    @property
    def names(self) -> tuple[str, ...]:
        """Bucket names, shortest first."""
        return tuple(b.name for b in self.buckets)

    @property
    def targets(self) -> dict[str, float]:
        """Bucket name -> target share."""
        return {b.name: b.share for b in self.buckets}

    @property
    def id(self) -> str:
        """A content hash of the buckets (names, edges, shares, length quantiles): 16 hex digits."""
        canonical = json.dumps(
            [[b.name, b.lower, b.upper, round(b.share, 12), list(b.quantiles)] for b in self.buckets],
            separators=(",", ":"),
        )
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

    def bucket_indexes(self, lengths: npt.ArrayLike) -> npt.NDArray[np.int64]:
        """The bucket index of each total length (vectorized)."""
        values = np.asarray(lengths, dtype=np.int64)
        if values.size and int(values.min()) < 0:
            raise ProfileError(f"lengths must be >= 0, got {int(values.min())}")
        return np.searchsorted(self._edges, values, side="right").astype(np.int64)

    def bucket_of(self, length: int) -> str:
        """The name of the bucket that holds a total length."""
        if length < 0:
            raise ProfileError(f"lengths must be >= 0, got {length}")
        return self.buckets[bisect.bisect_right(self._uppers, length)].name  # per row: no numpy call

    def bucket_names(self, lengths: npt.ArrayLike) -> list[str]:
        """The bucket name of each total length."""
        names = self.names
        return [names[i] for i in self.bucket_indexes(lengths)]

    def mix(self, lengths: npt.ArrayLike) -> dict[str, float]:
        """The share of `lengths` that falls in each bucket (every bucket named, zeros included)."""
        index = self.bucket_indexes(lengths)
        counts = np.bincount(index, minlength=len(self.buckets)).astype(np.float64)
        total = counts.sum()
        return {b.name: float(c / total) if total else 0.0 for b, c in zip(self.buckets, counts, strict=True)}

    def distance(self, counts: Mapping[str, float]) -> float:
        """Total-variation distance between a delivered mix (counts or shares by name) and the targets.

        Names that are not buckets of this profile count as delivered outside every target.
        """
        total = float(sum(counts.values()))
        if total <= 0:
            return 1.0
        delivered = {name: value / total for name, value in counts.items()}
        names = set(delivered) | set(self.names)
        targets = self.targets
        return 0.5 * sum(abs(delivered.get(n, 0.0) - targets.get(n, 0.0)) for n in names)

    def sample_length(
        self, rng: np.random.Generator, *, weights: Mapping[str, float] | None = None
    ) -> SampledLength:
        """Draw a request size: a bucket by its share (or by `weights`), then a length within it.

        Args:
            rng: the random source (a seeded generator gives a deterministic fleet).
            weights: bucket name -> relative weight replacing the shares, for a task type whose
                context profile differs from the workload's (e.g. code tasks run long).
        """
        shares = np.asarray(
            [b.share if weights is None else float(weights.get(b.name, 0.0)) for b in self.buckets]
        )
        if not np.all(np.isfinite(shares)) or shares.min() < 0 or shares.sum() <= 0:
            raise ProfileError(f"bucket weights must be finite, >= 0 and not all 0, got {weights}")
        bucket = self.buckets[int(rng.choice(len(self.buckets), p=shares / shares.sum()))]
        knots = np.asarray(bucket.quantiles, dtype=np.float64)
        total = round(float(np.interp(rng.random(), np.linspace(0, 1, len(knots)), knots)))
        upper = bucket.upper if bucket.upper is not None else max(total + 1, bucket.lower + 2)
        total = min(max(total, bucket.lower, 2), upper - 1)
        prompt = min(max(round(total * bucket.prompt_share), 1), total - 1)
        return SampledLength(prompt, total - prompt)

    def to_toml(self) -> str:
        """The profile as the TOML text `load_profile` reads back."""
        lines = [
            "# rollstream inference workload profile (`rollstream profile show FILE` prints it)",
            f"format_version = {PROFILE_FORMAT_VERSION}",
            f"id = {json.dumps(self.id)}",
            f"source = {json.dumps(self.source)}",
            f"method = {json.dumps(self.method)}",
        ]
        for b in self.buckets:
            lines += [
                "",
                "[[buckets]]",
                f"name = {json.dumps(b.name)}",
                f"lower = {b.lower}",
                *([f"upper = {b.upper}"] if b.upper is not None else []),
                f"share = {b.share!r}",
                f"prompt_share = {b.prompt_share!r}",
                f"quantiles = [{', '.join(str(q) for q in b.quantiles)}]",
            ]
        return "\n".join(lines) + "\n"

    def save(self, path: Path | str) -> Path:
        """Write the profile atomically (write, then rename); returns the path."""
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(target.name + ".partial")
        partial.write_text(self.to_toml())
        partial.replace(target)
        return target


def _check_buckets(buckets: Sequence[Bucket]) -> None:
    if not buckets:
        raise ProfileError("a profile needs at least one bucket")
    names = [b.name for b in buckets]
    if len(set(names)) != len(names) or not all(n and n.strip() == n and "/" not in n for n in names):
        raise ProfileError(f"bucket names must be unique, non-empty, without '/' or edge spaces: {names}")
    if buckets[0].lower != 0 or buckets[-1].upper is not None:
        raise ProfileError("buckets must start at length 0 and the last one must have no upper edge")
    for b, after in itertools.pairwise(buckets):
        if b.upper is None or b.upper != after.lower or b.upper <= b.lower:
            raise ProfileError(
                f"bucket {b.name!r} [{b.lower}, {b.upper}) must end where {after.name!r} starts "
                f"({after.lower}), above its own lower edge"
            )
    shares = [b.share for b in buckets]
    if any(not math.isfinite(s) or s < 0 for s in shares) or abs(sum(shares) - 1.0) > 1e-6:
        raise ProfileError(f"shares must be >= 0 and sum to 1, got {shares} (sum {sum(shares)})")
    for b in buckets:
        if len(b.quantiles) < 2 or any(y < x for x, y in zip(b.quantiles, b.quantiles[1:], strict=False)):
            raise ProfileError(f"bucket {b.name!r}: quantiles must be >= 2 non-decreasing lengths")
        if not 0.0 <= b.prompt_share <= 1.0:
            raise ProfileError(f"bucket {b.name!r}: prompt_share must lie in [0, 1], got {b.prompt_share}")


def _bucket(entry: Mapping[str, Any], where: str) -> Bucket:
    try:
        upper = entry.get("upper")
        return Bucket(
            name=str(entry["name"]),
            lower=int(entry["lower"]),
            upper=None if upper is None else int(upper),
            share=float(entry["share"]),
            quantiles=tuple(int(q) for q in entry["quantiles"]),
            prompt_share=float(entry.get("prompt_share", 0.5)),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ProfileError(
            f"{where}: a bucket lacks or mistypes {exc}; see schemas/profile.py Bucket"
        ) from exc


def load_profile(path: Path | str | None = None) -> WorkloadProfile:
    """Read a profile file; None reads the shipped default (fitted from the Azure 2023 trace)."""
    if path is None:
        text = resources.files("schemas").joinpath("profiles", DEFAULT_PROFILE_FILE).read_text()
        where = f"schemas/profiles/{DEFAULT_PROFILE_FILE}"
    else:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise ProfileError(
                f"cannot read the profile {path}: {exc}; fit one with `rollstream profile fit TRACE`"
            ) from exc
        where = str(path)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(f"{where} is not valid TOML: {exc}") from exc
    version = data.get("format_version")
    if version != PROFILE_FORMAT_VERSION:
        raise ProfileError(
            f"{where}: format_version={version!r}, this rollstream reads {PROFILE_FORMAT_VERSION}"
        )
    buckets = tuple(_bucket(b, where) for b in data.get("buckets", []))
    profile = WorkloadProfile(buckets, source=str(data.get("source", "")), method=str(data.get("method", "")))
    stated = data.get("id")
    if stated is not None and stated != profile.id:
        raise ProfileError(
            f"{where}: id {stated!r} does not match its buckets (hash {profile.id!r}); the file was "
            "edited by hand: fit it again, or delete the id line to accept the edit"
        )
    return profile
