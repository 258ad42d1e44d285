"""The README documents exactly the tables the job writes (regenerate: python -m connectors.delta.docs)."""

from __future__ import annotations

from pathlib import Path

from connectors.delta.docs import render

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_table_reference_is_current():
    text = README.read_text()
    assert render(text) == text, "README.md is stale: run `python -m connectors.delta.docs`"
