"""The documentation: the table reference is what the job writes, and the README is a short, self-contained
front page (the two commands first, nothing outside the repository, reference material under docs/)."""

from __future__ import annotations

import re
from pathlib import Path

from connectors.delta.docs import REFERENCE, render

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"


def test_the_table_reference_is_current():
    text = REFERENCE.read_text()
    assert render(text) == text, "docs/reference.md is stale: run `python -m connectors.delta.docs`"


def test_the_readme_is_short_and_starts_with_the_two_commands():
    lines = README.read_text().splitlines()
    assert len(lines) <= 150, len(lines)
    quick_start = lines.index("## Quick start")
    block = lines.index("```bash", quick_start)
    commands = lines[block + 1 : lines.index("```", block + 1)]
    assert [line.split("#")[0].strip() for line in commands] == ["make demo", "make test"]
    assert quick_start < 20  # on the first screen


def _links(markdown: str) -> list[str]:
    return re.findall(r"\]\(([^)\s]+)\)", markdown)


def test_the_readmes_links_stay_inside_the_repository_and_exist():
    for target in _links(README.read_text()):
        assert not re.match(r"[a-z]+://", target), target
        path = (REPO / target.split("#")[0]).resolve()
        assert path.is_relative_to(REPO) and path.exists(), target


def test_nothing_cites_a_file_outside_the_repository():
    documents = [README, *sorted((REPO / "docs").glob("*.md"))]
    modules = [
        p for d in ("core", "connectors", "streaming", "bkaudit") for p in sorted((REPO / d).rglob("*.py"))
    ]
    outside = re.compile(r"\.\./shared|bookkeeper-facts|/work/")
    cited = [str(p.relative_to(REPO)) for p in documents + modules if outside.search(p.read_text())]
    assert not cited, cited


def test_no_module_docstring_carries_a_status_line():
    modules = [
        p for d in ("core", "connectors", "streaming", "bkaudit") for p in sorted((REPO / d).rglob("*.py"))
    ]
    found = [str(p.relative_to(REPO)) for p in modules if re.search(r"^Status: ", p.read_text(), re.M)]
    assert not found, found
