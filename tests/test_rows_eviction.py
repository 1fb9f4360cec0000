"""A run whose table is too small for every object at once evicts the rows
of objects no walk met lately to load those being sampled, and loads an
evicted one again when it is sampled again: a program that works in one
library, then in another dlopen'd after, then in the first again, is
unwound whole in each, and the closing note counts the evictions, not
"did not fit" for what was loaded in the end."""
from __future__ import annotations

import re
import subprocess

import pytest

from helpers import FP, O2_NOFP, build, parse_folded, run_attached, stop
from ustack.objfile.elf import ElfImage
from ustack.objfile.vdso import vdso_file
from ustack.unwind import tables

LIBC = "/lib/x86_64-linux-gnu/libc.so.6"
LD_SO = "/lib64/ld-linux-x86-64.so.2"
CHAIN = ["_start", "__libc_start_main", "__libc_start_call_main", "main", "run_in"]
PHASE_S = 3         # each phase: more than an object's idle time (~1 s) before eviction
SLACK_ROWS = 1000   # room left beside the start's objects: less than a library's rows


def rows_of(path) -> int:
    return len(tables.for_image(ElfImage.open(str(path))))


def churn_libraries() -> tuple:
    """The driver and its two libraries (A, B), built."""
    lib_a = build("rows_lib", flags=(*FP, "-DLIB=a"), kind="shared")
    lib_b = build("rows_lib", flags=(*FP, "-DLIB=b"), kind="shared")
    return build("rows_churn", flags=O2_NOFP), lib_a, lib_b


def start_objects(prog, lib_a) -> list:
    """What the driver maps at its start: itself, libc, ld.so, A, the vDSO."""
    return [prog, LIBC, LD_SO, lib_a] + ([vdso_file()] if vdso_file() else [])


def profile_churn(prog, phases: list, rows: int) -> tuple:
    """`profile` of the driver working in each (library, its work_X) of
    `phases` in turn, PHASE_S each, with a table of at most `rows` rows:
    (the run's result, the driver's calls line)."""
    memory = f"{rows * tables.ROW.size / (1 << 20):.6f}"
    target = subprocess.Popen([str(prog), str(PHASE_S), "-",
                               *(f"{lib}:work_{name}" for lib, name in phases)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        res = run_attached(target, "profile", "-F", "199", "--backend", "bpf", "-f", "folded",
                           "--unwind-memory", memory, timeout=120)
        calls = target.stdout.read().decode()
        assert target.wait(timeout=30) == 0
    finally:
        stop(target)
    return res, calls


@pytest.fixture
def churn_run():
    prog, lib_a, lib_b = churn_libraries()
    # room for what the process maps at the start (its libraries, A), not
    # for B beside them, even with ld.so's rows (never met) evicted
    capacity = sum(map(rows_of, start_objects(prog, lib_a))) + SLACK_ROWS
    assert rows_of(lib_b) > SLACK_ROWS + rows_of(LD_SO)
    return profile_churn(prog, [(lib_a, "a"), (lib_b, "b"), (lib_a, "a")], capacity)


@pytest.mark.kernel
def test_a_library_evicted_for_another_is_loaded_again_and_every_stack_is_whole(churn_run):
    res, calls = churn_run
    assert res.returncode == 0, res.stderr
    assert re.fullmatch(r"calls [1-9]\d* [1-9]\d* [1-9]\d*\n", calls), calls
    mine = [(stack, n) for stack, n in parse_folded(res.stdout) if stack[0] == "rows_churn"]
    for lib in "ab":
        through = [(stack, n) for stack, n in mine if f"work_{lib}" in stack]
        assert through, (lib, mine)
        for stack, _n in through:
            assert stack[1:7] == [*CHAIN, f"work_{lib}"], stack
    assert "stack cut" not in res.stdout + res.stderr, res.stderr
    note = re.search(r"The in-kernel unwind table \([\d.]+ MiB\) evicted the rows of (\d+) "
                     r"idle objects? to make room, (\d+) of them loaded again as they were "
                     r"sampled; (\d+) objects? whose rows had not fit (?:was|were) loaded later",
                     res.stderr)
    assert note, res.stderr
    evicted, reloaded, recovered = map(int, note.groups())
    # A for B, then B for A (A loaded again); B and A each waited for room
    assert evicted >= 2 and reloaded >= 1 and recovered >= 2, note[0]
    # B's rows were loaded in the end: no note says they did not fit
    assert "did not fit" not in res.stderr, res.stderr
