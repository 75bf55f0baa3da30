"""Code: the response against its unit tests, in the sandbox; reward = the tests' pass rate."""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping
from typing import Any

from stream_processors.exceptions import VerifierInputError
from stream_processors.sandbox import Environment, Execution, Limits, Sandbox
from stream_processors.verifiers.base import Verdict, VerdictStatus, Verifier
from stream_processors.verifiers.harness import HARNESS_SOURCE, prepare_tests


def describe_limit(execution: Execution) -> str | None:
    """Why an execution was stopped by a limit, naming the limit, or None if none stopped it."""
    limits = execution.limits
    reasons = {
        "timeout": f"wall-clock limit of {limits.wall_s:g} s reached (killed)",
        "cpu_limit": f"CPU limit of {limits.cpu_s} s reached (SIGXCPU)",
        "memory_limit": f"memory limit of {limits.memory_bytes >> 20} MiB reached (MemoryError)",
        "process_limit": f"process limit of {limits.processes} reached (fork refused: a fork bomb?)",
        "file_limit": f"file size limit of {limits.file_bytes >> 20} MiB reached (SIGXFSZ)",
        "output_limit": f"output limit of {limits.output_bytes} bytes a stream reached (stopped there)",
    }
    return reasons.get(execution.outcome)


def run_harness(
    sandbox: Sandbox,
    files: Mapping[str, str],
    environment: Environment | None,
    limits: Limits,
    harness: str = HARNESS_SOURCE,
) -> tuple[dict[str, Any] | None, Execution]:
    """Run a harness over `files` in the sandbox; (its nonce-signed report or None, the execution).

    `files` holds ``tests.py``; it is prepared here (`prepare_tests`) so the harness needs no import.
    """
    tests, names = prepare_tests(files.get("tests.py", ""))
    nonce = secrets.token_hex(16)
    execution = sandbox.run(
        ["python3", "-S", "-B", "/task/harness.py"],
        files={**files, "tests.py": tests, "tests.names": "\n".join(names), "harness.py": harness},
        environment=environment,
        limits=limits,
        stdin=(nonce + "\n").encode(),
    )
    return parse_report(execution.stdout, nonce), execution


def parse_report(stdout: str, nonce: str) -> dict[str, Any] | None:
    """The harness's last line signed with `nonce`, with ``first_error`` decoded; None without one."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(nonce + " "):
            try:
                report = json.loads(line[len(nonce) + 1 :])
                report["first_error"] = bytes.fromhex(report.pop("first_error_hex", "")).decode(
                    "utf-8", errors="replace"
                )
            except (ValueError, TypeError, AttributeError):
                return None
            return report if isinstance(report, dict) else None
    return None


class SandboxedVerifier(Verifier):
    """A verifier that runs code in the sandbox, with an optional read-only environment at /env."""

    def __init__(self, sandbox: Sandbox, *, environment: Environment | None = None, limits: Limits) -> None:
        self.sandbox = sandbox
        self.environment = environment
        self.limits = limits


class CodeTestsVerifier(SandboxedVerifier):
    """Runs ``response_text`` then its ``unit_tests`` in the sandbox, one test function at a time.

    Components: passed, failed, errored (counts of test functions). Status "ok" when every test
    passed, "fail" otherwise, "timeout" when a time limit stopped it, "error" when another limit
    did (memory, processes, file size, output: named in the detail) or the harness reported nothing.
    A failure of the host raises SandboxHostError from the sandbox, never a verdict.

    Args:
        sandbox: where the code runs.
        environment: the read-only environment bound at /env (None: the bare interpreter).
        limits: the execution's limits.
    """

    name = "code_tests"
    version = "1.0.0"

    def verify(self, record: Mapping[str, Any]) -> Verdict:
        """Judge a code trajectory; raises VerifierInputError without unit_tests."""
        tests = record.get("unit_tests")
        if not tests:
            raise VerifierInputError(
                f"code trajectory {record.get('trajectory_id')!r} has unit_tests={tests!r}: "
                "code producers must send the unit tests to run"
            )
        report, execution = run_harness(
            self.sandbox,
            {"solution.py": record.get("response_text") or "", "tests.py": tests},
            self.environment,
            self.limits,
        )
        executions = (execution,)
        limit = describe_limit(execution)
        if limit is None and report is not None and report.get("memory_error"):
            limit = f"memory limit of {self.limits.memory_bytes >> 20} MiB reached (MemoryError)"
        counts = {k: float(report.get(k, 0)) for k in ("passed", "failed", "errored")} if report else {}
        if limit is not None:
            status: VerdictStatus = (
                "timeout"
                if execution.outcome in ("timeout", "cpu_limit")
                else "output_limit"
                if execution.outcome == "output_limit"
                else "error"
            )
            return self.verdict(0.0, status, limit, counts, executions)
        if report is None:
            where = (
                f"exit {execution.exit_code}" if execution.signal is None else f"signal {execution.signal}"
            )
            return self.verdict(
                0.0,
                "error",
                f"the harness reported no result ({where}): {execution.stderr[-300:]!r}",
                {},
                executions,
            )
        total = sum(counts.values())
        if total == 0:
            return self.verdict(0.0, "error", "no test ran", counts, executions)
        rate = counts["passed"] / total
        detail = (
            None
            if rate == 1.0
            else f"{counts['passed']:g}/{total:g} tests passed; {report.get('first_error', '')}"
        )
        return self.verdict(rate, "ok" if rate == 1.0 else "fail", detail, counts, executions)
