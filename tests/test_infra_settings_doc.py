"""docs/configuration.md is generated from the settings model and kept current."""

from __future__ import annotations

from pathlib import Path

from infra.settings_doc import render, settings_fields

PAGE = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"


def test_every_setting_is_documented():
    missing = [f"{section}.{name}" for section, name, info in settings_fields() if not info.description]
    assert missing == [], f"give these fields a description: {missing}"


def test_the_committed_page_is_current():
    assert PAGE.read_text() == render(), "run `python -m infra.settings_doc > docs/configuration.md`"
