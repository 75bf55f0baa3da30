"""One of several processes appending to one Delta table at once (imported by spawned children,
so it stays light: no test module, no torch)."""

from __future__ import annotations

import pyarrow as pa

from stream_processors.offsets import Coordinates, TxnTable

COMMITS = 2
ROWS = 50


def append_batches(uri: str, options: dict[str, str], writer: int) -> int:
    """COMMITS appends of ROWS rows of partition `writer` (its own txn id); returns rows written."""
    table = TxnTable(uri, app_id="concurrent", storage_options=options, commit_retries=20)
    written = 0
    for commit in range(COMMITS):
        coords = [Coordinates("t", writer, o) for o in range(commit * ROWS, (commit + 1) * ROWS)]
        written += table.append(
            coords,
            lambda keep, coords=coords: pa.table(
                {
                    "partition": pa.array([writer] * len(keep), pa.int32()),
                    "offset": pa.array([coords[i].offset for i in keep], pa.int64()),
                }
            ),
        )
    return written
