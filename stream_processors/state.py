"""The stream stage's state, kept where the offsets are: in the trajectories table's Delta commits.

Per source (topic, partition): `next`, the lowest offset not yet decided (every offset below it is
a row in the table or a dead letter in its table); `holes`, the offsets at or above `next` already
decided (rows, or dead letters of decided groups: their groups were decided before an older group
of the partition); the running statistics of the domains whose groups this partition owns (a group
is owned by the partition of its lowest sample_index, so a group spanning rollouts.raw and
rollouts.ultra counts once); and the tasks whose first complete group it owns (task_window.py),
read back by walking the history to the window's last snapshot. Pending groups themselves are not
stored: every sample of a pending group sits at or above its partition's `next` and outside its
holes, so the replay from `next` rebuilds them.

Every commit of rows carries the state of every partition the worker consumed since it started
(never a partition another worker may own), as custom commit metadata (key STATE_KEY) written atomically with the rows and the txn versions (`next - 1`), and
the topics' ids, so a recreated topic is recognised. `load` reads the newest state per partition
back from the table's history.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from schemas.defaults import StreamDefaults
from schemas.history import newest_first
from schemas.tables import DEAD_LETTERS_SCHEMA, EXECUTIONS_SCHEMA, TRAJECTORIES_SCHEMA
from stream_processors.domain_stats import DomainStats, RunningStats, merge
from stream_processors.offsets import Coordinates, TopicPartition, TxnTable
from stream_processors.task_window import TaskChain, TaskCheckpoint, TaskWindow

log = logging.getLogger(__name__)

STATE_KEY = "rollstream.state"
STATE_VERSION = 1


@dataclass(slots=True)
class PartitionState:
    """What one source partition has decided (see the module docstring).

    `checkpoint` is what a commit stores of `tasks`, fixed when the commit is prepared (the window
    keeps changing while a background commit runs); None stores its current form.
    """

    next: int = 0
    holes: set[int] = field(default_factory=set)
    stats: DomainStats = field(default_factory=DomainStats)
    tasks: TaskWindow = field(default_factory=TaskWindow)
    checkpoint: TaskCheckpoint | None = None

    def done(self, offset: int) -> bool:
        """True when the message at `offset` is already a row or a dead letter."""
        return offset < self.next or offset in self.holes

    def as_dict(self) -> dict[str, Any]:
        """The stored form."""
        out: dict[str, Any] = {
            "next": self.next,
            "holes": sorted(self.holes),
            "domains": self.stats.state_dict(),
        }
        checkpoint = self.checkpoint if self.checkpoint is not None else self.tasks.checkpoint()
        if checkpoint is not None:
            out["tasks"] = checkpoint.form
        return out


def _key(tp: TopicPartition) -> str:
    return json.dumps([tp[0], tp[1]], separators=(",", ":"))


def _tp(key: str) -> TopicPartition:
    topic, partition = json.loads(key)
    return str(topic), int(partition)


@dataclass(slots=True)
class SinkState:
    """Every held partition's state, the topics' ids, and the table version of our last commit.

    Args:
        app_id: the pipeline's identity (as in the txn app ids).
        decay, warmup: the domain statistics' settings (domain_stats.DomainStats).
        task_window: completed task ids remembered per partition (task_window.TaskWindow).
    """

    app_id: str
    decay: float = StreamDefaults.domain_decay
    warmup: int = StreamDefaults.domain_warmup
    partitions: dict[TopicPartition, PartitionState] = field(default_factory=dict)
    topic_ids: dict[str, str] = field(default_factory=dict)
    last_version: int | None = None
    task_window: int = StreamDefaults.task_window

    def partition(self, tp: TopicPartition) -> PartitionState:
        """The state of `tp`, empty when nothing was stored."""
        state = self.partitions.get(tp)
        if state is None:
            state = self.partitions[tp] = self._empty()
        return state

    def _stats(self) -> DomainStats:
        return DomainStats(decay=self.decay, warmup=self.warmup)

    def _empty(self, next_offset: int = 0) -> PartitionState:
        return PartitionState(next_offset, set(), self._stats(), TaskWindow(self.task_window))

    def _stored(self, stored: Mapping[str, Any]) -> PartitionState:
        """A partition's state from its stored form (its task window is restored separately)."""
        state = self._empty(int(stored["next"]))
        state.holes = set(stored.get("holes", []))
        state.stats.load_state_dict(stored.get("domains", {}))
        return state

    def has_task(self, key: int) -> bool:
        """Whether a held partition remembers the task `key` as completed."""
        return any(key in p.tasks for p in self.partitions.values())

    def done(self, c: Coordinates) -> bool:
        """True when the message at `c` is already decided (a replay skips it)."""
        state = self.partitions.get((c.topic, c.partition))
        return state is not None and state.done(c.offset)

    def merged_stats(self) -> dict[str, RunningStats]:
        """Per-domain statistics over every held partition."""
        return merge(p.stats for p in self.partitions.values())

    def metadata(self, profile_id: str) -> dict[str, str]:
        """The custom commit metadata holding this state."""
        body = {
            "version": STATE_VERSION,
            "app_id": self.app_id,
            "profile_id": profile_id,
            "topic_ids": dict(sorted(self.topic_ids.items())),
            "partitions": {_key(tp): s.as_dict() for tp, s in sorted(self.partitions.items())},
        }
        return {STATE_KEY: json.dumps(body, separators=(",", ":")), "rollstream.profile_id": profile_id}

    def versions(self) -> dict[TopicPartition, int]:
        """The txn version per partition: the highest offset below which everything is decided."""
        return {tp: s.next - 1 for tp, s in self.partitions.items()}

    def drop(self, tps: Iterable[TopicPartition]) -> None:
        """Forget partitions (revoked): their state is reloaded from the table if they come back."""
        for tp in tps:
            self.partitions.pop(tp, None)

    def load(self, table: TxnTable, wanted: Iterable[TopicPartition]) -> None:
        """Read the newest stored state of each wanted partition (history, newest first), and its
        task window's forms back to the window's last snapshot.

        A partition with no stored state but a txn version from an older rollstream (offsets only)
        resumes after that version with empty statistics (migration); one with neither starts at 0.
        """
        missing = set(wanted) - set(self.partitions)
        dt = table.refresh()
        if not missing:
            return
        if dt is None:
            for tp in missing:
                self.partitions[tp] = self._empty()
            return
        chains: dict[TopicPartition, TaskChain] = {}
        for entry in newest_first(dt):
            body = _state_of(entry, self.app_id)
            if body is None:
                continue
            if self.last_version is None:
                self.last_version = int(entry["version"])
            for topic, topic_id in body.get("topic_ids", {}).items():
                self.topic_ids.setdefault(topic, topic_id)
            for key, stored in body.get("partitions", {}).items():
                tp = _tp(key)
                if tp in missing:
                    self.partitions[tp] = self._stored(stored)
                    missing.discard(tp)
                    chains[tp] = TaskChain()
                chain = chains.get(tp)
                if chain is not None and not chain.done:
                    chain.feed(stored)
            if not missing and all(c.done for c in chains.values()):
                break
        for tp, chain in chains.items():
            self.partitions[tp].tasks.restore(chain.forms)
        for tp in sorted(missing):
            legacy = table.version_of(dt, *tp)
            if legacy is not None:
                log.info(
                    "%s: no stored state for %s; resuming after the offset %d it stored",
                    table.uri,
                    tp,
                    legacy,
                )
                self.partitions[tp] = self._empty(legacy + 1)
            else:
                self.partitions[tp] = self._empty()


