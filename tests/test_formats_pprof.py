"""-f pprof read by the real `go tool pprof` (-top, -traces, -raw): the
known chain with exact counts, file:line of each location against
binutils addr2line at the address the mapping gives, inlined calls as
lines of one location, build-ids against `readelf -n`, a profile run's
samples and CPU time, kernel frames in a [kernel.kallsyms] mapping.

The runs go through the Python API (Session.counts) and the report
classes, as `ustack count -f pprof -o FILE` does."""
from __future__ import annotations

import gzip
import re
import subprocess

import pytest

from helpers import (CHAIN, FP, O2_FP, addr2line_chains, build, build_cxx, load_segments,
                     nm_symbols, raw, run_counts, top, traces, write_report)

from ustack.model import Frame, Stack, StackCount
from ustack.report.formats import ReportContext
from ustack.report.pprof_proto import Profile
from ustack.symbols.symbolizer import SymbolOptions

LIBC = "/usr/lib/x86_64-linux-gnu/libc.so.6"


# --- shared with the other test_formats_* files --------------------------------


# --- go tool pprof -----------------------------------------------------------------


def readelf_build_id(path) -> str:
    out = subprocess.run(["readelf", "-n", str(path)], capture_output=True,
                         text=True, check=True).stdout
    return re.search(r"Build ID: ([0-9a-f]+)", out)[1]


def elf_address(path, mapping: tuple, addr: int) -> int:
    """The ELF address of a runtime address, through the mapping's start
    and file offset (what a symbolizer of the profile does) and the
    object's PT_LOAD headers (readelf)."""
    start, _limit, offset, _file, _bid = mapping
    off = addr - start + offset
    for seg_off, vaddr, filesz in load_segments(path):
        if seg_off <= off < seg_off + filesz:
            return off - seg_off + vaddr
    raise AssertionError(f"file offset {off:#x} is in no PT_LOAD of {path}")


# --- tests ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def chain():
    return build("chain", flags=FP)


def count_context(labels) -> ReportContext:
    return ReportContext(command="count", events=tuple(labels), title="ustack count")


@pytest.mark.kernel
def test_chain_counts_and_traces(chain, tmp_path):
    n = 37
    counted, labels = run_counts("count", [f"uprobe:{chain}:d"], f"{chain} {n}")
    path = write_report("pprof", counted, tmp_path / "chain.pb.gz", count_context(labels))
    rows = top(path)
    assert rows["d"] == (str(n), str(n))
    for name in CHAIN[1:]:
        assert rows[name] == ("0", str(n)), name
    [(value, frames, labels_seen)] = traces(path)
    assert value == str(n)
    assert frames[:len(CHAIN)] == CHAIN
    assert labels_seen["comm"] == "chain"
    r = raw(path)
    assert r["sample_types"] == [f"uprobe:{chain}:d/count"]      # named after the event


@pytest.mark.kernel
def test_lines_and_mappings(chain, tmp_path):
    """--lines: every location of the program's mapping has the file:line
    binutils addr2line gives at the ELF address that the mapping's start
    and file offset make of the location's address (a return address is
    looked up one byte back, inside the call); build-ids as readelf -n."""
    counted, labels = run_counts("count", [f"uprobe:{chain}:d"], f"{chain} 5",
                                 symbols=SymbolOptions(lines=True))
    path = write_report("pprof", counted, tmp_path / "lines.pb.gz", count_context(labels))
    r = raw(path)
    maps = r["mappings"]
    by_file = {m[3]: (i, m) for i, m in maps.items()}
    assert by_file[str(chain)][1][4] == readelf_build_id(chain)
    assert by_file[LIBC][1][4] == readelf_build_id(LIBC)
    assert maps[1][3] == str(chain)                  # the main binary comes first
    [(values, ids)] = r["samples"]
    assert values == [5]
    mid, mapping = by_file[str(chain)]
    own = [r["locations"][i] for i in ids if r["locations"][i][1] == mid][:len(CHAIN)]
    assert [loc[2][0].split()[0] for loc in own] == CHAIN     # then crt's _start
    addrs = []
    for k, (addr, _m, _lines) in enumerate(own):
        assert mapping[0] <= addr < mapping[1]
        addrs.append(elf_address(chain, mapping, addr) - (1 if k else 0))
    expected = addr2line_chains("addr2line", chain, addrs)
    for (addr, _m, lines), a in zip(own, addrs):
        function, file, line = expected[a][-1]
        assert lines == [f"{function} {file}:{line}"]
    for addr, m, _lines in r["locations"].values():
        start, limit = maps[m][:2]
        assert start <= addr < limit


@pytest.mark.kernel
def test_inlined_calls_are_lines_of_one_location(tmp_path):
    """inline.c at -O2 with --inlines: the call to sink returns into outer
    inside inner inlined into middle: one location, three lines, innermost
    first, as addr2line -i lists them; -traces marks them (inline)."""
    prog = build("inline", flags=O2_FP)
    counted, labels = run_counts("count", [f"uprobe:{prog}:sink"], f"{prog} 3",
                                 symbols=SymbolOptions(lines=True, inlines=True))
    path = write_report("pprof", counted, tmp_path / "inline.pb.gz", count_context(labels))
    stacks = traces(path)
    assert sorted(v for v, _f, _l in stacks) == ["3", "3"]   # two copies of inner
    for _v, frames, _l in stacks:
        assert frames[:5] == ["sink", "inner (inline)", "middle (inline)", "outer", "main"]
    r = raw(path)
    mid = next(i for i, m in r["mappings"].items() if m[3] == str(prog))
    mapping = r["mappings"][mid]
    inlined = [loc for loc in r["locations"].values() if len(loc[2]) == 3]
    assert len(inlined) == 2
    addrs = [elf_address(prog, mapping, addr) - 1 for addr, _m, _l in inlined]
    expected = addr2line_chains("addr2line", prog, addrs)
    for (addr, _m, lines), a in zip(inlined, addrs):
        assert lines == [f"{f} {file}:{line}" for f, file, line in expected[a]]


