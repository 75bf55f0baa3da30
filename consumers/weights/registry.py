"""Each published version as an MLflow model version of the learner's run, its lineage in tags."""

from __future__ import annotations

import hashlib
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from consumers.exceptions import ChecksumError, RegistrationError
from consumers.tracking import TABLE_VERSION_TAG, check_tracking_uri
from consumers.weights.store import POLICIES_TABLE, POLICY_VERSION_TAG, SHA256_TAG
from schemas.policy_version import PolicyVersion

DEFAULT_MODEL_NAME = "rollstream-policy"


@dataclass(frozen=True)
class MlflowRegistration:
    """Where a published version also becomes an MLflow model version of the learner's run.

    Attributes:
        tracking_uri: The MLflow tracking store, e.g. ``sqlite:////abs/mlflow.db``.
        model_name: The registered model that collects the versions.
    """

    tracking_uri: str
    model_name: str = DEFAULT_MODEL_NAME


def register_version(record: PolicyVersion, weights_file: Path, registry: MlflowRegistration) -> str:
    """Log `weights_file` to the record's run and make it a model version; returns the version.

    Idempotent: a model version of the same run tagged with the same number and sha256 is
    returned as it is (another run's identical weights, e.g. the same seed's version 0, get their own).

    Raises:
        RegistrationError: the record has no run id, or MLflow refused a request.
    """
    if record.run_id is None:
        raise RegistrationError(
            f"policy version {record.number} has no run_id: pass the learner's MLflow run id to "
            "publish_version, or publish without a registry"
        )
    check_tracking_uri(registry.tracking_uri)
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    client = MlflowClient(registry.tracking_uri)
    name = registry.model_name
    try:
        query = f"name = '{name}' and tag.`{POLICY_VERSION_TAG}` = '{record.number}'"
        for found in client.search_model_versions(query):
            if found.tags.get(SHA256_TAG) == record.sha256 and found.run_id == record.run_id:
                return str(found.version)
        artifact_path = f"{POLICIES_TABLE}/v{record.number}"
        client.log_artifact(record.run_id, str(weights_file), artifact_path=artifact_path)
        try:
            client.create_registered_model(name, description="Policy weights published by rollstream")
        except MlflowException as exc:
            if exc.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
        tags = {
            POLICY_VERSION_TAG: str(record.number),
            SHA256_TAG: record.sha256,
            "rollstream.step": str(record.step),
            "rollstream.weights_path": record.path,
            "rollstream.run_id": record.run_id,
        }
        if record.table_version is not None:
            tags[TABLE_VERSION_TAG] = str(record.table_version)
        created = client.create_model_version(
            name,
            source=f"runs:/{record.run_id}/{artifact_path}",
            run_id=record.run_id,
            tags=tags,
            description=f"policy version {record.number} (step {record.step})",
        )
    except MlflowException as exc:
        raise RegistrationError(
            f"policy version {record.number} is published, but registering it as a version of "
            f"MLflow model {name!r} failed: {exc}; republish the same weights with the registry to retry"
        ) from exc
    return str(created.version)


def register_published(
    record: PolicyVersion,
    registry: MlflowRegistration,
    *,
    run_id: str,
    storage_options: Mapping[str, str] | None = None,
) -> str:
    """Register a version that is already published (its file read back from the lake, sha256
    checked), as a model version of `run_id`: a version published before the learner's run
    existed (the initial weights), or one whose registration a crash cut off. Idempotent.

    Raises:
        ChecksumError: the lake's file differs from the record.
        RegistrationError: MLflow refused a request.
    """
    from consumers.weights.store import WeightsStore

    owned = record if record.run_id is not None else replace(record, run_id=run_id)
    directory, _, name = record.path.rpartition("/")
    data = WeightsStore(directory, dict(storage_options) if storage_options else None).read(name)
    if hashlib.sha256(data).hexdigest() != record.sha256:
        raise ChecksumError(
            f"policy version {record.number}: {record.path} does not match its sha256 {record.sha256}; "
            "it is not registered: republish the version"
        )
    with tempfile.TemporaryDirectory(prefix="rollstream-register-") as staging:
        local = Path(staging) / name
        local.write_bytes(data)
        return register_version(owned, local, registry)
