"""`publish_version`: weights become a policy version in one Delta commit.

A version is published by the commit of its row, appended with the application transaction
``(TXN_APP_ID, number)``. The weights file is complete under its final name before that commit,
so a reader that sees the row finds the whole file, and a crash before it leaves an unreferenced
file and no version. Numbers only increase, and one number names one sha256: republishing the
same bytes returns the stored record, other bytes are refused.
"""

from __future__ import annotations

import hashlib
import tempfile
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path

import torch
from deltalake import DeltaTable
from safetensors.torch import save_file

from consumers.exceptions import RegistrationError, VersionConflictError, WeightsError
from consumers.weights.registry import MlflowRegistration, register_version
from consumers.weights.store import (
    CHUNK_BYTES,
    TXN_APP_ID,
    WEIGHTS_DIR,
    PoliciesTable,
    WeightsStore,
    normalize_lake,
)
from schemas.policy_version import PolicyVersion


def publish_version(
    policy_state: Mapping[str, torch.Tensor],
    *,
    lake_uri: str,
    number: int,
    step: int,
    run_id: str | None = None,
    table_version: int | None = None,
    storage_options: Mapping[str, str] | None = None,
    registry: MlflowRegistration | None = None,
    commit_retries: int = 5,
) -> PolicyVersion:
    """Publish `policy_state` as version `number`; returns its record (the stored one on a republish).

    Steps: 1. serialize and hash the tensors in a local staging file; 2. read what the table holds
    for `number`; 3. put the file under its final name (a temporary name, then a move); 4. commit
    the row with the application transaction, retried on a concurrent commit from step 2;
    5. with `registry`, log the file to the run and register a model version.

    Raises:
        VersionConflictError: `number` is published with another sha256, or is not above the latest.
        RegistrationError: the version is published, but MLflow refused it (republish to retry).
        WeightsError: the tensors cannot be serialized, or the store or the table failed.
        PolicyVersionError: `number` or `step` is negative.
    """
    if registry is not None and run_id is None:
        raise RegistrationError(
            f"policy version {number}: registering it in MLflow needs the learner's run_id; pass "
            "run_id, or publish without a registry"
        )
    lake = normalize_lake(lake_uri)
    options = dict(storage_options) if storage_options else None
    table = PoliciesTable(lake, options)
    with tempfile.TemporaryDirectory(prefix="rollstream-weights-") as staging:
        local, sha256, size = _serialize(policy_state, Path(staging), number)
        relative = f"{WEIGHTS_DIR}/v{number}/{local.name}"
        record = PolicyVersion(
            number=number,
            step=step,
            path=f"{lake}/{relative}",
            sha256=sha256,
            size_bytes=size,
            run_id=run_id,
            table_version=table_version,
            created_at=datetime.now(UTC),
        )
        objects: WeightsStore | None = None
        for _ in range(commit_retries + 1):
            handle = table.open()
            try:
                stored = _published(table, handle, record)
            except VersionConflictError:
                if objects is not None:
                    objects.delete(relative)  # lost to a concurrent publisher of other weights
                raise
            if stored is not None:
                record = stored
                break
            if objects is None:
                objects = WeightsStore(lake, options)
                objects.put(local, relative)
            if table.append(handle, record):
                break
        else:
            raise WeightsError(
                f"{table.uri}: publishing version {number} kept conflicting with concurrent commits "
                f"{commit_retries + 1} times; check that one learner publishes, or raise commit_retries"
            )
        if registry is not None:
            register_version(record, local, registry)
    return record


def _published(table: PoliciesTable, handle: DeltaTable, record: PolicyVersion) -> PolicyVersion | None:
    """The stored record of `record.number` when it holds the same bytes; None when the number is free."""
    latest = handle.transaction_version(TXN_APP_ID)
    if latest is None or record.number > latest:
        return None
    stored = table.read(handle, record.number)
    if stored is None:
        raise VersionConflictError(
            f"policy version {record.number} is not above the latest published version {latest} of "
            f"{table.uri}; numbers only increase: publish {latest + 1} or later"
        )
    if stored.sha256 != record.sha256:
        raise VersionConflictError(
            f"policy version {record.number} is already published in {table.uri} with sha256 "
            f"{stored.sha256}, and these weights hash to {record.sha256}; a number names one set of "
            f"weights: publish them as version {latest + 1}"
        )
    return stored


def _serialize(state: Mapping[str, torch.Tensor], staging: Path, number: int) -> tuple[Path, str, int]:
    """The state as a local safetensors file named by its hash prefix, with its sha256 and size."""
    if not state:
        raise WeightsError(f"policy version {number}: the state dict is empty; pass policy.state_dict()")
    tensors: dict[str, torch.Tensor] = {}
    storages: set[int] = set()
    for name, value in state.items():
        if not isinstance(value, torch.Tensor):
            raise WeightsError(
                f"policy version {number}: state entry {name!r} is a {type(value).__name__}, not a "
                "tensor; publish the tensors only (policy.state_dict())"
            )
        tensor = value.detach().cpu().contiguous()
        pointer = tensor.untyped_storage().data_ptr()
        if pointer and pointer in storages:
            tensor = tensor.clone()  # safetensors refuses tensors that share memory (tied weights)
        storages.add(pointer)
        tensors[name] = tensor
    staged = staging / "weights.safetensors"
    try:
        # One metadata key: safetensors 0.8 writes several in hash-map order, so the bytes (and the
        # sha256 that makes a republish a no-op) would differ from call to call.
        save_file(tensors, str(staged), metadata={"format": "pt"})
    except (ValueError, TypeError, RuntimeError, OSError) as exc:
        raise WeightsError(
            f"policy version {number}: the tensors do not serialize as safetensors: {exc}"
        ) from exc
    digest = hashlib.sha256()
    with staged.open("rb") as file:
        while chunk := file.read(CHUNK_BYTES):
            digest.update(chunk)
    sha256 = digest.hexdigest()
    final = staged.rename(staging / f"{sha256[:16]}.safetensors")
    return final, sha256, final.stat().st_size
