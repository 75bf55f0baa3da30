"""The worker's start-up: the stored state checked against the brokers and loaded, once."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import Executor

import tenacity

from stream_processors.exceptions import BrokerUnavailableError
from stream_processors.preflight import (
    KafkaClient,
    OffsetStore,
    check_stored_offsets,
    topic_ids,
    topic_partitions,
)
from stream_processors.stage import Stage

log = logging.getLogger(__name__)

PREFLIGHT_RETRY_S = 120.0
"""How long start-up keeps asking brokers that do not answer (a node down, an election) before it stops."""


class Preflight:
    """Checks the stored offsets against the brokers and loads the stage's state, for whichever lane
    asks first; the others wait for the same check.

    Args:
        stage: whose tables are checked and whose state is loaded.
        bootstrap_servers, topics, kafka_client: the brokers and the source topics.
        stores: (table name, table) of every table that records source offsets.
        executor: the thread it runs in (the sink thread: the state is the sink's).
        retry_s: how long brokers that do not answer are asked again.
        on_passed: called in the event loop once the check passed.
    """

    def __init__(
        self,
        stage: Stage,
        *,
        bootstrap_servers: str,
        topics: Sequence[str],
        stores: Sequence[tuple[str, OffsetStore]],
        executor: Executor,
        kafka_client: KafkaClient = None,
        retry_s: float = PREFLIGHT_RETRY_S,
        on_passed: Callable[[], None] = lambda: None,
    ) -> None:
        self.stage = stage
        self.bootstrap_servers = bootstrap_servers
        self.topics = list(topics)
        self.stores = list(stores)
        self.executor = executor
        self.kafka_client = kafka_client
        self.retry_s = retry_s
        self.on_passed = on_passed
        self._future: asyncio.Future[None] | None = None

    @property
    def passed(self) -> bool:
        """True once the check passed and the state is loaded."""
        future = self._future
        return future is not None and future.done() and not future.cancelled() and future.exception() is None

    async def ensure(self) -> None:
        """Run the check once (in `executor`), or wait for the run under way; raises what it raised."""
        if self._future is None:
            self._future = asyncio.get_running_loop().run_in_executor(self.executor, self.run)
            self._future.add_done_callback(lambda f: self.passed and self.on_passed())
        await asyncio.shield(self._future)

    def run(self) -> None:
        """The check and the load, retried while brokers do not answer, for up to `retry_s`."""
        for attempt in tenacity.Retrying(
            stop=tenacity.stop_after_delay(self.retry_s),
            wait=tenacity.wait_exponential(multiplier=0.5, max=10),
            retry=tenacity.retry_if_exception_type(BrokerUnavailableError),
            before_sleep=_log_retry,
            reraise=True,
        ):
            with attempt:
                self.check_and_load()

    def check_and_load(self) -> None:
        """Refuse stored offsets ahead of a topic; load every partition's state and the topic ids."""
        counts = topic_partitions(self.bootstrap_servers, self.topics, kafka_client=self.kafka_client)
        check_stored_offsets(self.bootstrap_servers, self.topics, self.stores, kafka_client=self.kafka_client)
        owned = [(t, p) for t, n in counts.items() for p in range(n)]
        ids = topic_ids(self.bootstrap_servers, self.topics, kafka_client=self.kafka_client)
        self.stage.load(owned, ids)


def _log_retry(state: tenacity.RetryCallState) -> None:
    error = state.outcome.exception() if state.outcome is not None else None
    wait = state.next_action.sleep if state.next_action is not None else 0.0
    log.warning("start-up check (attempt %d): %s; retrying in %.1fs", state.attempt_number, error, wait)
