"""Published weights: a safetensors state dict, loaded only when its sha256 matches its record."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path

import torch

from producers.backends.exceptions import WeightsError

CHUNK_BYTES = 1 << 20


def file_sha256(path: str | Path) -> str:
    """The hex sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        while chunk := stream.read(CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def load_weights(path: str | Path, sha256: str) -> dict[str, torch.Tensor]:
    """The state dict in a safetensors file, after checking the file's sha256 against `sha256`."""
    from safetensors import SafetensorError
    from safetensors.torch import load

    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise WeightsError(f"cannot read weights file {path}: {exc}; check the path in its record") from exc
    actual = hashlib.sha256(data).hexdigest()
    if actual != sha256.strip().lower():
        raise WeightsError(
            f"weights file {path} has sha256 {actual}, its record says {sha256}: the file was "
            "changed or only partly written; reload from the version's record once it is complete"
        )
    try:
        return load(data)
    except SafetensorError as exc:
        raise WeightsError(f"weights file {path} is not a safetensors file: {exc}") from exc


def check_compatible(
    new: Mapping[str, torch.Tensor], current: Mapping[str, torch.Tensor], *, source: str
) -> None:
    """Refuse a state dict whose keys or shapes differ from the model's."""
    missing = sorted(set(current) - set(new))
    unexpected = sorted(set(new) - set(current))
    if missing or unexpected:
        raise WeightsError(
            f"weights from {source} do not fit the model: missing {missing[:5]}, unexpected "
            f"{unexpected[:5]}; serve the policy these weights were trained for"
        )
    for key, tensor in new.items():
        if tensor.shape != current[key].shape:
            raise WeightsError(
                f"weights from {source}: {key} has shape {tuple(tensor.shape)}, the model's is "
                f"{tuple(current[key].shape)}; check --vocab-size and the policy's size"
            )
