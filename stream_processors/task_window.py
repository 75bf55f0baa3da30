"""The completed tasks one source partition remembers, bounded, and their form in the commit state.

The window holds 64-bit keys of task ids (blake2b), the newest `size`; attempts.py consults it.
Stored per partition, only once it has held a task: the keys packed little-endian and
base64-encoded. A commit carries the keys added since the partition's previous stored state
(`{"add": ...}`), or the whole window (`{"all": ...}`, a snapshot) when the keys stored since the
last snapshot would reach `size` or SNAPSHOT_EVERY commits passed; so a commit carries a few
hundred bytes, and `restore` reads back at most SNAPSHOT_EVERY commits of the history.
"""

from __future__ import annotations

import base64
import hashlib
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from schemas.defaults import StreamDefaults

SNAPSHOT_EVERY = 1_000
"""Commits of a partition after which its window is stored whole again."""


def task_key(task_id: str) -> int:
    """The 64-bit key a task id is remembered by (a false match is about 1 in 2**64 / window)."""
    return int.from_bytes(hashlib.blake2b(task_id.encode(), digest_size=8).digest(), "little")


def _pack(keys: Iterable[int], count: int) -> str:
    return base64.b64encode(np.fromiter(keys, dtype="<u8", count=count).tobytes()).decode()


def _unpack(text: str) -> list[int]:
    return np.frombuffer(base64.b64decode(text), dtype="<u8").tolist()


@dataclass(frozen=True, slots=True)
class TaskCheckpoint:
    """What one commit stores of a window: its form, how many new keys it covers, whether whole."""

    form: dict[str, str]
    count: int
    snapshot: bool


class TaskWindow:
    """The keys of the newest `size` tasks whose first complete group one partition owns.

    Args:
        size: task ids remembered; the oldest is forgotten first.
    """

    def __init__(self, size: int = StreamDefaults.task_window) -> None:
        if size < 1:
            raise ValueError(f"the task window must hold at least 1 task id, got size={size}")
        self.size = size
        self._order: deque[int] = deque()
        self._keys: set[int] = set()
        self._unsaved: list[int] = []
        self._commits_since_snapshot: int | None = None  # None: no snapshot stored yet
        self._keys_since_snapshot = 0

    def __contains__(self, key: int) -> bool:
        return key in self._keys

    def __len__(self) -> int:
        return len(self._order)

    def keys(self) -> list[int]:
        """The remembered keys, oldest first."""
        return list(self._order)

    @property
    def stored(self) -> bool:
        """Whether commits carry this window (it has held a task)."""
        return bool(self._order) or self._commits_since_snapshot is not None

    def add(self, key: int) -> None:
        """Remember a completed task (its key is not in the window)."""
        self._order.append(key)
        self._keys.add(key)
        self._unsaved.append(key)
        while len(self._order) > self.size:
            self._keys.discard(self._order.popleft())

    def checkpoint(self) -> TaskCheckpoint | None:
        """The form the next commit stores; None when the window never held a task."""
        if not self.stored:
            return None
        new = len(self._unsaved)
        snapshot = (
            self._commits_since_snapshot is None
            or self._commits_since_snapshot + 1 >= SNAPSHOT_EVERY
            or self._keys_since_snapshot + new >= self.size
        )
        if snapshot:
            return TaskCheckpoint({"all": _pack(self._order, len(self._order))}, new, True)
        return TaskCheckpoint({"add": _pack(self._unsaved, new)}, new, False)

    def saved(self, checkpoint: TaskCheckpoint) -> None:
        """A commit holding `checkpoint` is stored: its keys are no longer new."""
        del self._unsaved[: checkpoint.count]
        if checkpoint.snapshot:
            self._commits_since_snapshot, self._keys_since_snapshot = 0, 0
        else:
            self._commits_since_snapshot = (self._commits_since_snapshot or 0) + 1
            self._keys_since_snapshot += checkpoint.count

    def restore(self, forms: Sequence[Mapping[str, str]]) -> None:
        """Rebuild from stored forms, newest first, ending at a snapshot (or where history ends)."""
        adds: list[list[int]] = []
        base: list[int] = []
        snapshot = False
        for form in forms:
            if "all" in form:
                base, snapshot = _unpack(form["all"]), True
                break
            adds.append(_unpack(form.get("add", "")))
        keys = base + [k for chunk in reversed(adds) for k in chunk]
        self._order = deque(keys[-self.size :])
        self._keys = set(self._order)
        self._unsaved = []
        self._commits_since_snapshot = len(adds) if snapshot else None
        self._keys_since_snapshot = sum(len(chunk) for chunk in adds)


class TaskChain:
    """Stored forms of one partition's window, read newest first from the table's history."""

    def __init__(self) -> None:
        self.forms: list[Mapping[str, str]] = []
        self.done = False

    def feed(self, stored: Mapping[str, Any]) -> None:
        """Take the next older stored state of the partition; done at a snapshot or without a form."""
        form = stored.get("tasks")
        if not isinstance(form, Mapping):
            self.done = True
            return
        self.forms.append(form)
        self.done = "all" in form
