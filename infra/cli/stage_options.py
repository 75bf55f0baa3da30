"""Each stage's library options made from the settings: what `rollstream process` and `learn` run with.

With default settings these equal the library's own defaults (tests/test_infra_stage_options.py),
since both read them from `schemas.defaults`. The stages are imported on call, so that `--help`
loads none of their libraries.
"""

from __future__ import annotations

from dataclasses import fields
from typing import TYPE_CHECKING, Any

from infra.settings import Settings

if TYPE_CHECKING:
    from consumers import LearnerOptions
    from consumers.replay import ReplayConfig
    from stream_processors import WorkerOptions


def worker_options(settings: Settings) -> WorkerOptions:
    """A stream worker's options: the lake, the topics, the profile, `[stream]` and `[sandbox]`."""
    from schemas.profile import load_profile
    from stream_processors import WorkerOptions
    from stream_processors.advantages import GroupNormalization, OverlongPenalty

    stream = settings.stream
    return WorkerOptions(
        bootstrap_servers=settings.bootstrap_servers,
        kafka_client=settings.kafka_client,
        lake_dir=settings.lake_uri,
        storage_options=settings.delta_storage_options(),
        raw_topic=settings.raw_topic,
        ultra_topic=settings.ultra_topic if stream.ultra else None,
        dlq_topic=settings.dlq_topic,
        app_id=stream.app_id,
        group_id=stream.group_id,
        batch_size=stream.batch_size,
        batch_within_s=stream.batch_within,
        write_retries=stream.write_retries,
        profile=load_profile(settings.profile_path or None),
        normalization=GroupNormalization(
            mode=stream.advantage,
            per_component=stream.per_component,
            band_pass=stream.band_pass,
            overlong=OverlongPenalty(*stream.overlong) if stream.overlong else None,
        ),
        group_event_timeout_s=stream.group_timeout,
        group_wall_timeout_s=stream.group_wall_timeout,
        domain_decay=stream.domain_decay,
        domain_warmup=stream.domain_warmup,
        commit_bytes=stream.commit_mb * 2**20,
        commit_interval_s=stream.commit_interval,
        idle_commit_s=stream.idle_commit,
        compact_files=stream.compact_files,
        compact_target_bytes=stream.compact_target_mb * 2**20,
        compact_every_s=stream.compact_every,
        session_timeout_s=stream.session_timeout,
        task_window=stream.task_window,
        sandbox_pool_size=settings.sandbox.pool_size,
        verifier_processes=stream.verifier_processes,
        metrics_port=stream.metrics_port,
        metrics_host=stream.metrics_host,
    )


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


def keywords(options: Any) -> dict[str, Any]:
    """A dataclass's fields as keyword arguments, e.g. `create_app(**keywords(worker_options(...)))`."""
    return {field.name: getattr(options, field.name) for field in fields(options)}
