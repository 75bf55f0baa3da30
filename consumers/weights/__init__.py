"""Policy weights published by version: safetensors in the lake, a row in the ``policies`` table.

The Delta commit of the row is the publication (`publish_version`); readers poll the table
(`PolicyWatcher`, `latest_version`) or listen to the compacted topic (`listen`), and check the
sha256 before loading (`load_weights`). A version may also become an MLflow model version.
"""

from consumers.weights.publish import publish_version
from consumers.weights.registry import (
    DEFAULT_MODEL_NAME,
    MlflowRegistration,
    register_published,
    register_version,
)
from consumers.weights.store import (
    POLICIES_TABLE,
    TXN_APP_ID,
    WEIGHTS_DIR,
    PolicyWatcher,
    latest_version,
    load_weights,
)
from consumers.weights.topic import DEFAULT_KEY, PolicyListener, announce, listen, reannounce_latest

__all__ = [
    "DEFAULT_KEY",
    "DEFAULT_MODEL_NAME",
    "POLICIES_TABLE",
    "TXN_APP_ID",
    "WEIGHTS_DIR",
    "MlflowRegistration",
    "PolicyListener",
    "PolicyWatcher",
    "announce",
    "latest_version",
    "listen",
    "load_weights",
    "publish_version",
    "reannounce_latest",
    "register_published",
    "register_version",
]