@pytest.mark.kernel
def test_profile_samples_and_cpu_time(tmp_path):
    """A profile run: samples/count and cpu/nanoseconds = samples × 1e9/Hz,
    period cpu/nanoseconds; the busy function is where the time went."""
    busy = build("busy", flags=FP)
    hz = 199
    counted, labels = run_counts("profile", [f"profile:hz:{hz}"], f"{busy} 1")
    context = ReportContext(command="profile", events=tuple(labels), frequency=hz)
    path = write_report("pprof", counted, tmp_path / "busy.pprof", context)
    r = raw(path)
    period = 1_000_000_000 // hz
    assert r["sample_types"] == ["samples/count", "cpu/nanoseconds"]
    assert f"PeriodType: cpu nanoseconds\nPeriod: {period}" in r["head"]
    assert r["samples"] and all(v == [v[0], v[0] * period] for v, _ids in r["samples"])
    assert sum(v[0] for v, _ids in r["samples"]) == sum(sc.count for sc in counted)
    rows = top(path)
    assert next(iter(rows)) == "spin_here"           # -top: the most flat time first


@pytest.mark.kernel
def test_kernel_frames(chain, tmp_path):
    """--kernel (bpf): the kernel's frames, leaf first, in one
    [kernel.kallsyms] mapping spanning them, then the user frames."""
    counted, labels = run_counts("count", ["syscall:write"], f"{chain} 4 rawwrite",
                                 backend="bpf", kernel_stacks=True)
    path = write_report("pprof", counted, tmp_path / "kernel.pb.gz", count_context(labels))
    r = raw(path)
    kernel = [i for i, m in r["mappings"].items() if m[3] == "[kernel.kallsyms]"]
    assert len(kernel) == 1
    [(values, ids)] = r["samples"]
    assert values == [4]
    locs = [r["locations"][i] for i in ids]
    in_kernel = [loc[1] == kernel[0] for loc in locs]
    assert in_kernel[0] and not in_kernel[-1]
    assert in_kernel == sorted(in_kernel, reverse=True)      # kernel frames first
    user = [loc[2][0].split()[0] for loc in locs if loc[1] != kernel[0]]
    assert user[:len(CHAIN)] == CHAIN
    start, limit = r["mappings"][kernel[0]][:2]
    assert all(start <= loc[0] < limit for loc in locs if loc[1] == kernel[0])


def test_what_the_frames_do_not_tell(tmp_path):
    """An object that cannot be read: its mapping has no range and no
    build-id, an unnamed frame is a location without lines; the unwinder's
    notes become a `note` label; several events an `event` label each."""
    gone = "/gone/prog"
    stack = Stack((Frame(addr=0x401234, module="prog", function="f", offset=4, path=gone),
                   Frame(addr=0x405678, module="prog", path=gone)),
                  notes=("stopped: no CFI",))
    counted = [StackCount("prog", 42, stack, 5, "syscall:read"),
               StackCount("prog", 42, stack, 2, "syscall:write")]
    context = ReportContext(command="count", events=("syscall:read", "syscall:write"))
    path = write_report("pprof", counted, tmp_path / "gone.pb.gz", context)
    r = raw(path)
    assert r["sample_types"] == ["events/count"]
    assert sorted(v for v, _ids in r["samples"]) == [[2], [5]]
    assert r["mappings"] == {1: (0, 0, 0, gone, "")}
    named, unnamed = (r["locations"][i] for i in r["samples"][0][1])
    assert named[2] == ["f :0"] and unnamed[2] == []
    labels = {tuple(sorted(lb.items())) for _v, _f, lb in traces(path)}
    assert labels == {(("comm", "prog"), ("event", e), ("note", "stopped: no CFI"),
                       ("pid", "42")) for e in ("syscall:read", "syscall:write")}


@pytest.mark.kernel
def test_cxx_system_names(tmp_path):
    """C++: functions are named demangled, their system_name is the
    linker's (mangled) name as `nm` lists it."""
    prog = build_cxx("cxx_throw", FP)
    counted, labels = run_counts("count", [f"uprobe:{prog}:leaf(long)"], f"{prog} 2")
    path = write_report("pprof", counted, tmp_path / "cxx.pb.gz", count_context(labels))
    [(value, frames, _labels)] = traces(path)
    assert value == "2" and frames[:4] == ["leaf(long)", "f2(long)", "f1(long)", "main"]
    profile = Profile.FromString(gzip.decompress(path.read_bytes()))
    names = {profile.string_table[f.name]: profile.string_table[f.system_name]
             for f in profile.function}
    mangled = nm_symbols(prog)
    for name in ("leaf(long)", "f2(long)", "f1(long)"):
        assert names[name] in mangled and names[name].startswith("_Z"), names[name]
    assert names["main"] == "main"
