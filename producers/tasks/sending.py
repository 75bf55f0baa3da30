"""The queue's own producer: task copies, dead letters and outcome events, each waited for."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from confluent_kafka import KafkaError, Message, Producer

from producers.exceptions import PublishError, ids_preview

MESSAGE_MAX_BYTES = 9 * 1024 * 1024
"""Room for the largest task dead letter (the task dead-letter topic admits 8 MiB)."""

Headers = Sequence[tuple[str, bytes]]


def task_producer_config(
    bootstrap_servers: str, extra_config: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Idempotent, acks=all, and one record per batch.

    A share group acquires whole record batches: a batch of 50 tasks is leased to one poll even
    with ``max.poll.records=1`` (measured, docs/rollout.md). One task per batch lets a worker take
    exactly the tasks it starts.
    """
    return {
        "bootstrap.servers": bootstrap_servers,
        "client.id": "rollstream-tasks",
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 0,
        "batch.num.messages": 1,
        "compression.type": "zstd",
        "message.max.bytes": MESSAGE_MAX_BYTES,
        "message.timeout.ms": 60_000,
        "partitioner": "murmur2_random",
        **(extra_config or {}),
    }


class TaskSender:
    """Sends messages and waits until the broker acknowledged every one, or says which failed.

    Args:
        bootstrap_servers: the Kafka brokers.
        extra_config: librdkafka options applied last (security settings, say).
    """

    def __init__(self, bootstrap_servers: str, *, extra_config: Mapping[str, Any] | None = None) -> None:
        self._producer = Producer(task_producer_config(bootstrap_servers, extra_config))
        self._failures: list[tuple[str, str]] = []

    def queue(self, topic: str, value: bytes, *, key: str, headers: Headers = ()) -> None:
        """Queue one message; `flush` waits for it."""

        def report(error: KafkaError | None, _message: Message) -> None:
            if error is not None:
                self._failures.append((key, error.str()))

        while True:
            try:
                self._producer.produce(topic, value, key.encode(), headers=list(headers), on_delivery=report)
                break
            except BufferError:
                self._producer.poll(0.1)
        self._producer.poll(0)

    def flush(self, topic: str, timeout: float = 60.0) -> None:
        """Wait for every queued message.

        Raises:
            PublishError: some were not acknowledged (named by key); they are not in Kafka.
        """
        left = self._producer.flush(timeout)
        failures, self._failures = self._failures, []
        if left:
            self._producer.purge()
            self._producer.flush(1.0)
            failures += [("?", f"not acknowledged within {timeout:.0f} s")] * left
        if failures:
            keys = [key for key, _ in failures]
            raise PublishError(
                f"{len(failures)} message(s) to {topic} were not acknowledged ({ids_preview(keys)}): "
                f"{failures[0][1]}; is the broker up and the topic declared (`rollstream up`)?",
                topic=topic,
                failed=len(failures),
                first_reason=failures[0][1],
                message_ids=keys,
            )

    def send(
        self, topic: str, value: bytes, *, key: str, headers: Headers = (), timeout: float = 60.0
    ) -> None:
        """Queue one message and wait for it."""
        self.queue(topic, value, key=key, headers=headers)
        self.flush(topic, timeout)

    def close(self, timeout: float = 30.0) -> None:
        """Wait for what is queued, then drop what is left."""
        if self._producer.flush(timeout):
            self._producer.purge()
            self._producer.flush(1.0)
