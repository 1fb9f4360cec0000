"""-f pprof read by the real `go tool pprof` (-top, -traces, -raw): the
known chain with exact counts, file:line of each location against
binutils addr2line at the address the mapping gives, inlined calls as
lines of one location, build-ids against `readelf -n`, a profile run's
samples and CPU time, kernel frames in a [kernel.kallsyms] mapping.

The runs go through the Python API (Session.counts) and the report
classes, as `ustack count -f pprof -o FILE` does."""
from __future__ import annotations

import gzip
import io
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from helpers import FP, O2_FP, addr2line_chains, build
from test_dwarf_unwind import build_cxx
from test_e2e_core import CHAIN, load_segments, nm_symbols

import ustack
from ustack.model import Frame, Stack, StackCount
from ustack.report.formats import EVENT_FORMATS, ReportContext, stack_report
from ustack.report.pprof_proto import Profile
from ustack.symbols.symbolizer import SymbolOptions

LIBC = "/usr/lib/x86_64-linux-gnu/libc.so.6"


# --- shared with the other test_formats_* files --------------------------------

def run_counts(command: str, events: list, cmdline: str, **options) -> tuple:
    """(StackCounts, event labels) of a run through the Python API."""
    opts = ustack.Options(command=command, events=events, cmdline=cmdline, **options)
    with ustack.Session(opts) as run:
        counted = run.counts()
        assert run.capture.losses().lost == 0
    return counted, list(run.labels)


def trace_report(name: str, events: list, cmdline: str, **options) -> tuple:
    """(the text `trace -f name` writes, the finished Session): a run's
    events through the events interface as trace drives it."""
    opts = ustack.Options(command="trace", events=events, cmdline=cmdline, **options)
    out = io.StringIO()
    with ustack.Session(opts) as run:
        report = EVENT_FORMATS[name](out, run.labels)
        for event in run.events():
            report.add(event.sample, event.stack, lambda pid, tid, c=event.comm: c)
        report.flush()
    return out.getvalue(), run


def write_report(name: str, counted: list, path: Path, context: ReportContext,
                 per_pid: bool = False) -> Path:
    """The file `-f name -o path` writes for these counted stacks."""
    report = stack_report(name, per_pid=per_pid, context=context)
    for sc in counted:
        report.add(sc)
    binary = getattr(report, "binary", False)
    with open(path, "wb" if binary else "w", encoding=None if binary else "utf-8") as out:
        report.finish(out)
    return path


# --- go tool pprof -----------------------------------------------------------------

def pprof(*args) -> str:
    go = shutil.which("go")
    if go is None:
        pytest.skip("go is not installed (go tool pprof reads the profile)")
    res = subprocess.run([go, "tool", "pprof", *map(str, args)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return res.stdout


def top(path) -> dict:
    """`go tool pprof -top`: function -> (flat, cum), as printed."""
    rows = {}
    lines = pprof("-top", path).splitlines()
    start = next(i for i, l in enumerate(lines) if l.split()[:2] == ["flat", "flat%"])
    for line in lines[start + 1:]:
        flat, _fp, _sp, cum, _cp, name = line.split(None, 5)
        rows[name] = (flat, cum)
    return rows


def traces(path) -> list:
    """`go tool pprof -traces`: [(value, [frame names, leaf first], labels)]."""
    out = []
    for block in pprof("-traces", path).split("-----------+")[1:]:
        value, frames, labels = None, [], {}
        for line in block.splitlines()[1:]:
            m = re.match(r"^\s+(\w+):\s+(.*)$", line)
            if m and value is None:
                labels[m[1]] = m[2]
                continue
            parts = line.split(None, 1)
            if value is None and len(parts) == 2:
                value, name = parts
                frames.append(name)
            elif parts:
                frames.append(line.strip())
        if value is not None:
            out.append((value, frames, labels))
    return out


_RAW_LOC = re.compile(r"^\s+(\d+): 0x([0-9a-f]+) M=(\d+) ?(?:(.*) s=\d+)?$")
_RAW_LINE = re.compile(r"^\s+(.*) s=\d+$")
_RAW_MAP = re.compile(r"^(\d+): 0x([0-9a-f]+)/0x([0-9a-f]+)/0x([0-9a-f]+) (\S+) ?(\S*)")


def raw(path) -> dict:
    """`go tool pprof -raw`: header lines, samples (value lists with the
    location ids), locations {id: (addr, mapping id, ["func file:line"])},
    mappings {id: (start, limit, offset, file, build-id)}."""
    text = pprof("-raw", path)
    head, rest = text.split("\nSamples:\n", 1)
    samples_text, rest = rest.split("\nLocations\n", 1)
    locs_text, maps_text = rest.split("\nMappings\n", 1)
    samples = []
    for line in samples_text.splitlines()[1:]:
        if ":" in line and re.match(r"^\s+[\d ]+: [\d ]+$", line):
            values, ids = line.split(":")
            samples.append(([int(v) for v in values.split()], [int(i) for i in ids.split()]))
    locations, last = {}, None
    for line in locs_text.splitlines():
        m = _RAW_LOC.match(line)
        if m:
            last = locations[int(m[1])] = (int(m[2], 16), int(m[3]), [m[4]] if m[4] else [])
        elif (m := _RAW_LINE.match(line)) and last is not None:
            last[2].append(m[1])
    mappings = {}
    for line in maps_text.splitlines():
        m = _RAW_MAP.match(line)
        if m:
            mappings[int(m[1])] = (int(m[2], 16), int(m[3], 16), int(m[4], 16), m[5], m[6])
    return dict(head=head, sample_types=samples_text.splitlines()[0].split(),
                samples=samples, locations=locations, mappings=mappings)


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
