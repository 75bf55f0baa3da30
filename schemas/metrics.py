"""Prometheus metrics every long-running process shares: registries, exposition, readiness, a server.

Metric names are a contract with the operator's dashboards and alerts (docs/operations.md), so
the helpers live beside the other contracts, where every stage may import them. A process with a
web server of its own (the stream worker on Faust's) serves `exposition` and `Readiness.report`
from it; one without (the learner, rollout workers, `rollstream serve`) calls `serve_metrics`.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

log = logging.getLogger(__name__)

NAMESPACE = "rollstream"
"""The prefix of every metric name: ``rollstream_<stage>_<what>_<unit>``."""
LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
"""Seconds, from a millisecond verdict to a five-minute sandbox run or a commit retried for long."""
COUNT_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536)
"""Items per operation (rows per commit, samples per insert)."""
BYTES_BUCKETS = tuple(float(2**n) for n in range(10, 31, 2))
"""1 KiB to 1 GiB, by factors of 4."""


def new_registry() -> CollectorRegistry:
    """A registry of one process part's metrics (never the global one: two workers built in one
    test process would collide)."""
    return CollectorRegistry(auto_describe=True)


def counter(
    registry: CollectorRegistry, subsystem: str, name: str, doc: str, labels: Sequence[str] = ()
) -> Counter:
    """``rollstream_<subsystem>_<name>_total`` on `registry`."""
    return Counter(name, doc, labels, namespace=NAMESPACE, subsystem=subsystem, registry=registry)


def gauge(
    registry: CollectorRegistry, subsystem: str, name: str, doc: str, labels: Sequence[str] = ()
) -> Gauge:
    """``rollstream_<subsystem>_<name>`` on `registry`."""
    return Gauge(name, doc, labels, namespace=NAMESPACE, subsystem=subsystem, registry=registry)


def histogram(
    registry: CollectorRegistry,
    subsystem: str,
    name: str,
    doc: str,
    labels: Sequence[str] = (),
    *,
    buckets: Sequence[float] = LATENCY_BUCKETS,
) -> Histogram:
    """``rollstream_<subsystem>_<name>`` (``_bucket``, ``_sum``, ``_count``) on `registry`."""
    return Histogram(
        name, doc, labels, namespace=NAMESPACE, subsystem=subsystem, registry=registry, buckets=buckets
    )


def exposition(registry: CollectorRegistry) -> tuple[bytes, str]:
    """The body and Content-Type of a scrape of `registry` (Prometheus text format 0.0.4)."""
    return generate_latest(registry), CONTENT_TYPE_LATEST


class Readiness:
    """Named conditions a process needs before it does its work; ready once every one holds.

    Args:
        conditions: the names, each false until `mark` sets it.
    """

    def __init__(self, conditions: Iterable[str]) -> None:
        self._conditions = dict.fromkeys(conditions, False)
        self._lock = threading.Lock()
        self._stopping = False

    def mark(self, condition: str, held: bool = True) -> None:
        """Set `condition` (a name given at construction)."""
        with self._lock:
            if condition not in self._conditions:
                raise KeyError(
                    f"unknown readiness condition {condition!r}; known: {sorted(self._conditions)}"
                )
            self._conditions[condition] = held

    def stop(self) -> None:
        """Not ready any more, whatever holds: the process is stopping."""
        with self._lock:
            self._stopping = True

    @property
    def ready(self) -> bool:
        """True while every condition holds and the process is not stopping."""
        with self._lock:
            return not self._stopping and all(self._conditions.values())

    def report(self) -> tuple[int, dict[str, object]]:
        """The HTTP status (200 ready, 503 not) and JSON body of a ``/health`` request."""
        with self._lock:
            ready = not self._stopping and all(self._conditions.values())
            body: dict[str, object] = {
                "status": "ready" if ready else ("stopping" if self._stopping else "starting"),
                **self._conditions,
            }
        return (200 if ready else 503), body


class MetricsServer:
    """``/metrics`` and ``/health`` over HTTP in a daemon thread, for a process without a web server.

    Args:
        registry: what ``/metrics`` serves.
        readiness: what ``/health`` reports; None reports ready while the process runs.
        host, port: where to listen; port 0 lets the system choose (read it back from `port`).
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        readiness: Readiness | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.registry = registry
        self.readiness = readiness if readiness is not None else Readiness(())
        self._server = ThreadingHTTPServer((host, port), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="rollstream-metrics", daemon=True
        )

    @property
    def port(self) -> int:
        """The port it listens on."""
        return int(self._server.server_address[1])

    def start(self) -> MetricsServer:
        """Serve in the background (once; again is a no-op); returns self."""
        if self._thread.is_alive():
            return self
        self._thread.start()
        log.info("metrics at http://%s:%d/metrics, health at /health", *self._server.server_address[:2])
        return self

    def close(self) -> None:
        """Stop serving and release the port."""
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> MetricsServer:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.close()


def serve_metrics(
    registry: CollectorRegistry, readiness: Readiness | None = None, *, host: str = "127.0.0.1", port: int = 0
) -> MetricsServer:
    """Start a `MetricsServer` (close it when the process stops)."""
    return MetricsServer(registry, readiness, host=host, port=port).start()


def _handler(server: MetricsServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?")[0] == "/metrics":
                body, content_type = exposition(server.registry)
                self._send(200, body, content_type)
            elif self.path.split("?")[0] == "/health":
                status, report = server.readiness.report()
                self._send(status, json.dumps(report).encode(), "application/json")
            else:
                self._send(404, b"not found: try /metrics or /health\n", "text/plain")

        def _send(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            """Scrapes are not logged."""

    return Handler
