"""Tool use: a multi-step episode of file-system tool calls, replayed in the sandbox, its final
state checked there by the task's checks. The worked example of the interface.

The response is a JSON list of calls ``{"tool": name, "args": {...}}`` with the tools
`mkdir`, `write_file`, `append_file`, `move` and `delete`, all confined to the sandbox's private
/work directory. The task's ``unit_tests`` are check functions (``test_*``) over /work.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from stream_processors.exceptions import VerifierInputError
from stream_processors.verifiers.base import Verdict, VerdictStatus
from stream_processors.verifiers.code_tests import SandboxedVerifier, describe_limit, run_harness

TOOLS = ("mkdir", "write_file", "append_file", "move", "delete")
MAX_CALLS = 200

REPLAY_SOURCE = r"""
import json, os, shutil
ROOT = "/work"

def _path(p):
    full = os.path.realpath(os.path.join(ROOT, str(p)))
    if full != ROOT and not full.startswith(ROOT + "/"):
        raise ValueError(f"path {p!r} leaves the workspace")
    return full

def _call(tool, args):
    if tool == "mkdir":
        os.makedirs(_path(args["path"]), exist_ok=True)
    elif tool == "write_file":
        with open(_path(args["path"]), "w") as f:
            f.write(str(args["content"]))
    elif tool == "append_file":
        with open(_path(args["path"]), "a") as f:
            f.write(str(args["content"]))
    elif tool == "move":
        shutil.move(_path(args["src"]), _path(args["dst"]))
    elif tool == "delete":
        target = _path(args["path"])
        shutil.rmtree(target) if os.path.isdir(target) else os.remove(target)
    else:
        raise ValueError(f"unknown tool {tool!r}")

with open("/task/episode.json") as f:
    EPISODE = json.load(f)
TOOL_CALLS = TOOL_ERRORS = 0
for step in EPISODE:
    TOOL_CALLS += 1
    try:
        _call(step["tool"], step.get("args") or {})
    except Exception:
        TOOL_ERRORS += 1
"""


class ToolUseVerifier(SandboxedVerifier):
    """Replays the episode's tool calls in the sandbox, then runs the task's final-state checks.

    Reward: the fraction of checks that pass. Components: passed, failed, errored (checks),
    calls (tool calls in the episode). A response that is not a JSON list of calls is a "fail"
    with reward 0 (a policy's malformed episode), never a dead letter.
    """

    name = "tool_use"
    version = "1.0.0"

    def verify(self, record: Mapping[str, Any]) -> Verdict:
        """Judge a tool-use episode; raises VerifierInputError without checks (unit_tests)."""
        checks = record.get("unit_tests")
        if not checks:
            raise VerifierInputError(
                f"tool-use trajectory {record.get('trajectory_id')!r} has unit_tests={checks!r}: "
                "send the final-state checks as unit_tests"
            )
        try:
            episode = json.loads(record.get("response_text") or "")
        except (ValueError, RecursionError) as exc:
            return self.verdict(0.0, "fail", f"episode is not JSON: {exc}"[:200], {"calls": 0.0})
        if (
            not isinstance(episode, list)
            or len(episode) > MAX_CALLS
            or not all(isinstance(s, dict) and s.get("tool") in TOOLS for s in episode)
        ):
            return self.verdict(
                0.0, "fail", f"episode must be a list of at most {MAX_CALLS} calls of {TOOLS}", {"calls": 0.0}
            )
        report, execution = run_harness(
            self.sandbox,
            {"solution.py": REPLAY_SOURCE, "tests.py": checks, "episode.json": json.dumps(episode)},
            self.environment,
            self.limits,
        )
        counts = {k: float(report.get(k, 0)) for k in ("passed", "failed", "errored")} if report else {}
        counts["calls"] = float(len(episode))
        limit = describe_limit(execution)
        if limit is not None or report is None:
            status: VerdictStatus = "timeout" if execution.outcome in ("timeout", "cpu_limit") else "error"
            reason = limit or f"the harness reported no result: {execution.stderr[-300:]!r}"
            return self.verdict(0.0, status, reason, counts, (execution,))
        total = counts["passed"] + counts["failed"] + counts["errored"]
        rate = counts["passed"] / total if total else 0.0
        status = "ok" if total and rate == 1.0 else "fail"
        detail = (
            None
            if status == "ok"
            else f"{counts['passed']:g}/{total:g} checks passed; {report.get('first_error', '')}"
        )
        return self.verdict(rate, status, detail, counts, (execution,))
