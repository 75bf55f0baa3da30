"""An S3-compatible object store on loopback for the lake: MinIO, under ``<state_dir>/minio``.

``rollstream up --object-store`` builds MinIO once per machine (``go install`` of a pinned module
version into ``<cache_dir>/minio``), starts ``minio server`` with credentials generated for this
state directory, and creates the lake's bucket. The endpoint and credentials are kept in
``<state_dir>/minio/endpoint.json`` (mode 0600); `storage_options` turns them into deltalake's
options, with ``aws_conditional_put=etag`` so that concurrent commits are safe (MinIO's
conditional PUT is atomic; s3proxy's is not: HAZARDS.md).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from infra.exceptions import ObjectStoreError, missing_tool
from infra.processes import (
    ProcessStatus,
    owned_pid,
    poll_until,
    start_service,
    stderr_progress,
    stop_service,
    tail,
)
from infra.settings import Settings

MINIO_MODULE = "github.com/minio/minio@v0.0.0-20260212201848-7aac2a2c5b7c"
MINIO_HOST = "127.0.0.1"
BUCKET = "rollstream"
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
BUILD_TIMEOUT_S = 1800.0


@dataclass(frozen=True)
class ObjectStorePaths:
    """Files of the object store inside a state directory."""

    root: Path

    @classmethod
    def of(cls, settings: Settings) -> ObjectStorePaths:
        return cls(settings.state_dir / "minio")

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def pid_file(self) -> Path:
        return self.root / "minio.pid"

    @property
    def log_file(self) -> Path:
        return self.root / "server.log"

    @property
    def endpoint_file(self) -> Path:
        return self.root / "endpoint.json"


@dataclass(frozen=True)
class ObjectStore:
    """Where a running object store answers and how to sign in.

    Attributes:
        port: MinIO's S3 port on 127.0.0.1.
        access_key, secret_key: the root credentials generated for this state directory.
        bucket: the bucket holding the lake.
    """

    port: int
    access_key: str
    secret_key: str
    bucket: str = BUCKET

    @property
    def endpoint(self) -> str:
        """The S3 endpoint URL, e.g. ``http://127.0.0.1:39500``."""
        return f"http://{MINIO_HOST}:{self.port}"

    @property
    def lake_uri(self) -> str:
        """The lake's URI in the bucket: ``s3://<bucket>/lake``."""
        return f"s3://{self.bucket}/lake"

    @property
    def storage_options(self) -> dict[str, str]:
        """deltalake (object_store) options for this store, safe for concurrent writers."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ALLOW_HTTP": "true",
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": "us-east-1",
            "aws_conditional_put": "etag",
        }


def lake_settings_hint(store: ObjectStore) -> str:
    """The settings that point jobs at the lake on `store` (environment form)."""
    return (
        f"ROLLSTREAM_LAKE_URI={store.lake_uri} "
        f"ROLLSTREAM_STORAGE_OPTIONS='{json.dumps(store.storage_options, separators=(',', ':'))}'"
    )


def minio_binary(settings: Settings) -> Path:
    """Where the machine's MinIO build lives: ``<cache_dir>/minio/bin/minio``."""
    return settings.cache_dir / "minio" / "bin" / "minio"


