"""The stream worker: its named parts composed, and the flow of a lane through them.

Per lane: read batch N+1 (intake thread) while judging batch N (judge thread) while the sink
thread accepts batch N-1; after each sink step the committer commits the offsets that became
safe. Faust runs the lanes as tasks, the group timer, the progress log and compaction as timers,
and serves ``/metrics`` and ``/health`` (ready once preflight passed and every lane was assigned).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass

import faust
from faust.web import Request, Response, View

from schemas.defaults import StreamDefaults
from schemas.metrics import Readiness, exposition
from stream_processors.committer import Committer
from stream_processors.compaction import Compactor
from stream_processors.intake import Taken
from stream_processors.lanes import Lane
from stream_processors.metrics import LagCollector, WorkerMetrics
from stream_processors.processing import SourceMessage
from stream_processors.rebalance import RebalanceListener
from stream_processors.shutdown import Shutdown
from stream_processors.sink_thread import SinkThread, Step
from stream_processors.startup import Preflight

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _InFlight:
    """A lane's sink step under way (its batch N-1)."""

    future: asyncio.Future[Step] | None = None


class StreamWorker:
    """The worker's parts: lanes (each with its intake and judge thread), the sink thread, the
    committer, the rebalance listener, backpressure (in the committer), preflight, shutdown,
    metrics, readiness and the compactors of its tables. `attach` hands its tasks, timers and
    pages to a Faust app."""

    def __init__(
        self,
        *,
        lanes: Mapping[str, Lane],
        sink: SinkThread,
        committer: Committer,
        listener: RebalanceListener,
        preflight: Preflight,
        metrics: WorkerMetrics,
        readiness: Readiness,
        close: Callable[[], None],
        compactors: Sequence[Compactor] = (),
    ) -> None:
        self.lanes = dict(lanes)
        self.sink = sink
        self.stage = sink.stage
        self.committer = committer
        self.listener = listener
        self.preflight = preflight
        self.metrics = metrics
        self.readiness = readiness
        self.compactors = list(compactors)
        self.shutdown = Shutdown(committer, self.crash, readiness, close)
        self.app: faust.App | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._kicks: set[asyncio.Task[None]] = set()
        self.stage.on_written = self._written
        metrics.follow_pending(lambda: self.stage.pending_groups)
        metrics.follow_lag(LagCollector(self.log_ends, listener.stored_next))

    # -- composed with Faust ---------------------------------------------------------------------

    def attach(
        self,
        app: faust.App,
        *,
        tick_s: float,
        log_every_s: float,
        compact_every_s: float = StreamDefaults.compact_every_s,
    ) -> None:
        """Register the lanes as tasks, the group timer, the progress log, compaction and the web pages."""
        self.app = app
        app.task(_named("announce_web_server", self.announce_web_server))
        for lane in self.lanes.values():
            app.task(_named(f"lane_{lane.name}", functools.partial(self.run_lane, lane)))
        app.timer(interval=tick_s)(_named("release_timed_out", self.tick))
        app.timer(interval=log_every_s)(_named("report_progress", self.report_progress))
        if self.compactors:
            app.timer(interval=compact_every_s)(_named("compact_small_files", self.compact))
        app.page("/metrics")(_page(self.metrics_page))
        app.page("/health")(_page(self.health_page))

    @property
    def should_stop(self) -> bool:
        return self.app is None or bool(self.app.should_stop)

    async def crash(self, exc: BaseException) -> None:
        """Stop the worker with `exc` (unacked)."""
        self.readiness.stop()
        if self.app is not None:
            await self.app.crash(exc)

    # -- a lane ----------------------------------------------------------------------------------

    async def run_lane(self, lane: Lane) -> None:
        """Join, then consume batches until the worker stops; settle and leave in any case."""
        if not await self._join(lane):
            return
        flight = _InFlight()
        try:
            await self._consume(lane, flight)
        except Exception as exc:
            log.exception("%s lane failed; stopping without committing", lane.name)
            await self.crash(exc)
        finally:
            await self.shutdown.lane_stopped(lane, flight.future, stopping=self.should_stop)

    async def _join(self, lane: Lane) -> bool:
        """Preflight (once for all lanes), then subscribe; False (and a crash) if either failed."""
        try:
            self.listener.loop = self._loop = asyncio.get_running_loop()
            await self.preflight.ensure()
            await lane.subscribe()
        except Exception as exc:
            log.exception("%s lane could not start", lane.name)
            await self.crash(exc)
            return False
        self.shutdown.started()
        return True

    async def _consume(self, lane: Lane, flight: _InFlight) -> None:
        reading = lane.read()
        while not self.should_stop:
            taken = await reading
            reading = lane.read()
            messages = lane.fresh(taken)
            if not messages and len(taken.messages) < lane.batch_size:
                lane.caught_up = True
                if flight.future is not None and flight.future.done():
                    done, flight.future = flight.future, None
                    await self.committer.settle(done)
                continue
            if await self._batch(lane, taken, messages, flight):
                raise asyncio.CancelledError

    async def _batch(
        self, lane: Lane, taken: Taken, messages: list[SourceMessage], flight: _InFlight
    ) -> bool:
        """Judge one batch, settle the previous one, hand this one to the sink; True if cancelled."""
        self.committer.held.hold(messages)
        judged, cancelled = await lane.judge(self.stage.judge, messages)
        self.metrics.judged(lane.name, judged)
        previous, flight.future = flight.future, None
        if previous is not None:
            cancelled = await self.committer.settle(previous) or cancelled
        lane.caught_up = taken.caught_up(lane.batch_size)
        flight.future = self.sink.accept(lane, judged, taken)
        flight.future.add_done_callback(self.shutdown.crash_on_failure)
        return cancelled

    # -- timers and pages ------------------------------------------------------------------------

    async def tick(self) -> None:
        """Release timed-out groups and commit a due outbox."""
        if not self.preflight.passed or self.should_stop:
            return
        # Not `caught_up and ...`: a worker whose last batch was full and then got nothing more
        # must still release its last pending group.
        caught_up = all(lane.caught_up for lane in self.lanes.values())
        idle = not any(lane.judging for lane in self.lanes.values())
        try:
            await self.committer.step(functools.partial(self.stage.tick, caught_up=caught_up, idle=idle))
        except Exception as exc:
            log.exception("releasing timed-out groups failed; stopping")
            await self.crash(exc)

    @property
    def compacts(self) -> bool:
        """Whether this worker compacts the tables: the one of its group holding partition 0 of the
        first lane's topic, so that the group's workers do not all rewrite the same files."""
        first = next(iter(self.lanes.values()))
        return (first.intake.topic, 0) in first.intake.assignment()

    async def compact(self) -> None:
        """Compact the tables' small files in a thread of their own; a failure only logs."""
        for compactor in self.compactors:
            if not self.preflight.passed or self.should_stop or not self.compacts:
                return
            try:
                self.metrics.compacted(await asyncio.to_thread(compactor.run))
            except Exception:
                log.exception(
                    "compacting %s failed; its files stay as they are until the next run", compactor.uri
                )

    def _written(self) -> None:
        """In the committer thread, a commit was stored: tick at once, so rows decided meanwhile
        start their commit now rather than at the next timer tick."""
        loop = self._loop
        if loop is not None and not self.should_stop:
            loop.call_soon_threadsafe(self._kick)

    def _kick(self) -> None:
        if self.should_stop or not self.shutdown.running:
            return
        task = asyncio.ensure_future(self.tick())
        self._kicks.add(task)
        task.add_done_callback(self._kicks.discard)

    async def announce_web_server(self) -> None:
        """Log where `/metrics` and `/health` answer; a task, so Faust's logging is set up by then."""
        if self.app is not None:
            conf = self.app.conf
            log.info("metrics at http://%s:%d/metrics, health at /health", conf.web_host, conf.web_port)

    async def report_progress(self) -> None:
        log.info(
            "progress: %s; %d groups pending", self.committer.progress.summary(), self.stage.pending_groups
        )

    def log_ends(self) -> list[tuple[tuple[str, int], int]]:
        """Every lane's assigned partitions with their log-end offsets."""
        return [item for lane in self.lanes.values() for item in lane.intake.log_ends().items()]

    def metrics_page(self) -> tuple[int, bytes, str]:
        body, content_type = exposition(self.metrics.registry)
        return 200, body, content_type

    def health_page(self) -> tuple[int, bytes, str]:
        status, report = self.readiness.report()
        return status, json.dumps(report).encode(), "application/json"


def _named(name: str, fun: Callable[[], Awaitable[None]]) -> Callable[[], Awaitable[None]]:
    """`fun` as a coroutine function named `name` (Faust names tasks and timers by it)."""

    async def run() -> None:
        await fun()

    run.__name__ = run.__qualname__ = name
    return run


def _page(render: Callable[[], tuple[int, bytes, str]]) -> Callable[[View, Request], Awaitable[Response]]:
    """A Faust view answering GET with `render()`'s status, body and Content-Type."""

    async def get(view: View, request: Request) -> Response:
        status, body, content_type = render()
        return view.bytes(body, status=status, headers={"Content-Type": content_type})

    get.__name__ = render.__name__
    return get
