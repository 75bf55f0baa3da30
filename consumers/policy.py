"""The TinyPolicy under its older import path; policies live in `consumers.policies`."""

from consumers.policies.tiny import DEFAULT_VOCAB_SIZE, TinyPolicy

__all__ = ["DEFAULT_VOCAB_SIZE", "TinyPolicy"]
