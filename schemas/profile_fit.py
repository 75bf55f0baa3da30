"""Fitting an inference workload profile from a trace of real request lengths.

A trace is a CSV or Parquet file with one row per request and two token counts: the prompt
(context) and the generation. Edges come from quantiles of the total length, or are given; the
shares are the trace's own counts under those edges, so bucketing the trace reproduces them.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
import polars as pl

from schemas.exceptions import ProfileError
from schemas.profile import Bucket, WorkloadProfile

DEFAULT_NAMES = ("short", "long", "ultra_long")
DEFAULT_QUANTILES = (0.5, 0.9)
QUANTILE_KNOTS = 11
"""Lengths stored per bucket for drawing (deciles, ends included)."""

_COLUMN_PAIRS = (
    ("ContextTokens", "GeneratedTokens"),
    ("prompt_tokens", "response_tokens"),
    ("input_tokens", "output_tokens"),
    ("context_tokens", "generated_tokens"),
)


def read_trace(path: Path | str) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """(prompt tokens, generated tokens) per request from a CSV or Parquet trace."""
    source = Path(path)
    if not source.exists():
        raise ProfileError(f"trace {source} does not exist")
    try:
        frame = pl.read_parquet(source) if source.suffix == ".parquet" else pl.read_csv(source)
    except Exception as exc:  # polars raises several types for unreadable files
        raise ProfileError(f"cannot read trace {source} as CSV or Parquet: {exc}") from exc
    for prompt, generated in _COLUMN_PAIRS:
        if prompt in frame.columns and generated in frame.columns:
            counts = frame.select(
                pl.col(prompt).cast(pl.Int64), pl.col(generated).cast(pl.Int64)
            ).drop_nulls()
            if counts.height == 0:
                raise ProfileError(f"trace {source} has no rows with both {prompt} and {generated}")
            p, g = counts[prompt].to_numpy(), counts[generated].to_numpy()
            if p.min() < 0 or g.min() < 0:
                raise ProfileError(f"trace {source} holds negative token counts")
            return p, g
    raise ProfileError(
        f"trace {source} has columns {frame.columns}; expected one pair of "
        f"{[f'{a}/{b}' for a, b in _COLUMN_PAIRS]}"
    )


def fit_profile(
    prompt_tokens: npt.ArrayLike,
    generated_tokens: npt.ArrayLike,
    *,
    quantiles: Sequence[float] | None = None,
    edges: Sequence[int] | None = None,
    names: Sequence[str] | None = None,
    source: str = "",
) -> WorkloadProfile:
    """A profile whose bucket edges are quantiles of the total length, or the given edges.

    Args:
        prompt_tokens: per request, the prompt's token count.
        generated_tokens: per request, the generation's token count.
        quantiles: increasing values in (0, 1); default (0.5, 0.9). Not with `edges`.
        edges: increasing total lengths where a bucket ends. Not with `quantiles`.
        names: one per bucket (edges + 1); default short, long, ultra_long for three buckets.
        source: where the trace came from, with its attribution.
    """
    prompt = np.asarray(prompt_tokens, dtype=np.int64)
    total = prompt + np.asarray(generated_tokens, dtype=np.int64)
    if total.size == 0:
        raise ProfileError("cannot fit a profile to an empty trace")
    if edges is not None and quantiles is not None:
        raise ProfileError("give quantiles or edges, not both")
    if edges is None:
        qs = tuple(quantiles) if quantiles is not None else DEFAULT_QUANTILES
        if not qs or any(not 0 < q < 1 for q in qs) or any(b <= a for a, b in itertools.pairwise(qs)):
            raise ProfileError(f"quantiles must be increasing values in (0, 1), got {list(qs)}")
        cut = [int(np.quantile(total, q, method="higher")) for q in qs]
        method = "quantiles " + ",".join(f"{q:g}" for q in qs)
    else:
        cut = [int(e) for e in edges]
        method = "edges " + ",".join(str(e) for e in cut)
    if not cut or cut[0] <= 0 or any(b <= a for a, b in itertools.pairwise(cut)):
        raise ProfileError(
            f"bucket edges must be positive and strictly increasing, got {cut}: the trace may have "
            "too few distinct lengths for these quantiles; give --edges instead"
        )
    labels = tuple(names) if names is not None else _default_names(len(cut) + 1)
    if len(labels) != len(cut) + 1:
        raise ProfileError(f"{len(cut) + 1} buckets need {len(cut) + 1} names, got {list(labels)}")
    bounds = [0, *cut, None]
    index = np.searchsorted(np.asarray(cut), total, side="right")
    buckets = []
    for i, name in enumerate(labels):
        inside = total[index == i]
        lower, upper = bounds[i], bounds[i + 1]
        if inside.size:
            knots = tuple(int(v) for v in np.quantile(inside, np.linspace(0, 1, QUANTILE_KNOTS)))
            prompt_share = float(np.mean(prompt[index == i] / np.maximum(inside, 1)))
        else:  # an empty bucket keeps a flat draw across its edges
            assert lower is not None
            hi = upper - 1 if upper is not None else lower * 2 + 2
            knots, prompt_share = (lower, hi), 0.5
        buckets.append(
            Bucket(name, int(lower or 0), upper, inside.size / total.size, knots, round(prompt_share, 6))
        )
    shares = [b.share for b in buckets]
    buckets[-1] = _with_share(buckets[-1], 1.0 - sum(shares[:-1]))  # exact sum despite float rounding
    return WorkloadProfile(tuple(buckets), source=source, method=method)


def _with_share(bucket: Bucket, share: float) -> Bucket:
    return Bucket(
        bucket.name, bucket.lower, bucket.upper, max(share, 0.0), bucket.quantiles, bucket.prompt_share
    )


def _default_names(count: int) -> tuple[str, ...]:
    return DEFAULT_NAMES if count == len(DEFAULT_NAMES) else tuple(f"b{i}" for i in range(count))
