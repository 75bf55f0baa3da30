"""Where the running processes serve their Prometheus metrics, and a few figures read from each.

A process that serves ``/metrics`` (the stream worker on Faust's web server, `rollstream learn`
and `rollstream rollout` given ``--metrics-port``, `rollstream serve`) registers it once its server
is up: one JSON file, ``<state_dir>/metrics/<role>-<pid>.json``, holding its url, role, pid and
the time it registered, removed when the process exits cleanly. `rollstream status` lists them
(`endpoints`), removes the files of processes that are gone (a killed process leaves its file),
and scrapes each (`scrape`) for the few figures of its role (`FIGURES`). The processes register
at the edge (infra/cli), so no stage writes to the state directory.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

if TYPE_CHECKING:
    import faust

DIRECTORY = "metrics"
"""The registrations' folder under the state directory."""
SCRAPE_TIMEOUT_S = 2.0
"""How long `rollstream status` waits for one process's ``/metrics``."""
CLOCK_SLACK_S = 1.0
"""A process created this long after a registration's time is not the one that wrote it."""


@dataclass(frozen=True, slots=True)
class Figure:
    """One figure `rollstream status` shows of a role: a metric's series summed, or split by a label.

    Attributes:
        name: its key in ``rollstream status --json``.
        label: its words in the text view.
        metric: the sample name, e.g. ``rollstream_stream_rows_total``.
        by: a label to split the sum by (one value per label value); None sums every series.
    """

    name: str
    label: str
    metric: str
    by: str | None = None


FIGURES: dict[str, tuple[Figure, ...]] = {
    "stream": (
        Figure("lag_messages", "lag", "rollstream_stream_lag_messages"),
        Figure("rows", "rows", "rollstream_stream_rows_total"),
        Figure("dead_letters", "dead letters", "rollstream_stream_dead_letters_total"),
        Figure("groups_pending", "pending groups", "rollstream_stream_groups_pending"),
    ),
    "learner": (
        Figure("steps", "steps", "rollstream_learner_steps_total"),
        Figure("buffer_rows", "buffer rows", "rollstream_learner_buffer_rows"),
        Figure("max_staleness_versions", "staleness limit", "rollstream_learner_max_staleness_versions"),
        Figure("version", "version", "rollstream_learner_version"),
    ),
    "rollout": (
        Figure("tasks_in_flight", "in flight", "rollstream_rollout_tasks_in_flight"),
        Figure("tasks", "tasks", "rollstream_rollout_tasks_total", by="outcome"),
    ),
    "serve": (
        Figure("policy_version", "policy version", "rollstream_serve_policy_version"),
        Figure("requests", "requests", "rollstream_serve_requests_total"),
    ),
}
"""The figures of each role; the roles are the metric subsystems (``rollstream_<role>_*``)."""

Value = float | dict[str, float] | None
"""A figure: a sum, a sum per label value, or None when the process does not export the metric."""


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One registered process serving metrics.

    Attributes:
        role: one of `FIGURES`' keys.
        pid: its process id.
        url: its ``/metrics`` URL.
        started: when it registered (seconds since the epoch).
        path: the registration file.
    """

    role: str
    pid: int
    url: str
    started: float
    path: Path

    def as_dict(self) -> dict[str, Any]:
        return {"role": self.role, "pid": self.pid, "url": self.url, "started": self.started}


@dataclass(frozen=True, slots=True)
class Scraped:
    """What one scrape of an endpoint found: its figures, or why there are none."""

    endpoint: Endpoint
    figures: dict[str, Value] = field(default_factory=dict)
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready view, one entry of ``rollstream status --json``'s ``metrics``."""
        return {**self.endpoint.as_dict(), "figures": self.figures, "error": self.error}

    def figures_text(self) -> str:
        """The role's figures as words and values (or the error)."""
        if self.error is not None:
            return self.error
        shown = [f"{f.label} {_shown(self.figures.get(f.name))}" for f in FIGURES.get(self.endpoint.role, ())]
        return ", ".join(shown)

    def describe(self) -> str:
        """One line: role, pid, url and figures (or the error)."""
        e = self.endpoint
        return f"{e.role} (pid {e.pid}) at {e.url}: {self.figures_text()}"


def registration_path(state_dir: Path, role: str, pid: int | None = None) -> Path:
    """The registration file of process `pid` (default: this one) in `role`."""
    return state_dir / DIRECTORY / f"{role}-{os.getpid() if pid is None else pid}.json"


def register(state_dir: Path, role: str, url: str) -> Path:
    """Register this process's ``/metrics`` at `url`; returns the file (`unregister` removes it).

    Raises:
        ValueError: `role` is none of `FIGURES`' keys.
    """
    if role not in FIGURES:
        raise ValueError(f"unknown metrics role {role!r}; give one of {', '.join(FIGURES)}")
    path = registration_path(state_dir, role)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")  # status reads only whole files
    body = {"role": role, "pid": os.getpid(), "url": url, "started": time.time()}
    partial.write_text(json.dumps(body) + "\n")
    os.replace(partial, path)
    return path