def ensure_minio(
    settings: Settings, *, progress: Callable[[str], None] = stderr_progress, build: bool = True
) -> Path:
    """The MinIO binary, built with ``go install`` into the cache the first time (minutes).

    With ``build=False`` a missing binary raises at once instead (the tests: the install step
    builds it, never a test inside its time limit).

    Raises:
        ObjectStoreError: the binary is missing and `build` is off, Go is not installed, or the
            build failed (the message shows its output).
    """
    binary = minio_binary(settings)
    if binary.is_file():
        return binary
    if not build:
        raise ObjectStoreError(missing_tool(f"MinIO ({binary})", "minio"))
    go = shutil.which("go")
    if go is None:
        raise ObjectStoreError(
            f"MinIO is not built yet and Go is not installed: install Go (https://go.dev/dl/, 1.24 or "
            f"newer) and run `rollstream up --object-store` again, or put a minio binary at {binary}"
        )
    gopath = binary.parent.parent
    progress(f"building MinIO ({MINIO_MODULE}) into {gopath}; this takes a few minutes, once per machine")
    env = {
        **os.environ,
        "GOPATH": str(gopath),
        "GOBIN": str(binary.parent),
        "GOCACHE": str(gopath / "build-cache"),
        "GOMODCACHE": str(gopath / "pkg" / "mod"),
        "CGO_ENABLED": "0",
    }
    try:
        done = subprocess.run(
            [go, "install", "-modcacherw", MINIO_MODULE],
            env=env,
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired as exc:
        raise ObjectStoreError(
            f"`go install {MINIO_MODULE}` did not finish in {BUILD_TIMEOUT_S:.0f} s"
        ) from exc
    if done.returncode != 0 or not binary.is_file():
        raise ObjectStoreError(
            f"`go install {MINIO_MODULE}` failed (exit {done.returncode}); check Go's network access to "
            f"the module proxy. Output:\n{(done.stdout + done.stderr)[-3000:]}"
        )
    return binary


def read_object_store(settings: Settings) -> ObjectStore | None:
    """The object store recorded for this state directory (running or not), or None."""
    try:
        return ObjectStore(**json.loads(ObjectStorePaths.of(settings).endpoint_file.read_text()))
    except (OSError, ValueError, TypeError):
        return None


def object_store_status(settings: Settings) -> ProcessStatus:
    """Whether our MinIO for this state directory runs, judged by its pid file and command line."""
    paths = ObjectStorePaths.of(settings)
    store = read_object_store(settings)
    pid = owned_pid(paths.pid_file, ["server", str(paths.data)])
    url = store.endpoint if store is not None else ""
    return ProcessStatus("object store", pid is not None, pid, paths.log_file, url)


def start_object_store(
    settings: Settings,
    *,
    progress: Callable[[str], None] = stderr_progress,
    timeout: float = READY_TIMEOUT_S,
    build: bool = True,
) -> ObjectStore:
    """Start MinIO unless ours runs, create the lake's bucket, and return how to reach it.

    `build` is passed to `ensure_minio`: off, a missing binary is an error naming the install step.

    Raises:
        ObjectStoreError: MinIO could not be built, did not answer within `timeout` seconds (it
            is then stopped; the message shows its log), or the bucket could not be created.
    """
    paths = ObjectStorePaths.of(settings)
    running = object_store_status(settings)
    store = read_object_store(settings)
    if running.pid is not None and store is not None:
        progress(f"object store already running (pid {running.pid}) at {store.endpoint}")
        return store
    binary = ensure_minio(settings, progress=progress, build=build)
    paths.pid_file.unlink(missing_ok=True)
    paths.data.mkdir(parents=True, exist_ok=True)
    if store is None:
        store = ObjectStore(_free_port(), "rollstream-" + secrets.token_hex(4), secrets.token_urlsafe(24))
    elif not _port_free(store.port):
        store = ObjectStore(_free_port(), store.access_key, store.secret_key, store.bucket)
    paths.endpoint_file.touch(mode=0o600)
    paths.endpoint_file.write_text(json.dumps(asdict(store)))
    env = {**os.environ, "MINIO_ROOT_USER": store.access_key, "MINIO_ROOT_PASSWORD": store.secret_key}
    env["MINIO_BROWSER"] = "off"
    progress(f"starting object store (MinIO) at {store.endpoint}")
    process = start_service(
        [str(binary), "server", str(paths.data), "--address", f"{MINIO_HOST}:{store.port}", "--quiet"],
        pid_file=paths.pid_file,
        log_file=paths.log_file,
        cwd=paths.root,
        env=env,
        wait_ready=lambda started: _wait_ready(store, started, paths, timeout),
    )
    _create_bucket(store)
    progress(f"object store ready (pid {process.pid}); lake at {store.lake_uri}")
    return store


def stop_object_store(settings: Settings, timeout: float = STOP_TIMEOUT_S) -> int | None:
    """Stop our MinIO (its data stays); return its pid, or None when it was not running."""
    pid = object_store_status(settings).pid
    return stop_service(pid, ObjectStorePaths.of(settings).pid_file, timeout=timeout)


def _create_bucket(store: ObjectStore) -> None:
    from pyarrow.fs import FileType, S3FileSystem

    fs = S3FileSystem(
        access_key=store.access_key,
        secret_key=store.secret_key,
        endpoint_override=store.endpoint,
        scheme="http",
        region="us-east-1",
        allow_bucket_creation=True,
    )
    try:
        if fs.get_file_info(store.bucket).type != FileType.Directory:
            fs.create_dir(store.bucket)
    except OSError as exc:
        raise ObjectStoreError(f"creating bucket {store.bucket!r} at {store.endpoint} failed: {exc}") from exc


def _port_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind((MINIO_HOST, port))
        except OSError:
            return False
        return True


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind((MINIO_HOST, 0))
        return int(probe.getsockname()[1])


def _wait_ready(
    store: ObjectStore, process: subprocess.Popen[bytes], paths: ObjectStorePaths, timeout: float
) -> None:
    url = f"{store.endpoint}/minio/health/live"

    def live() -> bool | None:
        code = process.poll()
        if code is not None:
            raise ObjectStoreError(
                f"minio exited with code {code} while starting; see {paths.log_file}. "
                f"Last lines:\n{tail(paths.log_file)}"
            )
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                return True if response.status == 200 else None
        except (urllib.error.URLError, OSError):
            return None

    if poll_until(live, timeout=timeout, interval=0.25):
        return
    raise ObjectStoreError(
        f"minio did not answer {url} within {timeout:.0f} s; it was stopped. See {paths.log_file}. "
        f"Last lines:\n{tail(paths.log_file)}"
    )
