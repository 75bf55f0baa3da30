"""An optional MLflow tracking server over the settings' tracking store, under ``<state_dir>/mlflow``.

Jobs log to ``settings.tracking_uri`` directly; the server only adds the UI and a REST endpoint,
so it is started only on request (``rollstream up --mlflow-server``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from infra.exceptions import MlflowServerError
from infra.processes import (
    ProcessStatus,
    owned_pid,
    poll_until,
    require_free_port,
    start_service,
    stderr_progress,
    stop_service,
    tail,
)
from infra.settings import Settings

MLFLOW_HOST = "127.0.0.1"
READY_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 30.0
_DATABASE_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql")
# MLflow 3 otherwise forks a job runner and six huey consumers (GenAI evaluation jobs) beside the
# web worker: seven Python processes that rollstream never uses, on a machine of two cores.
_SERVER_ENV = {"PYTHONUNBUFFERED": "1", "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


@dataclass(frozen=True)
class MlflowPaths:
    """Files of the tracking server inside a state directory."""

    root: Path
    artifacts: Path

    @classmethod
    def of(cls, settings: Settings) -> MlflowPaths:
        return cls(settings.state_dir / "mlflow", settings.state_dir / "mlartifacts")

    @property
    def pid_file(self) -> Path:
        return self.root / "mlflow.pid"

    @property
    def log_file(self) -> Path:
        return self.root / "server.log"


def mlflow_url(settings: Settings) -> str:
    """Where the tracking server answers, e.g. ``http://127.0.0.1:5000``."""
    return f"http://{MLFLOW_HOST}:{settings.mlflow_port}"


def mlflow_server_status(settings: Settings) -> ProcessStatus:
    """Whether our tracking server for ``settings`` runs, judged by its pid file and command line."""
    paths = MlflowPaths.of(settings)
    pid = owned_pid(paths.pid_file, _markers(settings))
    return ProcessStatus("mlflow server", pid is not None, pid, paths.log_file, mlflow_url(settings))


def start_mlflow_server(
    settings: Settings,
    *,
    progress: Callable[[str], None] = stderr_progress,
    timeout: float = READY_TIMEOUT_S,
) -> tuple[int, bool]:
    """Start the tracking server unless ours runs; return its pid and whether this call started it.

    Raises:
        PortInUseError: ``mlflow_port`` is held by a process that is not ours.
        MlflowServerError: the tracking URI is not a database, or the server did not answer
            ``/health`` within ``timeout`` seconds (it is then stopped; the message shows its log).
    """
    paths = MlflowPaths.of(settings)
    running = mlflow_server_status(settings)
    if running.pid is not None:
        progress(f"mlflow server already running (pid {running.pid}) at {running.url}")
        return running.pid, False
    if not settings.tracking_uri.startswith(_DATABASE_SCHEMES):
        raise MlflowServerError(
            f"tracking_uri = {settings.tracking_uri!r} is not a database store the server can serve; "
            "set it to sqlite:///<path> (the default) or drop --mlflow-server"
        )
    paths.pid_file.unlink(missing_ok=True)
    require_free_port(MLFLOW_HOST, settings.mlflow_port, flag="--mlflow-port", env="ROLLSTREAM_MLFLOW_PORT")
    paths.root.mkdir(parents=True, exist_ok=True)
    paths.artifacts.mkdir(parents=True, exist_ok=True)
    if settings.tracking_uri.startswith("sqlite:///"):
        Path(settings.tracking_uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    progress(f"starting mlflow server at {mlflow_url(settings)} over {settings.tracking_uri}")
    process = start_service(
        _command(settings, paths),
        pid_file=paths.pid_file,
        log_file=paths.log_file,
        cwd=paths.root,
        env={**os.environ, **_SERVER_ENV},
        wait_ready=lambda started: _wait_healthy(settings, started, paths, timeout),
        group=True,
    )
    progress(f"mlflow server ready (pid {process.pid}) at {mlflow_url(settings)}; log: {paths.log_file}")
    return process.pid, True


def stop_mlflow_server(settings: Settings, timeout: float = STOP_TIMEOUT_S) -> int | None:
    """Stop our tracking server and its workers (its process group); return its pid, or None."""
    pid = mlflow_server_status(settings).pid
    return stop_service(pid, MlflowPaths.of(settings).pid_file, timeout=timeout, group=True)


def _command(settings: Settings, paths: MlflowPaths) -> list[str]:
    return [
        sys.executable, "-m", "mlflow", "server",
        "--backend-store-uri", settings.tracking_uri,
        "--default-artifact-root", str(paths.artifacts),
        "--host", MLFLOW_HOST,
        "--port", str(settings.mlflow_port),
        "--workers", "1",
    ]  # fmt: skip


def _markers(settings: Settings) -> list[str]:
    return ["mlflow", "server", settings.tracking_uri, str(settings.mlflow_port)]


def _wait_healthy(
    settings: Settings, process: subprocess.Popen[bytes], paths: MlflowPaths, timeout: float
) -> None:
    url = f"{mlflow_url(settings)}/health"

    def healthy() -> bool | None:
        code = process.poll()
        if code is not None:
            raise MlflowServerError(
                f"mlflow server exited with code {code} while starting; see {paths.log_file}. "
                f"Last lines:\n{tail(paths.log_file)}"
            )
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return True
        except (urllib.error.URLError, OSError):
            pass
        return None

    if poll_until(healthy, timeout=timeout, interval=0.5):
        return
    raise MlflowServerError(
        f"mlflow server did not answer {url} within {timeout:.0f} s; it was stopped. "
        f"See {paths.log_file}. Last lines:\n{tail(paths.log_file)}"
    )
