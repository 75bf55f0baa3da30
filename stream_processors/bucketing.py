"""Length buckets: each trajectory is filed under the smallest edge that holds its length.

The edges are a parameter; a later change fits them to the inference workload profile.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise

import numpy as np
import numpy.typing as npt

DEFAULT_EDGES: tuple[int, ...] = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
OVERFLOW_BUCKET = 2**31 - 1


def check_edges(edges: Sequence[int]) -> tuple[int, ...]:
    """Return the edges as a tuple; raises ValueError unless they are positive and increasing."""
    out = tuple(int(e) for e in edges)
    if not out or out[0] <= 0 or any(b <= a for a, b in pairwise(out)):
        raise ValueError(f"bucket edges must be positive and strictly increasing, got {list(edges)}")
    if out[-1] >= OVERFLOW_BUCKET:
        raise ValueError(
            f"bucket edges must stay below {OVERFLOW_BUCKET} (the overflow bucket), got {out[-1]}"
        )
    return out


def bucket_for(length: int, edges: Sequence[int] = DEFAULT_EDGES) -> int:
    """The smallest edge >= length, or OVERFLOW_BUCKET when the length exceeds every edge."""
    return int(buckets_for(np.asarray([length]), edges)[0])


def buckets_for(lengths: npt.ArrayLike, edges: Sequence[int] = DEFAULT_EDGES) -> npt.NDArray[np.int32]:
    """Vectorized `bucket_for` over an array of lengths."""
    table = np.asarray((*check_edges(edges), OVERFLOW_BUCKET), dtype=np.int64)
    index = np.searchsorted(table, np.asarray(lengths, dtype=np.int64), side="left")
    return table[np.minimum(index, len(table) - 1)].astype(np.int32)
