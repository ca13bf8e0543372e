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
    files = [p for folder in ("runner", "recipes", "conf", "scripts", "benchmarks", "tests", "docs")
             for p in (REPO / folder).rglob("*") if p.suffix in {".py", ".md", ".yaml"}]
    hits = [f"{p.relative_to(REPO)}:{n}" for p in [*files, REPO / "README.md"]
            if p != Path(__file__)
            for n, line in enumerate(p.read_text().splitlines(), 1) if outside.search(line)]
    assert not hits, hits


# A path of the repository as the docs and docstrings name it: runner/worker.py,
# benchmarks/bench_sim.py, runner/runlog/ (a folder), tests/mpi/harness.py...
NAMED_PATH = re.compile(r"(?<![\w/.-])((?:runner|recipes|benchmarks|scripts|tests|conf|docs)/"
                        r"[\w/.-]*\w(?:\.(?:py|sh|md|yaml)\b|/))")


# Files that a text creates as an example: the tutorial's new algorithm and its driver, the
# base classes' Example:: blocks, a benchmark's --markdown output.
EXAMPLE_PATHS = {"runner/algos/model_mixing.py", "conf/algo/model_mixing.yaml",
                 "runner/sim/drivers/model_mixing.py", "conf/recipe/two_blobs.yaml",
                 "conf/algo/periodic_averaging.yaml", "docs/bench.md"}


def named_paths(text: str) -> set[str]:
    return {m.rstrip(".") for m in NAMED_PATH.findall(text)}


def test_every_path_the_text_names_exists():
    """After files move (runner/ by concern, benchmarks/), no doc, docstring or comment may
    send a reader to a file that is not there. Paths with a placeholder (``<N>``, ``*``,
    ``NAME``) and the examples' new files are not repository paths."""
    files = [*PAGES, *(p for folder in ("runner", "recipes", "benchmarks", "scripts", "tests",
                                         "conf") for p in (REPO / folder).rglob("*")
                       if p.suffix in {".py", ".md", ".yaml", ".sh"}), REPO / "Makefile"]
    missing = sorted(f"{p.relative_to(REPO)}: {name}" for p in files
                     for name in named_paths(p.read_text())
                     if not (REPO / name).exists() and name not in EXAMPLE_PATHS
                     and not re.search(r"[<*{]|\bNAME\b", name))
    assert not missing, missing


def test_the_path_finder_finds_paths():
    assert named_paths("see runner/worker.py, runner/runlog/ and docs/RESULTS.md.") == {
        "runner/worker.py", "runner/runlog/", "docs/RESULTS.md"}
    assert named_paths("RUN_DIR/logs/rank0.log and my_runner/x.py") == set()
