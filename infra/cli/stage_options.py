"""Each stage's library options made from the settings: what `rollstream learn` runs with.

With default settings these equal the library's own defaults (tests/test_infra_stage_options.py),
since both read them from `schemas.defaults`. The stages are imported on call, so that `--help`
loads none of their libraries.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from infra.settings import Settings

if TYPE_CHECKING:
    from consumers import LearnerOptions
    from consumers.replay import ReplayConfig


def learner_options(settings: Settings) -> LearnerOptions:
    """The learner's options from `[learner]`; without `steps`, a following run has no end."""
    from consumers import LearnerOptions

    learner = settings.learner
    steps = learner.steps
    if steps is None:
        steps = None if settings.replay.follow else LearnerOptions.steps
    return LearnerOptions(
        experiment=learner.experiment,
        steps=steps,
        policy=learner.policy,
        dim=learner.dim,
        objective=learner.objective,
        aggregation=learner.aggregation,
        lr=learner.lr,
        clip_epsilon=learner.clip_epsilon,
        kl_coef=learner.kl_coef,
        device=learner.device,
        checkpoint_path=learner.checkpoint,
        checkpoint_every=learner.checkpoint_every,
        rows_log=learner.rows_log,
    )


def replay_config(settings: Settings) -> ReplayConfig:
    """The learner's replay buffer: the trajectories table, `[replay]`, the vocabulary, the profile and seed."""
    from consumers.replay import ReplayConfig

    return ReplayConfig(
        table_uri=settings.lake_table_uri("trajectories"),
        storage_options=settings.delta_storage_options(),
        vocab_size=settings.vocab_size,
        profile_path=settings.profile_path or None,
        seed=settings.learner.seed,
        **settings.replay.model_dump(),
    )
