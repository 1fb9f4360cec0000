"""The in-kernel unwind table is made in chunks as the run needs them, up
to its bound (--unwind-memory): a library dlopen'd during the run that
finds no room in the chunks made at the start gets a new chunk, and its
stacks are unwound whole; where the bound is reached first, idle objects
are evicted as before, after the table grew to it. The closing note
says how the table grew."""
from __future__ import annotations

import re

import pytest

from helpers import parse_folded
from test_rows_eviction import (CHAIN, SLACK_ROWS, churn_libraries, profile_churn, rows_of,
                                start_objects)
from ustack.capture.row_chunks import chunk_shift
GREW = re.compile(r"[Tt]he in-kernel unwind table grew from ([\d.]+) to ([\d.]+) MiB of rows "
                  r"during the run \(at most ([\d.]+) MiB\), for objects loaded meanwhile")


def _churn(bound_of, phases: str):
    """A rows_churn run under profile with --unwind-memory of
    `bound_of(start rows, library B's rows)` rows: (result, its calls
    line, the bound); `phases`: "aba"-like, the libraries in turn."""
    prog, lib_a, lib_b = churn_libraries()
    libs = {"a": lib_a, "b": lib_b}
    start_rows, b_rows = sum(map(rows_of, start_objects(prog, lib_a))), rows_of(lib_b)
    bound = bound_of(start_rows, b_rows)
    chunk = 1 << chunk_shift(bound)
    # the chunks the start needs leave less than B's rows free: B needs more
    assert b_rows > chunk, (b_rows, chunk)
    # and they are fewer than the bound allows: the table can grow
    assert -(-start_rows // chunk) * chunk < bound, (start_rows, chunk, bound)
    res, calls = profile_churn(prog, [(libs[p], p) for p in phases], bound)
    return res, calls, bound


def _whole_in_each(res, libs: str) -> None:
    mine = [(stack, n) for stack, n in parse_folded(res.stdout) if stack[0] == "rows_churn"]
    for lib in libs:
        through = [(stack, n) for stack, n in mine if f"work_{lib}" in stack]
        assert through, (lib, mine)
        for stack, _n in through:
            assert stack[1:7] == [*CHAIN, f"work_{lib}"], stack
    assert "stack cut" not in res.stdout + res.stderr, res.stderr


@pytest.mark.kernel
def test_a_library_loaded_later_grows_the_table_and_its_stacks_are_whole():
    res, calls, bound = _churn(lambda start, b: start + b + SLACK_ROWS, "ab")
    assert res.returncode == 0, res.stderr
    assert re.fullmatch(r"calls [1-9]\d* [1-9]\d*\n", calls), calls
    _whole_in_each(res, "ab")
    grew = GREW.search(res.stderr)
    assert grew, res.stderr
    before, after, most = map(float, grew.groups())
    assert before < after <= most, grew[0]
    # B's rows went into the new room at once: none evicted, none waited
    # for room (their stacks meanwhile from copies), none left out
    assert "evicted" not in res.stderr, res.stderr
    assert "had not fit" not in res.stderr, res.stderr
    assert "did not fit" not in res.stderr, res.stderr


@pytest.mark.kernel
def test_at_its_bound_the_table_evicts_idle_objects_as_before():
    # room for half of B beside the start's objects: growing to the
    # bound is not enough, A (idle) goes for B, then B for A
    res, calls, bound = _churn(lambda start, b: start + b // 2, "aba")
    assert res.returncode == 0, res.stderr
    assert re.fullmatch(r"calls [1-9]\d* [1-9]\d* [1-9]\d*\n", calls), calls
    _whole_in_each(res, "ab")
    grew = GREW.search(res.stderr)
    assert grew, res.stderr
    assert grew[2] == grew[3], grew[0]          # grown to the bound
    note = re.search(r"[Tt]he in-kernel unwind table \([\d.]+ MiB\) evicted the rows of (\d+) "
                     r"idle objects? to make room, (\d+) of them loaded again", res.stderr)
    assert note, res.stderr
    evicted, reloaded = map(int, note.groups())
    assert evicted >= 2 and reloaded >= 1, note[0]
    assert "did not fit" not in res.stderr, res.stderr
