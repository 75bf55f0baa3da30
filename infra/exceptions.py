"""Errors of the service stack; every one names what went wrong and what to do next."""

from schemas.exceptions import RollstreamError


def missing_tool(tool: str, step: str) -> str:
    """One line saying which tool is missing and which install step provides it."""
    return f"{tool} is not installed: `bash infra/run.sh install` provides it (install step {step!r})"


class InfraError(RollstreamError):
    """Root of the errors raised while starting, stopping or provisioning local services."""


class SettingsError(InfraError):
    """A setting is unknown or has a bad value (config file, environment or override)."""


class PortInUseError(InfraError):
    """A port a service needs is held by a process that is not ours."""


class JarFetchError(InfraError):
    """The Kafka jars could not be fetched with Maven."""


class BrokerError(InfraError):
    """The Kafka broker could not be formatted, started, reached or stopped."""


class TopicProvisionError(InfraError):
    """A declared topic could not be brought in line with its declaration."""


class MlflowServerError(InfraError):
    """The MLflow tracking server could not be started or stopped."""


class ObjectStoreError(InfraError):
    """The object store (MinIO) could not be built, started, reached or stopped."""


class DemoError(InfraError):
    """The end-to-end demo could not account for every published message."""


class InstallError(InfraError):
    """A tool the demo or the tests need is missing, or its install step failed."""


class SettingsWarning(UserWarning):
    """A setting is given under its flat name (`FLAT_NAMES`); the message names the section's form."""
