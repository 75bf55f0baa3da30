"""docs/configuration.md is generated from the settings model and kept current."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

from infra.settings import Settings
from infra.settings_doc import attribute_docs, render

PAGE = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"


def test_every_setting_is_documented():
    docs = attribute_docs()
    missing = [f.name for f in fields(Settings) if f.init and not docs.get(f.name)]
    assert missing == [], f"document these in Settings' docstring (Attributes): {missing}"


def test_the_committed_page_is_current():
    assert PAGE.read_text() == render(), "run `python -m infra.settings_doc > docs/configuration.md`"
