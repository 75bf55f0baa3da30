"""Where a Delta table lies on a local disk: its directory and its commit files.

On a local disk deltalake lists the whole `_delta_log` to find newer versions (object_store's
local listing cannot start after a key), so readers and writers that follow a table check for
the next commit file instead.
"""

from __future__ import annotations

from pathlib import Path


def local_path(uri: str) -> Path | None:
    """The local path of a table or file URI (a path or a file:// URI); None for an object store."""
    if uri.startswith("file://"):
        return Path(uri.removeprefix("file://"))
    return None if "://" in uri else Path(uri)


def commit_file(table_dir: Path, version: int) -> Path:
    """The commit file of `version` in the log of the table at `table_dir`."""
    return table_dir / "_delta_log" / f"{version:020d}.json"
