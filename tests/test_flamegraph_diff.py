"""`ustack report --diff` of two versions of a Python program, recorded for
real: the second version's lines moved (four lines added at the top), and
its functions are still compared with themselves, not split into a red
frame of the new line beside a blue frame of the old one. --diff-lines
keeps lines apart, for two runs of one version."""
from __future__ import annotations

import glob
import json
import re

import pytest

from helpers import ok, run_ustack

pytestmark = pytest.mark.kernel

CALLS = 50
PROGRAM = f"""import os


def inner():
    os.getppid()


def outer():
    for _ in range({CALLS}):
        inner()


outer()
"""


def interpreter() -> str:
    """A pyenv CPython: its recordings name their Python frames."""
    found = sorted(glob.glob("/root/.pyenv/versions/3.12.*/bin/python3"))
    if not found:
        pytest.skip("no CPython 3.12 under /root/.pyenv/versions")
    return found[-1]


@pytest.fixture(scope="module")
def two_versions(tmp_path_factory) -> tuple:
    """Recordings A (the first version) and B (its lines 4 further down) of
    prog.py, each calling getppid CALLS times from inner()."""
    tmp = tmp_path_factory.mktemp("versions")
    python, prog = interpreter(), tmp / "prog.py"
    recordings = []
    for version, moved in (("a", ""), ("b", "# version 2\n\n\n\n")):
        prog.write_text(moved + PROGRAM)
        recording = tmp / f"{version}.rec"
        ok(run_ustack("record", "uprobe:libc:getppid", "-o", str(recording),
                      "-c", f"{python} {prog}"))
        recordings.append(str(recording))
    return tuple(recordings)


def python_nodes(page: str) -> dict:
    """{name: (samples in A, in B)} of the page's Python frames."""
    data = json.loads(re.search(r'id="flamegraph-data">(.*?)</script>', page, re.S).group(1))
    tree = data["tree"]
    strings, python = tree["strings"], tree["kinds"].index("python")
    found: dict = {}
    for _depth, name, _module, kind, after, before, _source, _inlined in tree["nodes"]:
        if kind == python:
            a, b = found.get(strings[name], (0, 0))
            found[strings[name]] = (a + before, b + after)
    return found


def diff_page(tmp_path, recordings: tuple, *options) -> str:
    page = tmp_path / "diff.html"
    res = run_ustack("report", "--diff", *recordings, "-o", str(page), *options)
    assert res.returncode == 0, res.stderr
    return page.read_text()


def test_diff_compares_python_functions_whose_lines_moved(two_versions, tmp_path):
    nodes = python_nodes(diff_page(tmp_path, two_versions))
    assert nodes == {"<module> (prog.py)": (CALLS, CALLS),
                     "outer (prog.py)": (CALLS, CALLS),
                     "inner (prog.py)": (CALLS, CALLS)}


def test_diff_lines_keeps_lines_apart(two_versions, tmp_path):
    nodes = python_nodes(diff_page(tmp_path, two_versions, "--diff-lines"))
    assert nodes["inner (prog.py:5)"] == (CALLS, 0)
    assert nodes["inner (prog.py:9)"] == (0, CALLS)
    assert nodes["outer (prog.py:10)"] == (CALLS, 0)
    assert nodes["outer (prog.py:14)"] == (0, CALLS)
