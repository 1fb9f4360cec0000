"""A stack the unwinder could not finish carries its note in every output
format, so a cut stack never reads as complete and rooted mid-stack: the
note stands at the root side, where the frames it lost would be, in folded
lines and speedscope as in the flame graphs and pprof."""
from __future__ import annotations

import json

import pytest

from helpers import RECURSE_FLAGS, build, ok, parse_folded, run_ustack, truncation_note

pytestmark = pytest.mark.kernel

SIZE = 1024          # bytes of stack copied: far fewer than recurse's 200 frames


@pytest.fixture(scope="module")
def recurse():
    return build("recurse", flags=RECURSE_FLAGS)


def _count(recurse, *fmt):
    return ok(run_ustack("count", "--backend", "perf", "--unwind", "dwarf",
                         "--stack-size", SIZE, f"uprobe:{recurse}:leaf",
                         "-c", str(recurse), *fmt))


def test_folded_cut_stack_starts_with_its_note(recurse):
    (row,) = parse_folded(_count(recurse, "-f", "folded").stdout)
    stack, n = row
    note = f"[{truncation_note(SIZE)}]".replace(";", ":").replace(" ", "_")
    assert n == 1
    assert stack[:3] == ["recurse", note, "rec"], stack[:4]
    assert stack[-1] == "leaf" and "main" not in stack


def test_speedscope_cut_stack_starts_with_its_note(recurse, tmp_path):
    out = tmp_path / "cut.speedscope.json"
    _count(recurse, "-o", str(out))
    doc = json.loads(out.read_text())
    names = [f["name"] for f in doc["shared"]["frames"]]
    (profile,) = doc["profiles"]
    (stack,) = profile["samples"]
    assert [names[i] for i in stack[:2]] == [f"[{truncation_note(SIZE)}]", "rec"]
    assert names[stack[-1]] == "leaf"
