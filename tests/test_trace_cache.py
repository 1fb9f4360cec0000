"""A trace names each distinct stack once (symbols/stacks.py's cache, the
trace report's cache of formatted frames): a stack met again is named as it
was, and the same addresses in a process that exec'd between two events
are named by the program each event ran in."""
from __future__ import annotations

import re
import struct
import subprocess

import pytest

from helpers import O2_FP, build, ok, parse_trace, run_ustack
from ustack.model import CommEvent, Mapping, MmapEvent, RawSample
from ustack.symbols.stacks import StackResolver
from ustack.target.mappings import MappingTracker


@pytest.mark.kernel
def test_a_stack_met_again_is_named_the_same():
    prog = build("chain", flags=O2_FP)
    res = ok(run_ustack("trace", f"uprobe:{prog}:d", "-c", f"{prog} 3"))
    events = parse_trace(res.stdout)
    assert len(events) == 3, res.stdout
    frames = [[(f["addr"], f["func"], f["module"]) for f in e["frames"]] for e in events]
    assert [(f, m) for _a, f, m in frames[0][:5]] == [
        ("d", "chain"), ("c", "chain"), ("b", "chain"), ("a", "chain"), ("main", "chain")]
    assert frames[1] == frames[0] and frames[2] == frames[0], res.stdout


def _text(path) -> tuple:
    """(vaddr, file offset, size) of a non-PIE program's executable segment."""
    out = subprocess.run(["readelf", "-lW", str(path)], capture_output=True, text=True,
                         check=True).stdout
    for line in out.splitlines():
        f = line.split()
        if f and f[0] == "LOAD" and f[-3:-1] == ["R", "E"]:
            return int(f[2], 16), int(f[1], 16), int(f[5], 16)
    raise AssertionError(out)


def _symbol(path, name: str) -> int:
    out = subprocess.run(["nm", str(path)], capture_output=True, text=True, check=True).stdout
    return int(re.search(rf"^([0-9a-f]+) T {name}$", out, re.M)[1], 16)


def test_the_same_address_after_an_exec_is_named_by_the_new_program():
    """Two programs at the same fixed address (non-PIE): one event at an
    address of the first, an exec, one at the same address in the second;
    and the first again, read after the exec (as a sample still in a
    buffer is): each named by the program it ran in."""
    chain = build("chain", flags=O2_FP, pie=False)
    other = build("forkexec", flags=O2_FP, pie=False)
    pid = 4242
    tracker = MappingTracker(live=False)
    resolver = StackResolver(tracker)

    def mapped(path):
        vaddr, offset, size = _text(path)
        start = vaddr & ~0xFFF
        tracker.apply(MmapEvent(pid, pid, Mapping(start, vaddr + size, offset & ~0xFFF,
                                                  str(path))))
        return start, vaddr + size

    c_start, c_end = mapped(chain)
    d = _symbol(chain, "d")
    before = RawSample(0, pid, pid, 1_000, 0, struct.pack("<Q", d))
    assert [f.function for f in resolver.stacks([before])[0].frames] == ["d"]

    tracker.apply(CommEvent(pid, pid, "forkexec", True, 2_000))
    o_start, o_end = mapped(other)
    assert o_start <= d < o_end, "forkexec's text does not cover chain's d"
    after = RawSample(0, pid, pid, 3_000, 0, struct.pack("<Q", d))
    named = [s.frames[0] for s in resolver.stacks([before, after, before])]
    assert [(f.function, f.module) for f in named] == [
        ("d", "chain"), (named[1].function, "forkexec"), ("d", "chain")]
    assert named[1].function != "d"


def test_a_place_met_in_another_process_of_the_program_is_named_as_a_copy():
    """Two processes of one PIE program at different bases (ASLR): the
    second's frame is named as the first's, at its own address, and is
    known as a copy of it (Symbolizer.copied_from: a sink knows its names
    by its original's identity); a resolver that never saw the first
    names it the same."""
    chain = build("chain", flags=O2_FP)
    vaddr, offset, size = _text(chain)
    d = _symbol(chain, "d")

    def resolver_of(*pids_bases):
        tracker = MappingTracker(live=False)
        for pid, base in pids_bases:
            tracker.apply(MmapEvent(pid, pid, Mapping(base + (vaddr & ~0xFFF),
                                                      base + vaddr + size,
                                                      offset & ~0xFFF, str(chain))))
        return StackResolver(tracker)

    resolver = resolver_of((100, 0x5555_0000_0000), (200, 0x5600_0000_0000))
    first, second = (resolver.stacks([RawSample(0, pid, pid, 1_000, 0, struct.pack(
        "<Q", base + d))])[0].frames[0] for pid, base in ((100, 0x5555_0000_0000),
                                                         (200, 0x5600_0000_0000)))
    assert (first.function, second.function) == ("d", "d")
    assert (first.addr, second.addr) == (0x5555_0000_0000 + d, 0x5600_0000_0000 + d)
    assert resolver.symbolizer.copied_from[id(second)] is first
    alone = resolver_of((200, 0x5600_0000_0000)).stacks(
        [RawSample(0, 200, 200, 1_000, 0, struct.pack("<Q", 0x5600_0000_0000 + d))])[0]
    assert alone.frames[0] == second
