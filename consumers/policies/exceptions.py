"""Errors of the policy registry."""

from __future__ import annotations

from consumers.exceptions import ConsumerError


class PolicySpecError(ConsumerError, ValueError):
    """A policy spec names no shipped policy and no importable factory, or its factory misbehaved."""
