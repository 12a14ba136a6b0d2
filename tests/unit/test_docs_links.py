"""Every relative link of README.md and docs/*.md points to a file of the repository, and every
``#anchor`` to a heading of the page it names (as GitHub makes anchors from headings): the user
guide was split into pages, and a moved section must not leave a dead link behind."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = [
    REPO / "README.md",
    *sorted((REPO / "docs").glob("*.md")),
    REPO / "benchmarks" / "README.md",
]

_LINK = re.compile(r"\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^#{1,6} (.+)$", re.MULTILINE)
_FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = _FENCE.sub("", page.read_text())
    return {anchor(h) for h in _HEADING.findall(text)}


def links() -> list[tuple[str, str]]:
    out = []
    for page in PAGES:
        text = _FENCE.sub("", page.read_text())
        for target in _LINK.findall(text):
            if not re.match(r"[a-z]+:", target):
                out.append((str(page.relative_to(REPO)), target))
    return out


def test_the_pages_have_links() -> None:
    assert len(links()) > 30


@pytest.mark.parametrize(("page", "target"), links())
def test_a_relative_link_reaches_its_file_and_heading(page: str, target: str) -> None:
    path, _, fragment = target.partition("#")
    file = (REPO / page).parent / path if path else REPO / page
    assert file.exists(), f"{page} links to {target}: no such file"
    if fragment and file.suffix == ".md":
        assert fragment in anchors(file), f"{page} links to {target}: no such heading"


def test_the_anchor_rule() -> None:
    assert anchor("Profiling a few steps: `--profile N`") == "profiling-a-few-steps---profile-n"
    assert anchor("`ab`: base and head alternately, in one job") == (
        "ab-base-and-head-alternately-in-one-job"
    )
