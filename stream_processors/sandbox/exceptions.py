"""Errors of the sandbox: it cannot start at all, or the host (not the code) broke one execution."""

from __future__ import annotations

from stream_processors.exceptions import StreamProcessorError


class SandboxError(StreamProcessorError):
    """Root of the sandbox's errors."""


class SandboxUnavailableError(SandboxError):
    """The sandbox cannot run on this host (no bwrap, user namespaces disabled, no process limit).

    Raised at start-up by `Sandbox.check()`; code tasks never run unsandboxed instead.
    """


class SandboxHostError(SandboxError):
    """One execution failed for the host's reasons (bwrap did not start, the host ran short of
    memory, the kernel's OOM killer ended it). Transient: retry; never a verdict."""
