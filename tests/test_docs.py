"""The documentation: README.md and docs/*.md link only to files and headings that exist, mkdocs.yml's nav lists
every page, and the site builds with warnings as errors (as .ci/run builds it)."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.glob("*.md"))
LINKED_FILES = [ROOT / "README.md", *PAGES]

_FENCE = re.compile(r"^ {0,3}(```|~~~)")
_CODE_SPAN = re.compile(r"(`+).*?\1")
_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def _prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks, with inline code spans removed."""
    lines, in_fence = [], False
    for line in text.splitlines():
        if _FENCE.match(line):
            in_fence = not in_fence
            continue
        if not in_fence:
            lines.append(_CODE_SPAN.sub("", line))
    return lines


def _slug(heading: str) -> str:
    """A heading's anchor as MkDocs (Python-Markdown's toc) makes it; for these headings GitHub's is the same."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading: its text
    text = text.replace("`", "").replace("*", "")  # code and emphasis marks (underscores are word characters)
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def _anchors(path: Path) -> set[str]:
    found: set[str] = set()
    for line in _prose_lines(path.read_text(encoding="utf-8")):
        match = _HEADING.match(line)
        if match:
            slug = base = _slug(match.group(2))
            n = 0
            while slug in found:  # a repeated heading gets _1, _2, ... (MkDocs)
                n += 1
                slug = f"{base}_{n}"
            found.add(slug)
    return found


def _relative_links(path: Path) -> list[str]:
    links = []
    for line in _prose_lines(path.read_text(encoding="utf-8")):
        for target in _LINK.findall(line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # https:, mailto:, ...
                continue
            links.append(target)
    return links


@pytest.mark.parametrize("path", LINKED_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_point_to_existing_files_and_headings(path: Path) -> None:
    broken = []
    for link in _relative_links(path):
        target, _, anchor = link.partition("#")
        file = (path.parent / target).resolve() if target else path
        if not file.exists():
            broken.append(f"{link}: no file {file.relative_to(ROOT) if file.is_relative_to(ROOT) else file}")
        elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
            broken.append(f"{link}: no heading #{anchor} in {file.relative_to(ROOT)}")
    assert not broken, f"{path.relative_to(ROOT)}: " + "; ".join(broken)


def test_readme_links_into_every_docs_page() -> None:
    linked = {(ROOT / link.partition("#")[0]).resolve() for link in _relative_links(ROOT / "README.md")}
    missing = [p.name for p in PAGES if p.resolve() not in linked and p.name not in ("index.md", "changelog.md")]
    assert not missing, f"README.md links to no docs page {missing}"


class _AnyTagLoader(yaml.SafeLoader):
    """mkdocs.yml may use MkDocs' own tags (!relative, !ENV); their values do not matter here."""


_AnyTagLoader.add_multi_constructor("!", lambda loader, suffix, node: None)


def _nav_pages(nav: object) -> list[str]:
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, list):
        return [page for item in nav for page in _nav_pages(item)]
    if isinstance(nav, dict):
        return [page for value in nav.values() for page in _nav_pages(value)]
    return []


def test_mkdocs_nav_lists_every_page() -> None:
    config = yaml.load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"), Loader=_AnyTagLoader)
    assert config.get("docs_dir", "docs") == "docs"
    listed = _nav_pages(config["nav"])
    pages = [p.relative_to(DOCS).as_posix() for p in PAGES]
    assert sorted(set(listed)) == sorted(pages), f"nav lists {sorted(listed)}, docs/ holds {pages}"
    assert len(listed) == len(set(listed)), f"a page is listed twice: {listed}"


@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None, reason="mkdocs is not installed (the docs extra)")
@pytest.mark.skipif(importlib.util.find_spec("material") is None, reason="mkdocs-material is not installed (the docs extra)")
def test_mkdocs_builds_strict(tmp_path: Path) -> None:
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    run = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(ROOT / "mkdocs.yml"),
         "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert (tmp_path / "site" / "index.html").is_file()
