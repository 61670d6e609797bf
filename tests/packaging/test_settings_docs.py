"""The settings tables of the docs are generated from the declarations and kept current."""

from __future__ import annotations

from pathlib import Path

import pytest

from steplens.schema.settings import sync_markdown

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "producer" / "README.md", ROOT / "docs" / "settings.md"]


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_settings_tables_are_current(path: Path) -> None:
    assert "<!-- settings: " in path.read_text()
    assert not sync_markdown(path, check=True), (
        f"{path} is out of date: python -m steplens.schema.settings {path.relative_to(ROOT)}"
    )
