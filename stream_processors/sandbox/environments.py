"""Environments: prepared read-only directories a task may run against, named by their content.

An environment's id is the SHA-256 of its files (relative paths, modes and bytes), so the same
name always means the same bytes, and the audit row's environment id says exactly what ran. The
store keeps each environment once under ``<root>/objects/<id>`` and a name as a pointer file
``<root>/names/<name>`` holding the id.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from stream_processors.sandbox.exceptions import SandboxError

EMPTY = "python"
"""The default environment: the interpreter and its standard library only (an empty directory)."""


def content_id(directory: Path) -> str:
    """SHA-256 over the sorted relative paths, executable bits and contents of a directory's files."""
    digest = hashlib.sha256()
    for path in sorted(p for p in directory.rglob("*") if p.is_file() or p.is_symlink()):
        rel = path.relative_to(directory).as_posix()
        digest.update(rel.encode() + b"\0")
        if path.is_symlink():
            digest.update(b"L" + os.readlink(path).encode() + b"\0")
            continue
        digest.update(b"X" if os.access(path, os.X_OK) else b"F")
        with path.open("rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
        digest.update(b"\0")
    return digest.hexdigest()


@dataclass(frozen=True, slots=True)
class Environment:
    """A named, content-addressed read-only directory bound at /env (on the sandbox's PYTHONPATH)."""

    name: str
    id: str
    path: Path


class EnvironmentStore:
    """Environments under one root directory; `python` (empty) always exists."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        (self.root / "objects").mkdir(parents=True, exist_ok=True)
        (self.root / "names").mkdir(parents=True, exist_ok=True)
        if not (self.root / "names" / EMPTY).exists():
            with tempfile.TemporaryDirectory(dir=self.root) as empty:
                self.add(EMPTY, [Path(empty)])

    def add(self, name: str, sources: list[Path]) -> Environment:
        """Copy the sources (directories merged, files at the top) into the store under `name`."""
        if not name or "/" in name or name.startswith("."):
            raise SandboxError(f"environment name {name!r} is not a plain name; use e.g. 'python-pytest'")
        staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=self.root))
        try:
            for source in sources:
                if source.is_dir():
                    shutil.copytree(
                        source, staging / source.name if sources[1:] else staging, dirs_exist_ok=True
                    )
                else:
                    shutil.copy2(source, staging / source.name)
            env_id = content_id(staging)
            target = self.root / "objects" / env_id
            if target.exists():
                shutil.rmtree(staging)
            else:
                staging.rename(target)
                for path in target.rglob("*"):  # readable by the sandbox's id, whoever that is
                    if path.is_dir():
                        path.chmod(0o755)
                    elif path.is_file() and not path.is_symlink():
                        path.chmod(path.stat().st_mode | 0o444)
        finally:
            if staging.exists():
                shutil.rmtree(staging)
        pointer = self.root / "names" / name
        tmp = pointer.with_suffix(".tmp")
        tmp.write_text(env_id)
        tmp.replace(pointer)
        return Environment(name, env_id, target)

    def get(self, name: str) -> Environment:
        """The environment called `name`; raises SandboxError naming the known ones if missing."""
        pointer = self.root / "names" / name
        if not pointer.exists():
            known = sorted(p.name for p in (self.root / "names").iterdir())
            raise SandboxError(
                f"no environment {name!r} in {self.root}; known: {known}. Build it with "
                "EnvironmentStore.add(name, sources)"
            )
        env_id = pointer.read_text().strip()
        return Environment(name, env_id, self.root / "objects" / env_id)
