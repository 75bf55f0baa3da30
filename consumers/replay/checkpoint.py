"""One checkpoint file holding the learner's weights, optimizer and data position together.

Written as numbered steps: (1) serialize to `<path>.partial`, (2) fsync it, (3) rename over
`<path>`, (4) fsync the directory. A crash at any point leaves either the old or the new
checkpoint, whole, so weights and the buffer position can never be out of step. numpy arrays
are stored as tensors so the file loads with `torch.load(weights_only=True)`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from consumers.exceptions import CheckpointError

CHECKPOINT_VERSION = 1


def save_checkpoint(path: Path | str, state: dict[str, Any]) -> Path:
    """Write `state` atomically to `path`; returns the path."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    with partial.open("wb") as out:  # 1
        torch.save(_to_torch({"checkpoint_version": CHECKPOINT_VERSION, **state}), out)
        out.flush()
        os.fsync(out.fileno())  # 2
    partial.replace(target)  # 3
    directory = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(directory)  # 4
    finally:
        os.close(directory)
    return target


def load_checkpoint(path: Path | str) -> dict[str, Any] | None:
    """The state saved at `path`, or None when there is no checkpoint yet."""
    target = Path(path)
    if not target.exists():
        return None
    try:
        state = torch.load(target, weights_only=True)
    except Exception as exc:
        raise CheckpointError(
            f"cannot read the checkpoint {target} ({exc}); move it away to start afresh"
        ) from exc
    if state.get("checkpoint_version") != CHECKPOINT_VERSION:
        raise CheckpointError(
            f"{target} has checkpoint_version {state.get('checkpoint_version')!r}, this rollstream "
            f"reads {CHECKPOINT_VERSION}"
        )
    return dict(state)


def _to_torch(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(value))
    if isinstance(value, dict):
        return {k: _to_torch(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_to_torch(v) for v in value)
    if isinstance(value, np.generic):
        return value.item()
    return value
