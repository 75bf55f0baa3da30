"""docs/configuration.md is generated from the settings model and kept current."""

from __future__ import annotations

from pathlib import Path

from infra.settings import Settings
from infra.settings_doc import attribute_docs, render

PAGE = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"


def test_every_setting_is_documented():
    docs = attribute_docs()
    missing = [name for name in Settings.model_fields if not docs.get(name)]
    assert missing == [], f"document these in Settings' docstring (Attributes): {missing}"


def test_the_committed_page_is_current():
    assert PAGE.read_text() == render(), "run `python -m infra.settings_doc > docs/configuration.md`"
