"""The command line folds flag, environment, file and default, highest first, in the process it runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = {  # (section, field, flag, file value, env value, flag value)
    "stream": ("group_timeout", "--group-timeout", 11.0, 22.0, 33.0),
    "learner": ("lr", "--lr", 0.011, 0.022, 0.033),
    "sandbox": ("pool_size", "--sandbox-pool-size", 4, 5, 6),
}


def _run(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("ROLLSTREAM_") or k == "ROLLSTREAM_CACHE"}
    return subprocess.run(
        [sys.executable, "-m", "infra.cli", *args],
        cwd=cwd,
        env={**base, "PYTHONPATH": str(ROOT), **(env or {})},
        capture_output=True,
        text=True,
        timeout=300,
    )


def _effective(cwd: Path, args: list[str] = (), env: dict[str, str] | None = None) -> dict:  # type: ignore[assignment]
    done = _run(["settings", *args], cwd, env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_flag_beats_environment_beats_file_beats_default(tmp_path: Path) -> None:
    defaults = _effective(tmp_path)
    (tmp_path / "rollstream.toml").write_text(
        "".join(f"[{section}]\n{field} = {file}\n" for section, (field, _, file, _, _) in SETTINGS.items())
    )
    env = {f"ROLLSTREAM_{s.upper()}__{f.upper()}": str(e) for s, (f, _, _, e, _) in SETTINGS.items()}
    flags = [part for _, (_, flag, _, _, value) in SETTINGS.items() for part in (flag, str(value))]
    from_file = _effective(tmp_path)
    from_env = _effective(tmp_path, env=env)
    from_flag = _effective(tmp_path, flags, env=env)
    for section, (field, _, file, environment, flag) in SETTINGS.items():
        assert defaults[section][field] not in (file, environment, flag)
        assert from_file[section][field] == file
        assert from_env[section][field] == environment
        assert from_flag[section][field] == flag


@pytest.mark.parametrize(
    ("where", "message"),
    [
        ("file", r"rollstream.toml: [stream] group_timeout = -1: Input should be greater than 0"),
        ("env", r"environment variable ROLLSTREAM_LEARNER__LR = '-1': Input should be greater than 0"),
        ("flag", r"flag --sandbox-pool-size = 0: Input should be greater than or equal to 1"),
    ],
)
def test_a_wrong_value_names_where_it_came_from(tmp_path: Path, where: str, message: str) -> None:
    args: list[str] = []
    env: dict[str, str] = {}
    if where == "file":
        (tmp_path / "rollstream.toml").write_text("[stream]\ngroup_timeout = -1\n")
    elif where == "env":
        env["ROLLSTREAM_LEARNER__LR"] = "-1"
    else:
        args = ["--sandbox-pool-size", "0"]
    done = _run(["settings", *args], tmp_path, env)
    assert done.returncode == 2
    assert f"rollstream settings: error: {message}" in done.stderr, done.stderr


def test_old_variable_names_work_and_name_the_new_one(tmp_path: Path) -> None:
    done = _run(
        ["settings"], tmp_path, {"ROLLSTREAM_KAFKA_PORT": "19092", "ROLLSTREAM_SANDBOX_POOL_SIZE": "7"}
    )
    assert done.returncode == 0, done.stderr
    effective = json.loads(done.stdout)
    assert (effective["kafka"]["port"], effective["kafka"]["bootstrap_servers"]) == (19092, "127.0.0.1:19092")
    assert effective["sandbox"]["pool_size"] == 7
    assert (
        "rollstream: warning: ROLLSTREAM_KAFKA_PORT is an old name; set ROLLSTREAM_KAFKA__PORT instead"
        in done.stderr
    )
    assert "ROLLSTREAM_SANDBOX_POOL_SIZE is an old name; set ROLLSTREAM_SANDBOX__POOL_SIZE" in done.stderr
    new = _run(["settings"], tmp_path, {"ROLLSTREAM_KAFKA_PORT": "19092", "ROLLSTREAM_KAFKA__PORT": "29092"})
    assert (
        json.loads(new.stdout)["kafka"]["port"] == 29092 and "warning" not in new.stderr
    )  # the new name wins


def test_help_loads_none_of_the_heavy_libraries(tmp_path: Path) -> None:
    probe = (
        "import sys\nfrom infra.cli import main\n"
        "for args in (['--help'], ['process', '--help'], ['learn', '--help']):\n"
        "    assert main(args) == 0\n"
        "print(sorted(m for m in ('numpy', 'torch', 'pyarrow', 'deltalake', 'polars', 'mlflow') if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"
