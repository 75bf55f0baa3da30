"""Default settings give each stage its library defaults; set ones reach the stage's options."""

from __future__ import annotations

import inspect
from dataclasses import replace
from pathlib import Path

from consumers import LearnerOptions
from consumers.replay import ReplayConfig
from infra.cli.common import section_options
from infra.cli.pipeline import _metrics_port
from infra.cli.stage_options import keywords, learner_options, replay_config, worker_options
from infra.settings import Settings
from producers.rollout import RolloutOptions
from producers.tasks.queue import TaskQueue
from schemas.profile import load_profile
from stream_processors import GroupNormalization, WorkerOptions


def test_default_settings_give_the_stream_worker_its_library_defaults(tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path)
    built = worker_options(settings)
    library = WorkerOptions(bootstrap_servers=settings.bootstrap_servers, lake_dir=settings.lake_uri)
    assert (built.normalization, built.profile, dict(built.kafka_client or {})) == (
        GroupNormalization(),
        load_profile(),
        {},
    )
    assert replace(built, normalization=None, profile=None, kafka_client=None) == library


def test_default_settings_give_the_learner_its_library_defaults(tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path)
    assert learner_options(settings) == LearnerOptions()
    assert replay_config(settings) == ReplayConfig(table_uri=settings.lake_table_uri("trajectories"))


def test_set_values_reach_the_options(tmp_path: Path) -> None:
    settings = Settings(
        state_dir=tmp_path,
        stream={"metrics_port": 9300, "metrics_host": "0.0.0.0", "commit_mb": 8, "ultra": False},
        replay={"follow": True, "token_budget": 4096},
        learner={"seed": 7, "checkpoint": tmp_path / "ckpt"},
        vocab_size=1000,
    )
    options = worker_options(settings)
    assert (options.metrics_port, options.metrics_host) == (9300, "0.0.0.0")
    assert (options.commit_bytes, options.ultra_topic) == (8 * 2**20, None)
    assert keywords(options)["metrics_port"] == 9300
    assert [_metrics_port(9300, index) for index in (None, 0, 2)] == [9300, 9300, 9302]
    assert _metrics_port(None, 2) is None
    config = replay_config(settings)
    assert (config.follow, config.token_budget, config.vocab_size, config.seed) == (True, 4096, 1000, 7)
    learner = learner_options(settings)
    assert (learner.steps, learner.checkpoint_path) == (None, tmp_path / "ckpt")  # follows until stopped
    flags = {flag for _, flag, _ in section_options("stream")}
    assert {"--metrics-port", "--metrics-host"} <= flags


def test_default_settings_give_rollout_workers_and_the_task_queue_their_library_defaults(
    tmp_path: Path,
) -> None:
    rollout = Settings(state_dir=tmp_path).rollout
    options = RolloutOptions(worker_id="w")
    queue = inspect.signature(TaskQueue).parameters
    assert (rollout.concurrency, rollout.on_weight_change) == (options.concurrency, options.on_weight_change)
    assert (rollout.task_max_attempts, rollout.task_low_every) == (
        queue["max_attempts"].default,
        queue["low_every"].default,
    )
