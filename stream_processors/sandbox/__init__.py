"""Untrusted code in bubblewrap: namespaces, limits, environments, a pool, and what each run did.

Names are imported on first use (PEP 562), so a process that needs one module does not load the
others. The launcher process (launcher_process.py) imports none of them: it runs as a script.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from schemas.lazy import lazy_exports

_WHERE = {
    "EMPTY": "stream_processors.sandbox.environments",
    "Environment": "stream_processors.sandbox.environments",
    "EnvironmentStore": "stream_processors.sandbox.environments",
    "content_id": "stream_processors.sandbox.environments",
    "SandboxError": "stream_processors.sandbox.exceptions",
    "SandboxHostError": "stream_processors.sandbox.exceptions",
    "SandboxUnavailableError": "stream_processors.sandbox.exceptions",
    "Limits": "stream_processors.sandbox.limits",
    "SandboxPool": "stream_processors.sandbox.pool",
    "Execution": "stream_processors.sandbox.sandbox",
    "Outcome": "stream_processors.sandbox.sandbox",
    "Sandbox": "stream_processors.sandbox.sandbox",
}

__all__ = [
    "EMPTY",
    "Environment",
    "EnvironmentStore",
    "Execution",
    "Limits",
    "Outcome",
    "Sandbox",
    "SandboxError",
    "SandboxHostError",
    "SandboxPool",
    "SandboxUnavailableError",
    "content_id",
]


__getattr__, __dir__ = lazy_exports(__name__, _WHERE)


if TYPE_CHECKING:
    from stream_processors.sandbox.environments import EMPTY, Environment, EnvironmentStore, content_id
    from stream_processors.sandbox.exceptions import SandboxError, SandboxHostError, SandboxUnavailableError
    from stream_processors.sandbox.limits import Limits
    from stream_processors.sandbox.pool import SandboxPool
    from stream_processors.sandbox.sandbox import Execution, Outcome, Sandbox
