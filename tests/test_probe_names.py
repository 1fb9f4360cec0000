"""Every function ustack can name in a stack can be probed by that name:
IFUNCs resolve to the implementation this machine runs, a
symbol's default version wins over old compat versions, and functions named
only in a separate debug file (libc6-dbg) are found there."""
from __future__ import annotations

import subprocess

import pytest

from helpers import build, run_ustack

pytestmark = pytest.mark.kernel
N = 25


@pytest.fixture(scope="module")
def prog():
    return build("libc_calls", flags=("-O1", "-g"))


def counted(res) -> list:
    """(innermost frames, count) of each stack of `ustack count`'s text."""
    assert res.returncode == 0, res.stderr
    stacks, frames = [], []
    for line in res.stdout.splitlines():
        if line.startswith("    "):
            stacks.append((frames, int(line)))
            frames = []
        elif line.startswith("  "):
            frames.append(line.split()[0])
    return stacks


def from_main(stacks) -> list:
    return [(frames[0], n) for frames, n in stacks if "main" in frames]


def test_an_ifunc_is_probed_at_the_implementation_this_machine_runs(prog):
    res = run_ustack("count", "uprobe:libc:strlen", "-c", f"{prog} {N}",
                     stdout=subprocess.PIPE)
    stacks = from_main(counted(res))
    assert len(stacks) == 1, res.stdout
    impl, n = stacks[0]
    assert n == N
    assert impl.startswith("__strlen_"), impl
    assert f":{impl} in " in res.stderr          # the header names it


def test_the_default_version_wins_over_the_compat_one(prog):
    res = run_ustack("count", "uprobe:libc:memcpy", "-c", f"{prog} {N}",
                     stdout=subprocess.PIPE)
    stacks = from_main(counted(res))
    assert len(stacks) == 1 and stacks[0][1] == N, res.stdout + res.stderr
    assert stacks[0][0].startswith(("__memcpy_", "__memmove_")), stacks


def test_a_function_named_only_in_the_debug_file(prog):
    res = run_ustack("count", "uprobe:libc:new_do_write", "-c", f"{prog} {N}",
                     stdout=subprocess.PIPE)
    stacks = counted(res)
    mains = [n for frames, n in stacks if frames[0] == "new_do_write" and "main" in frames]
    assert sum(mains) == N, res.stdout + res.stderr


def test_list_shows_ifunc_symbols():
    res = run_ustack("list", "libc", "strlen")
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[1].split()[-1] == "strlen", res.stdout
