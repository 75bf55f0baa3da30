"""The learner's version: the number of the last weights it published, so staleness means what it says.

A learner that publishes keeps its version here: on start it publishes version 0 (its initial
weights) unless the lake already holds versions, and every `every` optimizer steps it publishes
the next number (`consumers.weights.publish_version`: the Delta commit is the publication).
Rows carry the version that generated them, so `learner version - row version` counts the
published updates a row is behind, which is what the replay buffer's `max_lag` bounds.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from consumers.weights import (
    MlflowRegistration,
    PolicyWatcher,
    announce,
    load_weights,
    publish_version,
    reannounce_latest,
    register_published,
)
from schemas.policy_version import PolicyVersion

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PublishOptions:
    """Where and how often a learner publishes its weights.

    Attributes:
        lake_uri: the lake holding ``weights/`` and the ``policies`` table.
        every: optimizer steps between publications.
        storage_options: passed to deltalake for an object-store lake.
        model_name: register each version as an MLflow model version of this name (None: don't).
        kafka_config: announce each version on the compacted policies topic (None: don't).
        topic: that topic.
    """

    lake_uri: str
    every: int
    storage_options: Mapping[str, str] | None = None
    model_name: str | None = None
    kafka_config: Mapping[str, Any] | None = None
    topic: str = "rollouts.policies"

    def __post_init__(self) -> None:
        if self.every < 1:
            raise ValueError(f"publish every = {self.every}; give at least 1 step")


class VersionKeeper:
    """Publishes versions of one policy and knows the learner's current version number.

    Args:
        options: `PublishOptions`.
        on_publish: called with each new record and the policy, after the publication.
    """

    def __init__(
        self,
        options: PublishOptions,
        *,
        on_publish: Callable[[PolicyVersion, torch.nn.Module], None] | None = None,
    ) -> None:
        self.options = options
        self.on_publish = on_publish
        self.watcher = PolicyWatcher(options.lake_uri, storage_options=options.storage_options)
        self.version = -1

    def start(
        self, policy: torch.nn.Module, *, step: int, checkpoint_version: int | None, run_id: str
    ) -> None:
        """Take the version at start: the newest published one (its weights loaded when newer than
        the checkpoint's), else publish the initial weights as version 0; a checkpoint that records
        a version above the newest (cut off between checkpoint and publication) publishes its
        weights as the next version at its `step`. With `model_name`, the
        newest version is registered under this run if it is not yet (initial weights published
        before the run existed, or a registration cut off by a crash after the commit)."""
        latest = self.watcher.latest()
        if latest is None:
            self.publish(policy, step=step, run_id=run_id, table_version=None)
            return
        self.version = latest.number
        if checkpoint_version is not None and checkpoint_version > latest.number:
            # The checkpoint is written before each publication: a learner ended between the two
            # left weights the lake never received, so they are published now, at their step.
            log.info("learner publishes its checkpoint's weights (step %d), cut off before publication", step)
            self.publish(policy, step=step, run_id=run_id, table_version=None)
            return
        if checkpoint_version is None or latest.number > checkpoint_version:
            policy.load_state_dict(load_weights(latest, storage_options=self.options.storage_options))
            log.info("learner continues from published version %d (step %d)", latest.number, latest.step)
        if self.options.model_name is not None:
            register_published(
                latest,
                _registration(self.options.model_name),
                run_id=run_id,
                storage_options=self.options.storage_options,
            )
        if self.options.kafka_config is not None:
            reannounce_latest(
                self.options.lake_uri,
                dict(self.options.kafka_config),
                storage_options=self.options.storage_options,
                topic=self.options.topic,
            )

    def due(self, step: int) -> bool:
        """Whether `step` (the count of optimizer steps done) ends a publication interval."""
        return step > 0 and step % self.options.every == 0

    def publish(
        self, policy: torch.nn.Module, *, step: int, run_id: str, table_version: int | None
    ) -> PolicyVersion:
        """Publish the policy's weights as the next version; the learner's version becomes it."""
        state = {k: v.detach().to("cpu").contiguous() for k, v in policy.state_dict().items()}
        registry = None
        if self.options.model_name is not None:
            registry = _registration(self.options.model_name)
        record = publish_version(
            state,
            lake_uri=self.options.lake_uri,
            number=self.version + 1,
            step=step,
            run_id=run_id,
            table_version=table_version,
            storage_options=self.options.storage_options,
            registry=registry,
        )
        self.version = record.number
        if self.options.kafka_config is not None:
            announce(record, dict(self.options.kafka_config), topic=self.options.topic)
        if self.on_publish is not None:
            self.on_publish(record, policy)
        return record


def _registration(model_name: str) -> MlflowRegistration:
    import mlflow

    return MlflowRegistration(mlflow.get_tracking_uri(), model_name=model_name)
