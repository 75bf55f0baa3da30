"""Waiting for work in a thread without abandoning it when the waiting task is cancelled."""

from __future__ import annotations

import asyncio
import logging
from typing import TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")


async def shielded(future: asyncio.Future[T]) -> tuple[T, bool]:
    """The result of `future`, awaited to the end even if this task is cancelled meanwhile.

    Returns the result and whether a cancellation arrived, so the caller can commit what was
    written and then stop: a half-awaited Delta commit would leave its offsets undecided.

    Raises:
        asyncio.CancelledError: `future` itself was cancelled.
    """
    cancelled = False
    while True:
        try:
            return await asyncio.shield(future), cancelled
        except asyncio.CancelledError:
            if future.done() and future.cancelled():
                raise
            cancelled = True
            log.info("stop requested: finishing the in-flight step first")
