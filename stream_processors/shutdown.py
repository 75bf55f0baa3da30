"""How the worker stops: cleanly on a signal (decided rows committed first), or by crashing unacked.

SIGTERM commits the outbox; pending groups stay pending and are rebuilt by the replay. A write
that keeps failing crashes the worker without committing offsets.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, cast

from schemas.metrics import Readiness
from stream_processors.committer import Committer
from stream_processors.lanes import Lane
from stream_processors.sink_thread import Step

log = logging.getLogger(__name__)


class Shutdown:
    """Tracks the running lanes; the last one to stop closes what they share.

    Args:
        committer: settles the last steps.
        crash: stops the worker with an error (Faust's `app.crash`).
        readiness: turned not ready as soon as a lane stops.
        close: closes what the lanes share (the dead-letter producer, the verifier pool), once.
    """

    def __init__(
        self,
        committer: Committer,
        crash: Callable[[BaseException], Awaitable[None]],
        readiness: Readiness,
        close: Callable[[], None],
    ) -> None:
        self.committer = committer
        self.crash = crash
        self.readiness = readiness
        self.close = close
        self.running = 0
        self._crashing: set[asyncio.Future[None]] = set()

    def started(self) -> None:
        """A lane joined and consumes."""
        self.running += 1

    def crash_on_failure(self, future: asyncio.Future[Any]) -> None:
        """A done callback: stop the worker as soon as a sink step fails, even if no batch follows."""
        if not future.cancelled() and future.exception() is not None:
            log.error(
                "a batch could not be written; stopping without committing", exc_info=future.exception()
            )
            self.readiness.stop()
            self._crashing.add(asyncio.ensure_future(self.crash(cast(BaseException, future.exception()))))

    async def lane_stopped(
        self, lane: Lane, in_flight: asyncio.Future[Step] | None, *, stopping: bool
    ) -> None:
        """Settle the lane's last step, commit the decided rows if the worker is stopping, leave the group."""
        self.running -= 1
        self.readiness.stop()
        try:
            if in_flight is not None:
                await self.committer.settle(in_flight)
            if stopping:
                await self.committer.step(self.committer.sink.stage.flush)
                log.info("stopping: the decided rows were committed first")
        except Exception:
            log.exception("committing the decided rows at stop failed; the replay redoes them")
        await lane.close()
        if self.running == 0:
            self.close()
            stage = self.committer.sink.stage
            log.info(
                "sink stopped: %s; %d groups pending", self.committer.progress.summary(), stage.pending_groups
            )