def unregister(path: Path) -> None:
    """Remove a registration (none there is fine: a clean exit may remove it twice)."""
    path.unlink(missing_ok=True)


@contextlib.contextmanager
def registered(state_dir: Path, role: str, url: str) -> Iterator[Path]:
    """This process registered at `url` while the block runs."""
    path = register(state_dir, role, url)
    try:
        yield path
    finally:
        unregister(path)


def url_for(host: str, port: int) -> str:
    """The ``/metrics`` URL of a server bound to `host`:`port`; a wildcard address is read on loopback."""
    if host in ("", "0.0.0.0"):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/metrics"


def register_when_serving(app: faust.App, state_dir: Path, role: str = "stream") -> None:
    """Register a Faust app's web server once the app has started (Faust starts its web server
    first), and remove the registration when the app stops."""
    from mode import Service

    url = url_for(app.conf.web_bind, app.conf.web_port)
    path = registration_path(state_dir, role)

    class Registration(Service):
        async def on_started(self) -> None:
            register(state_dir, role, url)

        async def on_stop(self) -> None:
            unregister(path)

    app.service(Registration)


def endpoints(state_dir: Path) -> list[Endpoint]:
    """The registered endpoints of running processes, by role and pid.

    The file of a process that is gone (or whose pid another process took since) is removed; a file
    that is not a registration is left alone.
    """
    found = []
    for path in (state_dir / DIRECTORY).glob("*.json"):
        endpoint = _read(path)
        if endpoint is None:
            continue
        if not _alive(endpoint):
            unregister(path)
            continue
        found.append(endpoint)
    return sorted(found, key=lambda e: (e.role, e.pid))


def scrape(endpoint: Endpoint, timeout_s: float = SCRAPE_TIMEOUT_S) -> Scraped:
    """GET the endpoint's ``/metrics`` and read its role's figures; an error says why there are none."""
    import httpx

    try:
        # trust_env=False: a proxy from the environment must not sit between us and a local process
        response = httpx.get(endpoint.url, timeout=timeout_s, trust_env=False)
        response.raise_for_status()
    except httpx.HTTPError as exc:
        return Scraped(endpoint, error=f"no metrics from {endpoint.url}: {type(exc).__name__}: {exc}")
    try:
        return Scraped(endpoint, key_figures(endpoint.role, response.text))
    except ValueError as exc:
        return Scraped(endpoint, error=f"{endpoint.url} answered no Prometheus text: {exc}")


def scrape_all(state_dir: Path, timeout_s: float = SCRAPE_TIMEOUT_S) -> list[Scraped]:
    """Every registered endpoint of `state_dir`, scraped."""
    return [scrape(endpoint, timeout_s) for endpoint in endpoints(state_dir)]


def key_figures(role: str, text: str) -> dict[str, Value]:
    """The figures of `role` (`FIGURES`) in a scrape's text.

    A metric the text declares without a series (a counter never incremented) reads 0; one it does
    not declare reads None.

    Raises:
        ValueError: `text` is not Prometheus text format.
    """
    from prometheus_client.parser import text_string_to_metric_families

    declared: set[str] = set()
    series: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        declared.add(family.name)
        if family.type == "counter":
            declared.add(f"{family.name}_total")
        for sample in family.samples:
            series.setdefault(sample.name, []).append((sample.labels, sample.value))
    figures: dict[str, Value] = {}
    for figure in FIGURES.get(role, ()):
        found = series.get(figure.metric, [])
        if figure.metric not in declared and not found:
            figures[figure.name] = None
        elif figure.by is None:
            figures[figure.name] = sum(value for _, value in found)
        else:
            split: dict[str, float] = {}
            for labels, value in found:
                key = labels.get(figure.by, "")
                split[key] = split.get(key, 0.0) + value
            figures[figure.name] = dict(sorted(split.items()))
    return figures


def _read(path: Path) -> Endpoint | None:
    try:
        body = json.loads(path.read_text())
        return Endpoint(str(body["role"]), int(body["pid"]), str(body["url"]), float(body["started"]), path)
    except (OSError, ValueError, TypeError, KeyError):
        return None


def _alive(endpoint: Endpoint) -> bool:
    """Whether the registering process still runs (not a zombie, not a later process with its pid)."""
    try:
        process = psutil.Process(endpoint.pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return False
        return process.create_time() <= endpoint.started + CLOCK_SLACK_S
    except psutil.Error:
        return False


def _shown(value: Value) -> str:
    if value is None:
        return "-"
    if isinstance(value, dict):
        return "(" + (", ".join(f"{k} {v:g}" for k, v in value.items()) or "none") + ")"
    return f"{value:g}"