def _state_of(entry: Mapping[str, Any], app_id: str) -> dict[str, Any] | None:
    raw = entry.get(STATE_KEY)
    if not isinstance(raw, str):
        return None
    body = json.loads(raw)
    return body if isinstance(body, dict) and body.get("app_id") == app_id else None


def stored_partitions(table: TxnTable, app_id: str) -> dict[TopicPartition, PartitionState]:
    """The newest stored state of every partition `app_id` ever wrote (for checks and reports)."""
    state = SinkState(app_id)
    dt = table.refresh()
    if dt is None:
        return {}
    wanted: set[TopicPartition] = set()
    for entry in newest_first(dt):
        body = _state_of(entry, app_id)
        if body is not None:
            wanted.update(_tp(k) for k in body.get("partitions", {}))
    state.load(table, wanted)
    return state.partitions


def stored_topic_ids(table: TxnTable, app_id: str) -> dict[str, str]:
    """The topic ids of the newest stored state of `app_id` (empty when none is stored)."""
    dt = table.refresh()
    if dt is None:
        return {}
    for entry in newest_first(dt):
        body = _state_of(entry, app_id)
        if body is not None:
            return {str(k): str(v) for k, v in body.get("topic_ids", {}).items()}
    return {}


def reset_topic(
    table: TxnTable,
    dead_letters: TxnTable,
    *,
    topic: str,
    partitions: int,
    topic_id: str,
    profile_id: str,
    executions: TxnTable | None = None,
) -> int:
    """Start `topic` afresh for this app id (after it was recreated): offsets 0, the new topic id.

    Writes one commit without rows to each table: the trajectories table's state with the topic's
    partitions at next 0 and no holes (domain statistics and task windows kept), txn versions -1 in
    both. Returns the trajectories table's new version. The executions table, when given and
    present, gets txn versions -1 too.
    """
    state = SinkState(table.app_id)
    dt = table.refresh()
    newest: list[TopicPartition] = []
    topic_ids: dict[str, str] = {}
    for entry in newest_first(dt) if dt is not None else ():
        body = _state_of(entry, table.app_id)
        if body is not None:
            newest = [_tp(key) for key in body.get("partitions", {})]
            topic_ids = {str(k): str(v) for k, v in body.get("topic_ids", {}).items()}
            break
    state.load(table, newest)
    state.topic_ids = topic_ids
    for p in range(partitions):
        kept = state.partition((topic, p))
        state.partitions[(topic, p)] = PartitionState(0, set(), kept.stats, kept.tasks)
    state.topic_ids[topic] = topic_id
    versions = {(topic, p): -1 for p in range(partitions)}
    version = table.commit(
        TRAJECTORIES_SCHEMA.empty_table(), versions, state.metadata(profile_id), expected=None
    )
    dead_letters.commit(DEAD_LETTERS_SCHEMA.empty_table(), versions, {}, expected=None)
    if executions is not None and executions.refresh() is not None:
        executions.commit(EXECUTIONS_SCHEMA.empty_table(), versions, {}, expected=None)
    return version
