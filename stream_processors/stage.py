"""The synchronous heart of the stream stage: judged batches through groups, statistics and sinks.

Kept free of Faust so it can be tested and benchmarked alone. The worker (stream_worker.py) judges
each lane's batches in the lane's own thread (`BatchProcessor.judge`) and runs `accept`, `tick`,
`flush`, `revoke` and `assign` in its one sink thread; after each it acks, per partition, the
messages below `safe_offsets()`, so Kafka's committed offset never passes a message whose row or
dead letter is not yet stored. A Stage holds no lock: one thread drives its steps; `done`,
`pending_groups` and single lookups of `state.partitions` are safe from other threads.

Steps of `accept`:
  0. a trajectory re-sent (its trajectory_id already accepted in the recent offsets of its
     partition, dedup.py) becomes a dead letter `duplicate`, counted in `BatchStats.duplicates`;
  1. append the batch's sandbox executions (the executions table, exactly once per offset by its
     own txn versions), then send and append its dead letters (likewise), before any commit of
     rows could record their offsets as decided;
  2. buffer each sample in its group (groups.py); a decided group gets its advantages
     (advantages.py), updates its owner partition's domain statistics, and its rows join the
     outbox, unless it is another attempt of a task that has a complete group, or a sample of
     another attempt than its group's (attempts.py): those become dead letters, written at once
     (`DeadLetters.write_decided`), their offsets holes of the next commit;
  3. release the groups the timeout rule decides;
  4. commit the outbox when it holds `commit_bytes` or is `commit_interval_s` old: the rows, the
     txn versions and the state (state.py) in one Delta commit. With `background_commits` (the
     worker's setting) a committer thread writes it while the next batches are accepted, one
     commit at a time; its rows count as safe only once it is stored. Once it is written
     `on_written` is called, so the worker starts the next due commit without waiting for its timer.
A failing write is retried with exponential backoff by tenacity (`write_retries` times), each
retry logged with its attempt, wait and error. A failure of the host while
judging (TransientScoringError, raised by the processor) propagates: the worker stops unacked.
See docs/operations.md for recovery.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import UTC, datetime

import tenacity

from schemas.defaults import StreamDefaults
from stream_processors.advantages import NO_SIGNAL_STATUSES, GroupNormalization, Member, decide_group
from stream_processors.attempts import DUPLICATE_ATTEMPT, MIXED_ATTEMPTS, refused
from stream_processors.dead_letters import DeadLetter, DeadLetters
from stream_processors.dedup import DEFAULT_WINDOW, RecentTrajectories
from stream_processors.delta_sink import DeltaSink, trajectories_table
from stream_processors.domain_stats import RunningStats, standardize
from stream_processors.exceptions import SinkError, StreamProcessorError
from stream_processors.executions import ExecutionLog
from stream_processors.groups import DecidedGroup, GroupBuffer, Sample
from stream_processors.offsets import Coordinates, TopicPartition
from stream_processors.processing import BatchProcessor, JudgedBatch, SourceMessage
from stream_processors.rows import ScoredTrajectory
from stream_processors.state import PartitionState, SinkState
from stream_processors.thread_names import named_executor

log = logging.getLogger(__name__)

MAX_RETRY_WAIT_S = 30.0
"""The longest wait between two attempts of a failing write."""


@dataclass(frozen=True, slots=True)
class BatchStats:
    """What one step did: messages in, rows and dead letters appended, replays skipped, timings."""

    records_in: int
    rows_written: int
    dead_letters_written: int
    rows_skipped: int
    dead_letters_skipped: int
    seconds: float
    process_seconds: float = 0.0
    executions_written: int = 0
    duplicates: int = 0


class StageObserver:
    """What a Stage reports as it goes (the worker's metrics); this base ignores it. A method may
    run in the committer thread as well as the sink thread."""

    def committed(self, rows: int, nbytes: int, seconds: float) -> None:
        """A commit of `rows` rows holding `nbytes` message bytes took `seconds` (its retries included)."""

    def decided(self, status: str, samples: int) -> None:
        """A group of `samples` samples was decided with `status` (groups.py: complete, timed_out, ...)."""


@dataclass(slots=True)
class _Commit:
    """A commit of the outbox under way in the committer thread: what it stores once it succeeds."""

    future: Future[int]
    coordinates: list[Coordinates]
    states: dict[TopicPartition, PartitionState]
    lowest: dict[TopicPartition, int]


DUPLICATE = "duplicate"
"""The error_type of a re-sent trajectory's dead letter (dedup.py)."""


class TopicIdMismatchError(StreamProcessorError):
    """A topic's id differs from the one stored with the offsets: it was deleted and recreated."""


class Stage:
    """Groups, normalizes and persists judged batches, exactly once per offset (see the module doc).

    Args:
        processor: judges messages (decode, validate, verify, bucket).
        sink: the trajectories table.
        dead_letters: the dead-letter topic and table.
        executions: the audit table of sandbox executions; None records none.
        normalization: how group advantages are computed.
        groups: the pending-group buffer (its timeouts).
        decay, warmup: domain statistics settings (domain_stats.py).
        commit_bytes: commit the outbox once its messages hold this many bytes.
        commit_interval_s: commit the outbox once its oldest row waited this long.
        idle_commit_s: when the lanes are caught up (less than a batch waits behind their last
            batches), commit once the oldest row waited this long instead: latency matters more
            than file size then.
        write_retries, retry_backoff_s: retries of a failing write before the worker stops.
        dedup_window: offsets per partition within which a re-sent trajectory is recognised as a
            duplicate (dedup.py); 0 turns the rule off.
        task_window: completed task ids remembered per partition, within which another complete
            attempt of a task is a dead letter `duplicate_attempt` (attempts.py).
        observer: told of each commit and each decided group; default none.
        background_commits: a due outbox is written by a committer thread while `accept` goes on
            with the next batches (one commit at a time, and an outbox of `commit_bytes` waits for
            the one under way; its rows stay unsafe until it is stored,
            and `accept`, `tick` and `flush` report its rows once it is). False writes it in the
            calling thread, before returning.
    """

    def __init__(
        self,
        processor: BatchProcessor,
        sink: DeltaSink,
        dead_letters: DeadLetters,
        *,
        executions: ExecutionLog | None = None,
        normalization: GroupNormalization | None = None,
        groups: GroupBuffer | None = None,
        decay: float = StreamDefaults.domain_decay,
        warmup: int = StreamDefaults.domain_warmup,
        commit_bytes: int = StreamDefaults.commit_mib * 2**20,
        commit_interval_s: float = StreamDefaults.commit_interval_s,
        idle_commit_s: float = StreamDefaults.idle_commit_s,
        write_retries: int = StreamDefaults.write_retries,
        retry_backoff_s: float = 0.5,
        dedup_window: int = DEFAULT_WINDOW,
        task_window: int = StreamDefaults.task_window,
        background_commits: bool = False,
        observer: StageObserver | None = None,
    ) -> None:
        self.processor = processor
        self.sink = sink
        self.dead_letters = dead_letters
        self.executions = executions
        self.normalization = normalization if normalization is not None else GroupNormalization()
        self.groups = groups if groups is not None else GroupBuffer()
        self.state = SinkState(sink.table.app_id, decay=decay, warmup=warmup, task_window=task_window)
        self.recent = RecentTrajectories(dedup_window)
        self.commit_bytes = commit_bytes
        self.commit_interval_s = commit_interval_s
        self.idle_commit_s = idle_commit_s
        self.write_retries = write_retries
        self.retry_backoff_s = retry_backoff_s
        self._seen: dict[TopicPartition, int] = {}
        self._pending: set[Coordinates] = set()
        self._outbox: list[ScoredTrajectory] = []
        self._outbox_coords: list[Coordinates] = []
        self._outbox_lowest: dict[TopicPartition, int] = {}  # per partition, its lowest offset
        self._outbox_bytes = 0
        self._outbox_since: float | None = None
        self._letters: list[DeadLetter] = []  # of decided groups, not yet written
        self._letter_coords: list[Coordinates] = []  # written since the last commit: its holes
        self._revoked: set[TopicPartition] = set()
        self._committer = named_executor("commit") if background_commits else None
        self._committing: _Commit | None = None
        self.observer: StageObserver = observer if observer is not None else StageObserver()
        self.on_written: Callable[[], None] = lambda: None
        """Called in the committer thread once a background commit's rows are in the table (the
        worker then runs a `tick` at once, so a due outbox does not wait for the timer)."""

    # -- startup ---------------------------------------------------------------------------------

    def load(self, partitions: Iterable[TopicPartition], topic_ids: Mapping[str, str]) -> None:
        """Read the stored state of `partitions` and check the topics' ids against the stored ones."""
        wanted = list(partitions)
        self.state.load(self.sink.table, wanted)
        for tp in wanted:
            self._load_recent(tp)
        for topic, topic_id in topic_ids.items():
            stored = self.state.topic_ids.get(topic)
            if stored is not None and stored != topic_id:
                raise TopicIdMismatchError(
                    f"topic {topic!r} has id {topic_id} on the broker, but {self.sink.uri} stored its "
                    f"offsets for id {stored}: the topic was deleted and recreated, and its new messages "
                    f"would be skipped as already written. To start this topic afresh in the same lake, "
                    f"run `rollstream offsets reset --topic {topic} --app-id {self.state.app_id}`; or "
                    "point the worker at a new lake directory"
                )
            self.state.topic_ids[topic] = topic_id

    def done(self, c: Coordinates) -> bool:
        """True when the message at `c` is already a row or a dead letter (safe from any thread)."""
        return self.state.done(c)

    # -- the steps -------------------------------------------------------------------------------

    def judge(self, messages: Sequence[SourceMessage]) -> JudgedBatch:
        """Decode, validate and verify a batch, skipping replays (runs in a lane's thread)."""
        return self.processor.judge(messages, self.done)

    def run(self, messages: Sequence[SourceMessage]) -> BatchStats:
        """Judge, accept and commit one batch in this thread (tests and benchmarks)."""
        stats = self.accept(self.judge(messages))
        return dataclasses.replace(stats, rows_written=stats.rows_written + self.flush())

    def accept(self, batch: JudgedBatch, now: float | None = None, *, caught_up: bool = False) -> BatchStats:
        """Steps 1-4 of the module docstring for one judged batch; raises SinkError if a write keeps failing."""
        start = time.perf_counter()
        now = time.monotonic() if now is None else now
        if self._revoked:
            batch = _without(batch, self._revoked)
        # A partition first seen since start or since its assignment: read its newest state,
        # since another worker of the group may have written it after our start-up load.
        touched = {(c.topic, c.partition) for c in batch.coordinates}
        fresh = touched - set(self._seen)
        settled = 0
        if fresh or any(tp not in self.recent for tp in touched):
            settled = self._settle(wait=True)  # the table is read below: no commit under way
        if fresh:
            self.state.drop(fresh)
            self.state.load(self.sink.table, fresh)
            self.recent.drop(fresh)
        for tp in touched:
            if tp not in self.recent:
                self._load_recent(tp)
        kept, duplicates = self._deduplicate(batch)
        executions = 0
        if self.executions is not None and batch.executions:
            audit = self.executions
            executions = self._retrying(
                "executions", lambda: audit.write(batch.executions, batch.execution_coordinates)
            )
        dead = [*batch.dead_letters, *duplicates]
        letters = self._retrying("dead_letters", lambda: self.dead_letters.write(dead))
        skipped = batch.skipped + len(batch.samples) - len(kept) - len(duplicates)
        for sample, source in kept:
            self._pending.add(sample.coordinates)
            decided = self.groups.add(sample, now)
            if decided is not None:
                self._decide(decided, now, source)
        decided_letters = len(self._letters)
        letters += self._write_letters()
        for c in batch.coordinates:
            tp = (c.topic, c.partition)
            if c.offset > self._seen.get(tp, -1):
                self._seen[tp] = c.offset
        rows = settled + self._maybe_commit(now, caught_up=caught_up)
        return BatchStats(
            records_in=len(batch.coordinates),
            rows_written=rows,
            dead_letters_written=letters,
            rows_skipped=skipped,
            dead_letters_skipped=len(dead) + decided_letters - letters,
            seconds=time.perf_counter() - start + batch.seconds,
            process_seconds=batch.seconds,
            executions_written=executions,
            duplicates=len(duplicates),
        )

    def tick(self, now: float | None = None, *, caught_up: bool = False, idle: bool = True) -> int:
        """Release timed-out groups and commit a due outbox; returns rows written.

        `idle` (no batch being judged) allows the wall-clock timeout (groups.py).
        """
        now = time.monotonic() if now is None else now
        for decided in self.groups.expire(now, idle=idle):
            self._decide(decided, now)
        self._write_letters()
        return self._maybe_commit(now, caught_up=caught_up)

    def flush(self) -> int:
        """Commit whatever the outbox holds (on stop); returns rows written."""
        return self._commit()

    def revoke(self, partitions: Iterable[TopicPartition]) -> None:
        """Forget revoked partitions: their pending groups (not acked, so replayed by the new owner).

        Until `assign` gives a partition back, batches of it judged before the revocation are
        dropped by `accept`: its new owner may already be writing it.
        """
        self._commit()
        gone = set(partitions)
        self._revoked |= gone
        self.groups.drop(gone)
        self._pending = {c for c in self._pending if (c.topic, c.partition) not in gone}
        self._letter_coords = [c for c in self._letter_coords if (c.topic, c.partition) not in gone]
        for tp in gone:
            self._seen.pop(tp, None)
        self.state.drop(gone)
        self.recent.drop(gone)

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Partitions (re)assigned to this worker: their batches are accepted again."""
        self._revoked -= set(partitions)

    @property
    def revoked(self) -> frozenset[TopicPartition]:
        """Partitions revoked and not assigned again."""
        return frozenset(self._revoked)

    def safe_offsets(self) -> dict[TopicPartition, int]:
        """Per partition, the offset below which every message is stored (a row or a dead letter)."""
        safe = {tp: seen + 1 for tp, seen in self._seen.items()}
        for c in (*self._pending, *(d.coordinates for d in self._letters)):
            tp = (c.topic, c.partition)
            if c.offset < safe.get(tp, c.offset + 1):
                safe[tp] = c.offset
        # The outbox and the commit under way by their lowest offsets: they hold thousands of rows,
        # and this runs after every sink step.
        committing = self._committing.lowest if self._committing is not None else {}
        for lowest in (self._outbox_lowest, committing):
            for tp, offset in lowest.items():
                if offset < safe.get(tp, offset + 1):
                    safe[tp] = offset
        return safe

    @property
    def pending_groups(self) -> int:
        """Groups waiting for samples."""
        return len(self.groups)

    # -- internals -------------------------------------------------------------------------------

    def _deduplicate(self, batch: JudgedBatch) -> tuple[list[tuple[Sample, SourceMessage]], list[DeadLetter]]:
        """Step 0: the batch's undecided samples that are not re-sent copies (with their messages),
        and the copies' letters."""
        kept: list[tuple[Sample, SourceMessage]] = []
        letters: list[DeadLetter] = []
        for sample, source in zip(batch.samples, batch.sources, strict=True):
            c = sample.coordinates
            if c in self._pending or self.state.done(c):
                continue
            tid = str(sample.record["trajectory_id"])
            first = self.recent.check((c.topic, c.partition), tid, c.offset)
            if first is None:
                kept.append((sample, source))
                continue
            letters.append(
                DeadLetter(
                    reason=f"duplicate: trajectory_id {tid!r} was accepted at offset {first} of "
                    f"{c.topic}[{c.partition}]; this copy (a re-send) is not a second row",
                    error_type=DUPLICATE,
                    raw=source.value or b"",
                    key=source.key,
                    coordinates=c,
                )
            )
        return kept, letters

    def _load_recent(self, tp: TopicPartition) -> None:
        """Read back the trajectory ids dedup counts as accepted in `tp` (rows, and samples of
        decided groups that became dead letters)."""
        self.recent.load(self.sink.table, tp, self.state.partition(tp).next, self._decided_ids)

    def _decided_ids(self, tp: TopicPartition, floor: int) -> list[tuple[int, str]]:
        found = self.dead_letters.stored_letters(tp, floor, (DUPLICATE_ATTEMPT, MIXED_ATTEMPTS))
        return [(offset, str(self.processor.codec.decode(raw)["trajectory_id"])) for offset, raw in found]

    def _write_letters(self) -> int:
        """Write the letters of decided groups (their offsets may lie below stored letters)."""
        if not self._letters:
            return 0
        letters = self._letters
        written = self._retrying("dead_letters", lambda: self.dead_letters.write_decided(letters))
        self._letter_coords.extend(d.coordinates for d in letters)
        self._letters = []
        return written

    def _decide(self, decided: DecidedGroup, now: float, source: SourceMessage | None = None) -> None:
        samples = decided.samples
        self.observer.decided(decided.status, len(samples))
        letters = refused(decided, self.state, source)
        if letters:
            self._letters.extend(letters)
            self._pending.difference_update(s.coordinates for s in samples)
            return
        members = [
            Member(
                s.verdict.reward, s.verdict.status, s.verdict.reward_components, len(s.tokens.response_tokens)
            )
            for s in samples
        ]
        outcome = decide_group(members, self.normalization, status=decided.status)
        owner = samples[0].coordinates
        domain = str(samples[0].record["domain"])
        signal = [i for i, s in enumerate(samples) if s.verdict.status not in NO_SIGNAL_STATUSES]
        owner_state = self.state.partition((owner.topic, owner.partition))
        owner_state.stats.add(domain, [outcome.rewards[i] for i in signal])
        merged = RunningStats()
        for part in self.state.partitions.values():
            found = part.stats.domains.get(domain)
            if found is not None:
                merged = merged.merged(found)
        penalized = self.normalization.overlong is not None  # else rewards and components are as judged
        for i, s in enumerate(samples):
            verdict = s.verdict
            if penalized and (
                outcome.rewards[i] != verdict.reward
                or outcome.components[i] != dict(verdict.reward_components)
            ):
                verdict = dataclasses.replace(
                    verdict, reward=outcome.rewards[i], reward_components=outcome.components[i]
                )
            has_signal = verdict.status not in NO_SIGNAL_STATUSES
            self._outbox.append(
                ScoredTrajectory(
                    record=s.record,
                    tokens=s.tokens,
                    verdict=verdict,
                    bucket=s.bucket,
                    advantage=outcome.advantages[i],
                    domain_reward=standardize(
                        outcome.rewards[i], merged, warmup=self.state.warmup, epsilon=1e-6
                    )
                    if has_signal
                    else 0.0,
                    group_status=outcome.status,
                )
            )
            self._outbox_coords.append(s.coordinates)
            tp = (s.coordinates.topic, s.coordinates.partition)
            if s.coordinates.offset < self._outbox_lowest.get(tp, s.coordinates.offset + 1):
                self._outbox_lowest[tp] = s.coordinates.offset
            self._outbox_bytes += s.nbytes
            self._pending.discard(s.coordinates)
        if self._outbox_since is None:
            self._outbox_since = now

    def _maybe_commit(self, now: float, *, caught_up: bool = False) -> int:
        """Commit a due outbox (in the committer thread with background commits); returns the
        rows stored meanwhile."""
        settled = self._settle(wait=False)
        if not self._outbox:
            return settled
        if self._committing is not None:
            if self._outbox_bytes < self.commit_bytes:
                return settled
            # A full outbox waits for the commit under way instead of growing: a commit then holds
            # about `commit_bytes`, which bounds the writer's memory, and the wait holds up the lane.
            settled += self._settle(wait=True)
        wait = self.idle_commit_s if caught_up else self.commit_interval_s
        aged = self._outbox_since is not None and now - self._outbox_since >= wait
        if not (aged or self._outbox_bytes >= self.commit_bytes):
            return settled
        if self._committer is None:
            return settled + self._commit()
        write, states, coordinates = self._prepare()
        lowest = self._outbox_lowest
        self._clear_outbox()
        future = self._committer.submit(self._then_notify, write)
        self._committing = _Commit(future, coordinates, states, lowest)
        return settled

    def _next_states(self) -> dict[TopicPartition, PartitionState]:
        """The state of every partition consumed since start, as it will be once the outbox is committed.

        Only those: a partition this worker never consumed may belong to another worker, whose
        newer state a stale copy in our commit would shadow.
        """
        lowest: dict[TopicPartition, int] = {}
        for c in self._pending:
            tp = (c.topic, c.partition)
            lowest[tp] = min(lowest.get(tp, c.offset), c.offset)
        written: dict[TopicPartition, set[int]] = {}
        for c in (*self._outbox_coords, *self._letter_coords):
            written.setdefault((c.topic, c.partition), set()).add(c.offset)
        for tp in (*self._seen, *written):
            self.state.partition(tp)
        out = {}
        for tp in {*self._seen, *written}:
            current = self.state.partitions[tp]
            undecided = min(lowest.get(tp, 2**62), self._seen.get(tp, current.next - 1) + 1)
            nxt = max(current.next, undecided)
            holes = {o for o in current.holes | written.get(tp, set()) if o >= nxt}
            out[tp] = PartitionState(nxt, holes, current.stats, current.tasks, current.tasks.checkpoint())
        return out

    def _commit(self) -> int:
        """Wait for a commit under way, then commit the outbox in this thread; returns rows stored."""
        settled = self._settle(wait=True)
        if not self._outbox:
            return settled
        write, states, coordinates = self._prepare()
        self._store(write(), states)
        self._clear_outbox()  # only now: after a failed write the outbox is still whole
        return settled + len(coordinates)

    def _prepare(
        self,
    ) -> tuple[Callable[[], int], dict[TopicPartition, PartitionState], list[Coordinates]]:
        """One commit of the outbox: the write (rows, txn versions and state as they are now), the
        partition states it stores, and the rows' coordinates.

        The state's metadata is serialized here, so groups decided while the write runs belong
        to the next commit; the rows' table is built by the write, which then lets the rows go
        (during a background write only the table holds them; a synchronous commit keeps the
        outbox until it succeeds).
        """
        outbox, coordinates, count = [self._outbox], self._outbox_coords, len(self._outbox)
        states = self._next_states()
        candidate = SinkState(
            self.state.app_id,
            self.state.decay,
            self.state.warmup,
            states,
            dict(self.state.topic_ids),
            task_window=self.state.task_window,
        )
        metadata = candidate.metadata(self.sink.profile_id)
        versions = candidate.versions()
        expected = {tp: self.state.partitions[tp].next - 1 for tp in states}
        ingested_at, profile_id, nbytes = datetime.now(UTC), self.sink.profile_id, self._outbox_bytes

        def write() -> int:
            started = time.perf_counter()
            data = trajectories_table(outbox.pop(), coordinates, ingested_at, profile_id)
            version = self._retrying(
                "trajectories", lambda: self.sink.table.commit(data, versions, metadata, expected=expected)
            )
            self.observer.committed(count, nbytes, time.perf_counter() - started)
            return version

        return write, states, coordinates

    def _then_notify(self, write: Callable[[], int]) -> int:
        """`write` (in the committer thread), then `on_written`."""
        version = write()
        self.on_written()
        return version

    def _clear_outbox(self) -> None:
        self._outbox, self._outbox_coords, self._outbox_bytes, self._outbox_since = [], [], 0, None
        self._outbox_lowest = {}
        self._letter_coords = []

    def _store(self, version: int, states: Mapping[TopicPartition, PartitionState]) -> None:
        """A commit succeeded: its partition states are the stored ones."""
        for state in states.values():
            if state.checkpoint is not None:
                state.tasks.saved(state.checkpoint)
                state.checkpoint = None
        self.state.partitions.update(states)
        self.state.last_version = version

    def _settle(self, *, wait: bool) -> int:
        """Take in the commit under way once it is done (waiting for it if `wait`); returns its rows.

        Raises what the write raised (SinkError after its retries): the worker then stops, and the
        commit stays unsettled, so its rows never count as safe.
        """
        job = self._committing
        if job is None or not (wait or job.future.done()):
            return 0
        version = job.future.result()
        self._committing = None
        self._store(version, job.states)
        return len(job.coordinates)

    def _retrying(self, what: str, write: Callable[[], int]) -> int:
        """`write`, retried with exponential backoff while it raises SinkError (`write_retries` times)."""
        retrying = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(self.write_retries + 1),
            wait=tenacity.wait_exponential(multiplier=self.retry_backoff_s, max=MAX_RETRY_WAIT_S),
            retry=tenacity.retry_if_exception_type(SinkError),
            before_sleep=functools.partial(_log_retry, what, self.write_retries + 1),
            reraise=True,
        )
        return retrying(write)


def _log_retry(what: str, attempts: int, state: tenacity.RetryCallState) -> None:
    error = state.outcome.exception() if state.outcome is not None else None
    wait = state.next_action.sleep if state.next_action is not None else 0.0
    log.warning(
        "writing %s failed (attempt %d of %d): %s; retrying in %.1fs",
        what, state.attempt_number, attempts, error, wait,
    )  # fmt: skip


def _without(batch: JudgedBatch, revoked: set[TopicPartition]) -> JudgedBatch:
    """`batch` without what came from `revoked` partitions (judged before their revocation)."""
    dropped = sum(1 for c in batch.coordinates if (c.topic, c.partition) in revoked)
    if dropped:
        log.info("dropping %d messages of revoked partitions judged before the revocation", dropped)
    return batch.only(lambda c: (c.topic, c.partition) not in revoked)
