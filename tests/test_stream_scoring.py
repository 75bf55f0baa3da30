"""Scoring in the batch processor: code executed in the sandbox, unknown domains, host failures."""

from __future__ import annotations

import pytest

from producers.fleet import SyntheticFleet
from schemas import TrajectoryCodec
from stream_processors.exceptions import TransientScoringError
from stream_processors.offsets import Coordinates
from stream_processors.processing import BatchProcessor, SourceMessage
from stream_processors.sandbox import Limits, Sandbox, SandboxHostError
from stream_processors.verifiers import DomainVerifiers, ToolUseVerifier

pytestmark = pytest.mark.timeout(300)
CODEC = TrajectoryCodec()


def messages(records):
    return [SourceMessage(Coordinates("t", 0, i), None, CODEC.encode(r)) for i, r in enumerate(records)]


@pytest.fixture(name="sandbox", scope="module")
def sandbox_fixture(tmp_path_factory):
    return Sandbox(tmp_path_factory.mktemp("work"))


def test_code_rows_carry_their_pass_rate_and_an_execution_each(sandbox):
    records = [r for r in SyntheticFleet(seed=11).trajectories(600) if r["task_type"] == "code"][:60]
    out = BatchProcessor(verifiers=DomainVerifiers(sandbox=sandbox)).process(messages(records))
    assert len(out.rows) == len(records) and not out.dead_letters
    assert len(out.executions) == len(records) == len(out.execution_coordinates)
    assert all(0 < r.execution.start_s <= r.execution.wall_s for r in out.executions)
    candidates = set()
    for row in out.rows:
        candidate = row.record["metadata"]["candidate"]
        candidates.add(candidate.split(":")[0])
        assert row.verdict.reward == float(row.record["metadata"]["synthetic_score"]), (
            candidate,
            row.verdict,
        )
        assert row.verdict.status == ("ok" if row.verdict.reward == 1.0 else "fail")
        assert row.verdict.verifier == "code_tests" and row.verdict.verifier_version == "1.0.0"
        assert set(row.verdict.reward_components) == {"passed", "failed", "errored"}
    assert {"reference", "bug"} <= candidates


def test_an_unknown_domain_is_a_dead_letter_with_its_reason(sandbox):
    record = next(iter(SyntheticFleet(seed=2).trajectories(1)))
    record["domain"] = "math/not-registered-999"
    out = BatchProcessor(verifiers=DomainVerifiers(sandbox=sandbox)).process(messages([record]))
    assert not out.rows and len(out.dead_letters) == 1
    letter = out.dead_letters[0]
    assert letter.error_type == "UnknownDomainError" and "math/not-registered-999" in letter.reason
    routed = BatchProcessor(verifiers=DomainVerifiers(sandbox=sandbox, unknown_domains="task-type"))
    assert len(routed.process(messages([record])).rows) == 1


class FlakySandbox(Sandbox):
    """Fails for the host's reasons `failures` times, then runs."""

    def __init__(self, work, failures):
        super().__init__(work)
        self.failures = failures

    def run(self, *args, **kwargs):
        if self.failures > 0:
            self.failures -= 1
            raise SandboxHostError("simulated: the OOM killer ended an execution")
        return super().run(*args, **kwargs)


def code_record():
    return next(r for r in SyntheticFleet(seed=5).trajectories(400) if r["task_type"] == "code")


def test_a_transient_host_failure_is_retried_never_a_fake_zero(tmp_path):
    processor = BatchProcessor(
        verifiers=DomainVerifiers(sandbox=FlakySandbox(tmp_path, failures=2)), retry_backoff_s=0.01
    )
    out = processor.process(messages([code_record()]))
    assert len(out.rows) == 1 and not out.dead_letters
    assert out.rows[0].verdict.status in ("ok", "fail")


def test_a_persistent_host_failure_raises_so_the_worker_stops_unacked(tmp_path):
    processor = BatchProcessor(
        verifiers=DomainVerifiers(sandbox=FlakySandbox(tmp_path, failures=100)),
        retry_backoff_s=0.01,
        transient_retries=2,
    )
    with pytest.raises(TransientScoringError, match="host's reasons"):
        processor.process(messages([code_record()]))


def test_tool_use_episode_final_state_is_checked_in_the_sandbox(sandbox):
    checks = (
        "import os\n"
        "def test_report():\n    assert open('/work/out/report.txt').read() == 'total=42\\n'\n"
        "def test_no_draft():\n    assert not os.path.exists('/work/draft.txt')\n"
    )
    good = [
        {"tool": "mkdir", "args": {"path": "out"}},
        {"tool": "write_file", "args": {"path": "draft.txt", "content": "total="}},
        {"tool": "append_file", "args": {"path": "draft.txt", "content": "42\n"}},
        {"tool": "move", "args": {"src": "draft.txt", "dst": "out/report.txt"}},
    ]
    bad = [*good[:3], {"tool": "write_file", "args": {"path": "../../etc/x", "content": "escape"}}]
    import json

    verifier = ToolUseVerifier(sandbox, limits=Limits())
    ok = verifier.verify({"trajectory_id": "a", "response_text": json.dumps(good), "unit_tests": checks})
    assert ok.status == "ok" and ok.reward == 1.0 and ok.reward_components["calls"] == 4
    fail = verifier.verify({"trajectory_id": "b", "response_text": json.dumps(bad), "unit_tests": checks})
    assert fail.status == "fail" and fail.reward == 0.0
    junk = verifier.verify({"trajectory_id": "c", "response_text": "rm -rf /", "unit_tests": checks})
    assert junk.status == "fail" and not junk.executions
