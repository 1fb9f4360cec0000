"""The rows an interval's stacks travel as to ClickHouse, made by the
agent (no server needed): a stack's id is what names its frames, the
same for the copies another process of the program gets, and the same
after the agent's memory of stacks starts afresh past its bound."""
from __future__ import annotations

import json

import pytest

from ustack.model import Frame, Stack, StackCount
from ustack.report.sinks.clickhouse_schema import StackRows
from ustack.report.sinks.clickhouse_sink import ProcessFacts, SentStacks, interval_batch


def _frames(base: int) -> tuple:
    """One process's frames of a program mapped at `base`: main calls
    work, which calls leaf, or helper (an unnamed function)."""
    return tuple(Frame(addr=base + off, module="prog", function=name, offset=4)
                 for off, name in ((0x30, "leaf"), (0x20, "work"), (0x10, "main"))) + (
        Frame(addr=base + 0x40, module="prog", objaddr=0x1040, objstart=0x1000),)


def _intervals(copied_from: dict) -> list:
    """Three intervals of two processes of one program (the second's
    Frames copies of the first's, as the symbolizer hands them out), each
    interval with stacks met before and new ones."""
    one, two = _frames(0x400000), _frames(0x7f0000)
    copied_from.update(zip(map(id, two), one))
    leaf, work, main, unnamed = one
    stacks_one = [Stack((leaf, work, main)), Stack((work, main)), Stack((unnamed, main)),
                  Stack((leaf, work, main), notes=("cut",))]
    stacks_two = [Stack(tuple(two[:3])), Stack((two[3], two[2]))]
    counts = [StackCount("prog", 10, s, 1 + i, "profile:hz:49") for i, s in enumerate(stacks_one)]
    counts2 = [StackCount("prog", 20, s, 5, "profile:hz:49") for s in stacks_two]
    # the first interval meets both processes' stack through leaf at once
    return [counts[:2] + counts2[:1], counts[1:], counts2 + counts[:1]]


def _sent(limit: int | None, monkeypatch, confirmed: bool = True) -> list:
    """Each interval's rows, stacks and frames sent; `confirmed`: the
    server says it has them after each (else it never answers, and each
    interval sends all it names again)."""
    if limit is not None:
        monkeypatch.setattr(SentStacks, "LIMIT", limit)
        monkeypatch.setattr(StackRows, "FRAMES_LIMIT", limit)
    copied_from: dict = {}
    intervals = _intervals(copied_from)
    known = SentStacks()
    known.rows.copied_from = copied_from
    facts = ProcessFacts()
    out = []
    for n, counts in enumerate(intervals):
        batch = interval_batch("h1", "run", n * 10**9, 10**9, counts, facts, False, known)
        rows = map(json.loads, batch["samples"].splitlines())
        out.append(([(r["pid"], r["stack_id"], r["weight"]) for r in rows],
                    batch["stacks"], batch["frames"]))
        if confirmed:
            known.confirmed.update(batch["stacks"])     # as the sender, once the server has them
            known.confirmed_frames.update(batch["frames"])
    return out


@pytest.mark.parametrize("confirmed", [True, False])
@pytest.mark.parametrize("limit", [1, 2, 3])
def test_stack_ids_and_rows_stay_the_same_past_the_bound(limit, confirmed, monkeypatch):
    """An agent that has met more stacks and frames than it keeps starts
    afresh: the stacks it meets then keep their ids, and their rows and
    their frames' rows are the same bytes (a reader of the tables cannot
    tell), also those sent again while the server has not answered."""
    unbounded = _sent(None, monkeypatch, confirmed)     # (before the bound is set)
    assert _sent(limit, monkeypatch, confirmed) == unbounded


def test_another_process_s_copies_are_the_same_stack(monkeypatch):
    """The second process's stack through the same places of the program
    (its Frames copies at other addresses) is the first process's stack:
    one id, one row, its frames not sent again."""
    (first, _, _), (second, stacks, frames), (third, stacks3, frames3) = _sent(None, monkeypatch)
    by_pid: dict = {}
    for rows in (first, second, third):
        for pid, sid, _weight in rows:
            by_pid.setdefault(pid, set()).add(sid)
    assert len(by_pid[10]) == 4 and len(by_pid[20]) == 2
    assert by_pid[20] <= by_pid[10]
    # interval 2 sends the two stacks interval 1 did not have and the one
    # frame it did not name (the unnamed one); interval 3, all of it met
    # before (the copies too), nothing but its samples
    assert (len(stacks), len(frames)) == (2, 1)
    assert (stacks3, frames3) == ({}, {})


def test_frames_read_as_they_are_named_travel_as_the_same_rows(monkeypatch):
    """The run's sink reads each place's frames as the symbolizer names
    them (the copies then carry their originals' ids): the rows, ids and
    frames sent are those of frames read at the interval's end."""
    at_the_end = _sent(None, monkeypatch)
    named_first = SentStacks.stack_ids

    def named_then_ids(known, stacks):
        originals = {id(f): f for s in stacks for f in s.frames
                     if id(f) not in known.rows.copied_from}
        known.rows.name([f for f in originals.values() if f.sink_id is None])
        return named_first(known, stacks)
    monkeypatch.setattr(SentStacks, "stack_ids", named_then_ids)
    assert _sent(None, monkeypatch) == at_the_end
