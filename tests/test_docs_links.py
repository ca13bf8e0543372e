"""The documentation is self-contained: every relative link of README.md and docs/*.md reaches
a file of the repository (and, with #anchor, one of its headings), and nothing cites a
document that a clone does not have."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def anchors(page: Path) -> set[str]:
    """GitHub's anchors of a markdown file's headings (lowercase, punctuation dropped, spaces
    to hyphens)."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    names = set()
    for heading in re.findall(r"^#+\s+(.*?)\s*$", text, flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        names.add(slug)
    return names


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_reach_a_file_and_a_heading(page):
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+://", target) or target.startswith("mailto:"):
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists() or REPO not in linked.parents:
            broken.append(f"{target} (no such file in the repository)")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target} (no such heading)")
    assert not broken, f"{page.name}: {broken}"


def test_nothing_cites_a_document_outside_the_repository():
    outside = re.compile(r"shared/docs|algorithms\.md §")
    files = [p for folder in ("runner", "recipes", "conf", "scripts", "tests", "docs")
             for p in (REPO / folder).rglob("*") if p.suffix in {".py", ".md", ".yaml"}]
    hits = [f"{p.relative_to(REPO)}:{n}" for p in [*files, REPO / "README.md"]
            if p != Path(__file__)
            for n, line in enumerate(p.read_text().splitlines(), 1) if outside.search(line)]
    assert not hits, hits
