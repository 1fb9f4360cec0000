"""The README and docs/ stand alone: every path and link they give is a
file of this repository (and a link's #section a heading of that page), a
section they send the reader "below" or "above" is on the same page, and
the README says what its install and test lines need."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_RELATIVE_PATH = re.compile(r"`(\.\.?/[^`\s]+)`")
_SECTION_HERE = re.compile(r'"([^"]+)"\s+(?:below|above)\b')


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped,
    spaces as dashes."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(page: Path) -> set:
    return {_anchor(line.lstrip("#")) for line in page.read_text().splitlines()
            if line.startswith("#")}


def _headings(page: Path) -> set:
    return {line.lstrip("#").strip() for line in page.read_text().splitlines()
            if line.startswith("#")}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_links_and_paths_stay_in_the_repository(page):
    text = page.read_text()
    targets = [m.group(1) for m in _LINK.finditer(text)]
    targets += [m.group(1) for m in _RELATIVE_PATH.finditer(text)]
    for target in targets:
        if re.match(r"[a-z]+:", target):            # https:, mailto:
            continue
        path, _, section = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        assert file.is_relative_to(ROOT), f"{page.name}: {target} is outside the repository"
        assert file.exists(), f"{page.name}: {target} does not exist"
        if section and file.suffix == ".md":
            assert section in _anchors(file), f"{page.name}: {target}: no such section"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_sections_below_or_above_are_on_the_same_page(page):
    text = " ".join(page.read_text().split())       # a quote may wrap
    for m in _SECTION_HERE.finditer(text):
        assert m.group(1) in _headings(page), (
            f"{page.name}: \"{m.group(1)}\" {m.group(0).split()[-1]} is not a section here")


def test_architecture_holds_the_layout_and_its_flow():
    text = (ROOT / "docs" / "architecture.md").read_text()
    for package in ("kernel/", "native/", "objfile/", "probes/", "target/", "capture/",
                    "unwind/", "symbols/", "report/", "recording/", "commands/"):
        assert f"`{package}`" in text, package
    assert "imports only the stages to its left" in text


def test_readme_install_line_names_the_system_python():
    lines = (ROOT / "README.md").read_text().splitlines()
    install = next(line for line in lines if "-m venv" in line)
    # a python3 under root's home (pyenv) makes a ustack other users cannot run
    assert "/usr/bin/python3 -m venv" in install


def test_readme_says_what_the_tests_install_and_how_long_they_take():
    text = (ROOT / "README.md").read_text()
    head = text[:text.index("## ")]                    # beside the test command
    for need in ("npm", "chromium", "podman", "bpftrace", "perf", "clang", "JDK", "min"):
        assert need in head, need
    assert len(text.splitlines()) < 400


def test_python_usdt_probes_counted_as_ustack_lists_them():
    python = Path("/usr/bin/python3.11")
    if not python.exists():
        pytest.skip("Debian's python3.11 is not installed")
    from helpers import run_ustack
    res = run_ustack("list", python, "usdt:*")
    assert res.returncode == 0, res.stderr
    probes = [line.split()[0] for line in res.stdout.splitlines()[1:] if line.strip()]
    assert "python:function__entry" in probes
    words = {"six": 6, "seven": 7, "eight": 8, "nine": 9}
    text = " ".join((ROOT / "docs" / "tracing.md").read_text().split())
    said = re.search(r"python3\.11 has `python:function__entry` and (\w+) more", text)
    assert words[said.group(1)] == len(probes) - 1
