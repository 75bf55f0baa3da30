"""Default settings give each stage its library defaults; set ones reach the stage's options."""

from __future__ import annotations

from pathlib import Path

from consumers import LearnerOptions
from consumers.replay import ReplayConfig
from infra.cli.stage_options import learner_options, replay_config
from infra.settings import Settings


def test_default_settings_give_the_learner_its_library_defaults(tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path)
    assert learner_options(settings) == LearnerOptions()
    assert replay_config(settings) == ReplayConfig(table_uri=settings.lake_table_uri("trajectories"))


def test_set_values_reach_the_learner(tmp_path: Path) -> None:
    settings = Settings(
        state_dir=tmp_path,
        replay={"follow": True, "token_budget": 4096},
        learner={"seed": 7, "checkpoint": tmp_path / "ckpt"},
        vocab_size=1000,
    )
    config = replay_config(settings)
    assert (config.follow, config.token_budget, config.vocab_size, config.seed) == (True, 4096, 1000, 7)
    learner = learner_options(settings)
    assert (learner.steps, learner.checkpoint_path) == (None, tmp_path / "ckpt")  # follows until stopped
