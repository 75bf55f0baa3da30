"""The Kafka broker's jars, fetched once per version with Maven into the machine's cache."""

from __future__ import annotations

import fcntl
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from infra.exceptions import JarFetchError
from infra.processes import stderr_progress
from infra.settings import Settings

POM = Path(__file__).resolve().parent / "kafka" / "pom.xml"
MARKER = ".complete"
MVN_TIMEOUT_S = 900


def jars_dir(settings: Settings) -> Path:
    """Where the jars of ``settings.kafka_version`` live: ``<cache_dir>/kafka-<version>/libs``."""
    return settings.cache_dir / f"kafka-{settings.kafka_version}" / "libs"


def maven_repository(settings: Settings) -> Path:
    """Maven's local repository for our fetches: ``<cache_dir>/m2``, so an empty cache is a cold machine."""
    return settings.cache_dir / "m2"


def ensure_jars(settings: Settings, *, progress: Callable[[str], None] = stderr_progress) -> Path:
    """Return the jars directory, fetching it with Maven when missing or incomplete.

    The marker file listing every jar is written only after a complete fetch, and concurrent
    callers serialize on a lock file, so an interrupted fetch is redone instead of half-used.

    Raises:
        JarFetchError: Maven is missing or failed; the message carries its last output lines.
    """
    libs = jars_dir(settings)
    root = libs.parent
    if _complete(libs):
        return libs
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _complete(libs):
            return libs
        _fetch(settings.kafka_version, libs, maven_repository(settings), progress)
    return libs


def _complete(libs: Path) -> bool:
    marker = libs.parent / MARKER
    try:
        names = marker.read_text().split()
    except OSError:
        return False
    return bool(names) and all((libs / name).is_file() for name in names)


def _fetch(version: str, libs: Path, repository: Path, progress: Callable[[str], None]) -> None:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise JarFetchError(
            f"Maven (mvn) is not on PATH, and the Kafka {version} jars are not cached in {libs}; "
            "install Maven (e.g. apt-get install maven) and run again"
        )
    staging = libs.parent / "libs.partial"
    shutil.rmtree(staging, ignore_errors=True)
    (libs.parent / MARKER).unlink(missing_ok=True)
    progress(f"fetching Kafka {version} jars with Maven into {libs} (once per version)")
    started = time.monotonic()
    command = [
        mvn, "-q", "-B", "-f", str(POM), f"-Dkafka.version={version}", f"-Dmaven.repo.local={repository}",
        "dependency:copy-dependencies", f"-DoutputDirectory={staging}",
    ]  # fmt: skip
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=MVN_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired as exc:
        raise JarFetchError(f"Maven did not finish within {MVN_TIMEOUT_S} s; check the network") from exc
    if result.returncode != 0:
        output = "\n".join((result.stdout + result.stderr).splitlines()[-20:])
        raise JarFetchError(
            f"Maven could not fetch Kafka {version} (exit {result.returncode}); is {version} a released "
            f"version and Maven Central reachable? Last output:\n{output}"
        )
    names = sorted(path.name for path in staging.glob("*.jar"))
    wanted = [f"kafka_2.13-{version}.jar", f"kafka-tools-{version}.jar"]
    missing = [name for name in wanted if name not in names]
    if missing or not any(name.startswith("log4j-core-") for name in names):
        raise JarFetchError(f"Maven finished but {staging} lacks {missing or 'log4j-core'}; check {POM}")
    shutil.rmtree(libs, ignore_errors=True)
    staging.rename(libs)
    (libs.parent / MARKER).write_text("\n".join(names) + "\n")
    progress(f"fetched {len(names)} jars in {time.monotonic() - started:.1f} s")
