"""Untrusted code in bubblewrap: namespaces, limits, environments, a pool, and what each run did."""

from stream_processors.sandbox.environments import EMPTY, Environment, EnvironmentStore, content_id
from stream_processors.sandbox.exceptions import SandboxError, SandboxHostError, SandboxUnavailableError
from stream_processors.sandbox.limits import Limits
from stream_processors.sandbox.pool import SandboxPool
from stream_processors.sandbox.sandbox import Execution, Outcome, Sandbox

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
