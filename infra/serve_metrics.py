"""`rollstream serve`'s Prometheus metrics (``rollstream_serve_*``, listed in docs/operations.md)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import FastAPI, Request, Response
from fastapi.routing import APIRoute

from schemas.metrics import COUNT_BUCKETS, counter, exposition, gauge, histogram, new_registry

SUBSYSTEM = "serve"
UNMATCHED = "unmatched"
"""The endpoint label of a request to no route (kept apart so stray paths add no series)."""


class ServeMetrics:
    """Requests, generation latency, tokens, the version served and weight reloads.

    Args:
        version: reads the version being served at each scrape.
    """

    def __init__(self, version: Callable[[], int]) -> None:
        self.registry = r = new_registry()
        self.requests = counter(
            r, SUBSYSTEM, "requests", "HTTP requests answered, by endpoint and status", ["endpoint", "status"]
        )
        self.generate_seconds = histogram(
            r, SUBSYSTEM, "generate_seconds", "Time to generate one request's samples"
        )
        self.samples = histogram(
            r, SUBSYSTEM, "request_samples", "Samples per generation request", buckets=COUNT_BUCKETS
        )
        self.tokens = counter(r, SUBSYSTEM, "tokens_generated", "Tokens generated, every sample's")
        self.version = gauge(r, SUBSYSTEM, "policy_version", "The policy version being served")
        self.version.set_function(lambda: float(version()))
        self.reloads = counter(
            r,
            SUBSYSTEM,
            "weight_reloads",
            "Weight reloads, by outcome: loaded, refused (a bad update request), failed (following the lake)",
            ["outcome"],
        )

    def generated(self, seconds: float, samples: int, tokens: int) -> None:
        self.generate_seconds.observe(seconds)
        self.samples.observe(samples)
        self.tokens.inc(tokens)

    def install(self, app: FastAPI) -> None:
        """Count every request `app` answers, and serve ``GET /metrics`` on it."""

        async def count(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
            response = await call_next(request)
            route = request.scope.get("route")
            endpoint = route.path if isinstance(route, APIRoute) else UNMATCHED
            self.requests.labels(endpoint, str(response.status_code)).inc()
            return response

        async def metrics() -> Response:
            body, content_type = exposition(self.registry)
            return Response(body, media_type=content_type)

        app.middleware("http")(count)
        app.add_api_route("/metrics", metrics, methods=["GET"], include_in_schema=False)
