"""Frames outside any file: JIT code named from /tmp/perf-PID.map (jit.c
writes its map the way JITs do, and appends to it while running), and the
vDSO named from the kernel's image (vdso_loop.c spins in clock_gettime).
Oracles: the map lines the program wrote; the vDSO's own dynamic symbols
read by readelf from the copy ustack made."""
from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from helpers import (build, FakeMaps, ok, parse_counts, parse_trace, run_ustack,
                     run_ustack_peak, traced_pid)

from ustack.kernel.procfs import own_vdso, started
from ustack.model import Mapping
from ustack.objfile.vdso import vdso_file
from ustack.symbols.perfmap import PerfMap, header_hint
from ustack.symbols.symbolizer import Symbolizer



def test_perf_map_reread_when_it_changes(tmp_path):
    path = tmp_path / "perf-1.map"
    path.write_text("1000 10 first\ngarbage line\n2000 zz bad size\n")
    pm = PerfMap(str(path))
    assert pm.lookup(0x1008).name == "first"
    assert pm.lookup(0x1010) is None and pm.lookup(0x2000) is None
    with open(path, "a") as f:                   # the JIT compiles more code
        f.write("2000 20 LuaJIT trace #2 [x.lua:3]\n1000 8 replaced\n")
    assert pm.lookup(0x2004).name == "LuaJIT trace #2 [x.lua:3]"
    assert (pm.lookup(0x1004).name, pm.lookup(0x1009)) == ("replaced", None)
    path.unlink()
    assert pm.lookup(0x2004) is None


def test_symbolizer_names_anonymous_code(tmp_path, monkeypatch):
    monkeypatch.setattr("ustack.symbols.perfmap.perf_map_path",
                        lambda pid: str(tmp_path / f"perf-{pid}.map"))
    (tmp_path / "perf-9.map").write_text("7f0000001000 40 _ZN2js3jit4Code3runEv\n")
    maps = FakeMaps({9: [Mapping(0x7F0000000000, 0x7F0000010000, 0, "//anon"),
                         Mapping(0x7F0000020000, 0x7F0000030000, 0, "[heap]")]})
    f = Symbolizer(maps).frames(9, [0x7F0000001010, 0x7F0000020010])
    assert [(x.function, x.offset, x.size, x.module) for x in f] == [
        ("js::jit::Code::run()", 0x10, 0x40, "JIT"), (None, 0, 0, "[heap]")]


PID_MAX = 1 << 22                      # the kernel's limit: no pid reaches it


class _RuntimeMaps(FakeMaps):
    """FakeMaps that also say which files a process maps (its runtime)."""

    def paths(self, pid):
        return [m.path for m in self.by_pid.get(pid, ())]


def test_jit_frames_kind_by_runtime(tmp_path, monkeypatch):
    """V8's names are JS frames wherever they come from; a JVM's map (the
    process maps libjvm.so) names Java frames; other JITs' are native."""
    monkeypatch.setattr("ustack.symbols.perfmap.perf_map_path",
                        lambda pid: str(tmp_path / f"perf-{pid}.map"))
    code = Mapping(0x7F0000000000, 0x7F0000010000, 0, "//anon")
    (tmp_path / "perf-1.map").write_text("7f0000001000 40 JS:*leaf /a/b.js:3:15\n"
                                         "7f0000002000 40 Builtin:ArrayMap\n")
    (tmp_path / "perf-2.map").write_text("7f0000001000 40 double Chain.leaf(int)\n"
                                         "7f0000002000 40 Interpreter\n")
    (tmp_path / "perf-3.map").write_text("7f0000001000 40 LuaJIT trace #1\n")
    jvm = Mapping(0x7F1000000000, 0x7F1000100000, 0, "/usr/lib/jvm/lib/server/libjvm.so")
    maps = _RuntimeMaps({1: [code], 2: [code, jvm], 3: [code]})
    f = Symbolizer(maps)
    assert [(x.function, x.kind) for pid in (1, 2, 3)
            for x in f.frames(pid, [0x7F0000001010, 0x7F0000002010])] == [
        ("JS:*leaf /a/b.js:3:15", "js"), ("Builtin:ArrayMap", "js"),
        ("double Chain.leaf(int)", "java"), ("Interpreter", "java"),
        ("LuaJIT trace #1", ""), (None, "")]


def test_jit_code_without_a_map_said_once(tmp_path, monkeypatch):
    monkeypatch.setattr("ustack.symbols.perfmap.perf_map_path",
                        lambda pid: str(tmp_path / f"perf-{pid}.map"))
    code = Mapping(0x7F0000000000, 0x7F0000010000, 0, "//anon")
    jvm = Mapping(0x7F1000000000, 0x7F1000100000, 0, "/usr/lib/jvm/lib/server/libjvm.so")
    f = Symbolizer(_RuntimeMaps({4: [code, jvm], 5: [code, jvm]}))
    for pid in (4, 5, 4):
        assert f.frames(pid, [0x7F0000001010])[0].function is None
    (tmp_path / "perf-5.map").write_text("7f0000002000 40 double Chain.leaf(int)\n")
    for pid in (5, 5):                  # jcmd wrote it before this code was compiled
        assert f.frames(pid, [0x7F0000001010])[0].function is None
    assert f.frames(5, [0x7F0000002010])[0].function == "double Chain.leaf(int)"
    assert f.warnings == [
        f"PID 4 (java) ran JIT code but wrote no perf map ({tmp_path}/perf-4.map): its "
        "JIT frames are unnamed; run `jcmd 4 Compiler.perfmap` while it runs (the map "
        "holds the code compiled until then), or start java with "
        "-XX:+UnlockDiagnosticVMOptions -XX:+DumpPerfMapAtExit",
        f"some JIT frames of PID 5 (java) are not in {tmp_path}/perf-5.map: code "
        "compiled after the map was written (or freed before); `jcmd 5 "
        "Compiler.perfmap` again, later in the run, names them"]


def test_jvm_stacks_ending_in_jit_code_said_when_most_do(tmp_path, monkeypatch):
    """A JVM without frame pointers in its JIT code: most of its stacks end
    there; a rare odd walk (a sample in a prologue) is not a reason to say so."""
    monkeypatch.setattr("ustack.symbols.perfmap.perf_map_path",
                        lambda pid: str(tmp_path / f"perf-{pid}.map"))
    (tmp_path / "perf-6.map").write_text("7f0000001000 40 double Chain.leaf(int)\n")
    code = Mapping(0x7F0000000000, 0x7F0000010000, 0, "//anon")
    jvm = Mapping(0x7F1000000000, 0x7F1000100000, 0, "/usr/lib/jvm/lib/server/libjvm.so")
    f = Symbolizer(_RuntimeMaps({6: [code, jvm]}))
    ended = f.frames(6, [0x7F0000001010])                       # leaf, then nothing
    through = f.frames(6, [0x7F0000001010, 0x7F1000000100])     # leaf, then libjvm
    said = "stacks of PID 6 (java) end in its JIT code"
    for stack in (ended, through, through):
        f.stack_named(6, stack, whole=True)
    assert not [w for w in f.warnings if said in w]
    f.stack_named(6, ended, whole=False)      # cut by a limit: not the JVM's doing
    assert not [w for w in f.warnings if said in w]
    for _ in range(3):                        # 4 of 7 end in JIT code: most
        f.stack_named(6, ended, whole=True)
    assert [w for w in f.warnings if said in w] == [
        said + ": a JVM started without -XX:+PreserveFramePointer keeps no frame "
        "pointer there to walk on"]


def test_header_hint_for_jit_code_without_a_map(tmp_path, monkeypatch):
    """-p of a JVM or node running JIT code with no map: the header says how
    to get one (a JVM can still be asked); nothing when there is one, or
    no JIT code, or another runtime."""
    monkeypatch.setattr("ustack.symbols.perfmap.perf_map_path",
                        lambda pid: str(tmp_path / f"perf-{pid}.map"))
    code = Mapping(0x7F0000000000, 0x7F0000010000, 0, "")
    jvm = Mapping(0x7F1000000000, 0x7F1000100000, 0, "/usr/lib/jvm/lib/server/libjvm.so")
    node = Mapping(0x560000000000, 0x560000100000, 0, "/usr/bin/node")
    other = Mapping(0x560000000000, 0x560000100000, 0, "/usr/bin/luajit")
    gone, mapped = PID_MAX + 7, PID_MAX + 9        # no such processes: no root of their own
    (tmp_path / f"perf-{mapped}.map").write_text("")
    assert [header_hint(pid, maps) for pid, maps in (
        (gone, [code, jvm]), (gone, [node, code]), (gone, [jvm]), (gone, [other, code]),
        (mapped, [code, jvm]))] == [
        f"no perf map yet: `jcmd {gone} Compiler.perfmap` during the run names its JIT frames",
        "no perf map (node --perf-basic-prof writes one): its JIT frames stay unnamed",
        "", "", ""]


@pytest.mark.kernel
def test_trace_through_jit_code():
    prog = build("jit")
    res = ok(run_ustack("trace", f"uprobe:{prog}:target", "-c", f"{prog} 2"))
    pid = traced_pid(res.stderr)
    mapfile = Path(f"/tmp/perf-{pid}.map")
    try:
        starts = [int(line.split()[0], 16) for line in mapfile.read_text().splitlines()]
    finally:
        mapfile.unlink(missing_ok=True)
    records = parse_trace(res.stdout)
    assert len(records) == 4, res.stdout
    want = [("jitted_first", starts[0]), ("jitted_first", starts[0]),
            ("Lua:jitted second trace", starts[1]), ("Lua:jitted second trace", starts[1])]
    for rec, (name, start) in zip(records, want):
        frames = rec["frames"]
        assert [(f["func"], f["module"]) for f in frames[:3]] == [
            ("target", "jit"), (name, "JIT"), ("main", "jit")], res.stdout
        # the return address after `call *%rdi`, 6 bytes into the trampoline
        assert (frames[1]["addr"] - start, frames[1]["off"], frames[1]["size"]) == (6, 6, 8)


def vdso_symbols() -> dict:
    """address -> names, from readelf on ustack's copy of the vDSO."""
    path = vdso_file()
    assert path, "no copy of the vDSO could be made"
    out = subprocess.run(["readelf", "-W", "--dyn-syms", path], capture_output=True,
                         text=True, check=True).stdout
    syms: dict = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 8 and parts[3] == "FUNC":
            syms.setdefault(int(parts[1], 16), set()).add(parts[7].split("@")[0])
    return syms


def test_vdso_copy_is_our_own_image():
    path = vdso_file()
    lo = hi = 0
    with open("/proc/self/maps") as f:
        for line in f:
            if line.rstrip().endswith("[vdso]"):
                lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
    assert os.path.getsize(path) == hi - lo
    assert any("clock_gettime" in names for names in vdso_symbols().values())
    mapping, image = own_vdso()            # kernel/: the bytes the copy holds
    assert (mapping.start, mapping.end) == (lo, hi)
    assert Path(path).read_bytes() == image


def test_vdso_copy_follows_the_cache_directory(monkeypatch, tmp_path):
    """A cache directory that cannot be written gives no copy; the next one
    that can gets it (one bad directory is not remembered for the process)."""
    monkeypatch.setenv("USTACK_CACHE_DIR", "/dev/null/no-cache")
    assert vdso_file() is None
    monkeypatch.setenv("USTACK_CACHE_DIR", str(tmp_path / "cache"))
    path = vdso_file()
    assert path and path.startswith(str(tmp_path / "cache"))
    assert Path(path).read_bytes() == own_vdso()[1]


def test_symbolizer_names_vdso_frames_from_the_copy():
    """A [vdso] mapping of the copy's size is read from the copy (names as
    readelf gives them, through the cached path; --lines finds none and
    does no harm); one of another size is no image we have: unnamed."""
    from ustack.symbols.symbolizer import SymbolOptions
    size = os.path.getsize(vdso_file())
    (addr, names), = [(a, n) for a, n in vdso_symbols().items() if "clock_gettime" in n]
    base = 0x7FFF00000000
    for opts in (SymbolOptions(), SymbolOptions(lines=True, inlines=True)):
        maps = FakeMaps({1: [Mapping(base, base + size, 0, "[vdso]")],
                         2: [Mapping(base, base + size + 0x1000, 0, "[vdso]")]})
        sym = Symbolizer(maps, opts)
        for _ in range(2):                       # the second time from the cache
            (f,) = sym.frames(1, [base + addr + 1])
            assert (f.function, f.offset, f.module, f.path) == (
                "clock_gettime", 1, "vdso", "[vdso]")
        (g,) = sym.frames(2, [base + addr + 1])
        assert (g.function, g.module) == (None, "vdso")


@pytest.mark.kernel
def test_profile_names_vdso_frames():
    prog = build("vdso_loop")
    res = ok(run_ustack("profile", "-F", "499", "-c", f"{prog} 1"))
    stacks = parse_counts(res.stdout)
    in_vdso = [s for s in stacks if s["frames"] and s["frames"][0][1] == "vdso"]
    total = sum(s["count"] for s in stacks)
    hits = sum(s["count"] for s in in_vdso)
    assert hits * 2 > total, res.stdout     # the loop lives in clock_gettime
    aliases = set().union(*(n for n in vdso_symbols().values() if "clock_gettime" in n))
    assert "clock_gettime" in aliases
    for s in in_vdso:     # of the aliases, the plain name, as README shows it
        assert s["frames"][0][0] == "clock_gettime", res.stdout
    # below the vDSO: libc's wrapper, then the program's loop
    assert any([f for f, _ in s["frames"][1:4]] == ["clock_gettime", "clock_loop", "main"]
               for s in in_vdso), res.stdout


def test_perf_map_half_written_line_waits(tmp_path):
    """A line the JIT is still writing is not read as a (cut) name; it is
    once complete. A map rewritten from scratch replaces the old entries."""
    path = tmp_path / "perf-2.map"
    path.write_text("1000 10 first\n3000 10 thi")
    pm = PerfMap(str(path))
    assert pm.lookup(0x1004).name == "first" and pm.lookup(0x3004) is None
    with open(path, "a") as f:
        f.write("rd\n")
    assert pm.lookup(0x3004).name == "third"
    path.write_text("5000 10 fifth\n")
    assert pm.lookup(0x5004).name == "fifth"
    assert pm.lookup(0x1004) is None and pm.lookup(0x3004) is None


def test_perf_map_that_is_a_fifo_is_refused_without_blocking(tmp_path):
    path = tmp_path / "perf-1.map"
    os.mkfifo(path)                               # open() would block for ever
    said = []
    pm = PerfMap(str(path), warn=said.append)
    assert pm.lookup(0x1000) is None
    assert said == [f"{path} is not a regular file: its JIT names are not used"]


def test_perf_map_symlink_and_foreign_owner_are_refused(tmp_path):
    real = tmp_path / "secret"
    real.write_text("1000 10 leaked\n")
    link = tmp_path / "perf-1.map"
    link.symlink_to(real)
    said = []
    assert PerfMap(str(link), warn=said.append).lookup(0x1004) is None
    assert said == [f"{link} is a symbolic link: its JIT names are not used"]
    os.chown(real, 4242, 4242)                    # another user wrote it
    said.clear()
    assert PerfMap(str(real), owners=frozenset((0, 1000)),
                   warn=said.append).lookup(0x1004) is None
    assert said == [f"{real} is owned by uid 4242, not by the process's user or root: "
                    "its JIT names are not used"]


def test_perf_map_past_the_cap_is_read_from_its_end(tmp_path, monkeypatch):
    """A JIT appends, so the lines past the cap are its newest functions:
    those are named, the start is not (and the 1 GB hole is not read)."""
    monkeypatch.setattr("ustack.symbols.perfmap.MAX_MAP_BYTES", 2 << 20)
    monkeypatch.setattr("ustack.symbols.perfmap.PARSE_WINDOW", 1 << 20)
    path = tmp_path / "perf-1.map"
    with open(path, "w") as f:
        f.write("1000 10 first\n")
        f.truncate(1 << 30)                       # a 1 GB hole after it
        f.seek(1 << 30)
        f.write("\n2000 10 newest\n")
    said = []
    perf_map = PerfMap(str(path), warn=said.append)
    assert (perf_map.lookup(0x2004).name, perf_map.lookup(0x1004)) == ("newest", None)
    assert said == [f"{path} is larger than 2 MiB: only its newest names are used"]


@pytest.mark.kernel
def test_jit_functions_named_from_a_map_past_the_cap():
    """A map over MAX_MAP_BYTES (70 MiB of other lines first) whose newest
    lines name the JIT code the traced calls run through; memory stays
    bounded (its last 16 MiB are read)."""
    prog = build("jit")
    res, peak_mb = run_ustack_peak("trace", f"uprobe:{prog}:target", "-c", f"{prog} 1 70")
    ok(res)
    pid = traced_pid(res.stderr)
    Path(f"/tmp/perf-{pid}.map").unlink(missing_ok=True)
    frames = [rec["frames"][1] for rec in parse_trace(res.stdout)]
    assert [(f["func"], f["module"]) for f in frames] == [
        ("jitted_first", "JIT"), ("Lua:jitted second trace", "JIT")], res.stdout
    assert f"/tmp/perf-{pid}.map is larger than 64 MiB: only its newest names are " \
           "used" in res.stderr
    assert peak_mb < 200, f"peak RSS {peak_mb:.0f} MB"


@pytest.mark.kernel
def test_huge_perf_map_of_short_lines_stays_small():
    """A map of ~60 MiB of short lines (under the byte cap) written by the
    traced process itself: ustack keeps a bounded number of its entries,
    says the map was cut, stays far under 200 MB, and the JIT's own
    entries (appended last, the newest) still name their frames."""
    prog = build("jit")
    res, peak_mb = run_ustack_peak("trace", f"uprobe:{prog}:target", "-c", f"{prog} 1 60")
    ok(res)
    pid = traced_pid(res.stderr)
    Path(f"/tmp/perf-{pid}.map").unlink(missing_ok=True)
    frames = [rec["frames"][1] for rec in parse_trace(res.stdout)]
    assert [(f["func"], f["module"]) for f in frames] == [
        ("jitted_first", "JIT"), ("Lua:jitted second trace", "JIT")], res.stdout
    assert f"/tmp/perf-{pid}.map holds more than 16 MiB of names: only its newest " \
           "ones are used" in res.stderr
    assert peak_mb < 200, f"peak RSS {peak_mb:.0f} MB"


def test_perf_map_keeps_its_newest_entries(tmp_path, monkeypatch):
    """Past MAX_ENTRIES the oldest lines go (a JIT appends what it made
    last); a start named twice keeps its latest name; the cut is said."""
    monkeypatch.setattr("ustack.symbols.perfmap.MAX_ENTRIES", 4)
    path = tmp_path / "perf-3.map"
    path.write_text("".join(f"{0x1000 * (i + 1):x} 10 f{i}\n" for i in range(10)))
    said = []
    pm = PerfMap(str(path), warn=said.append)
    assert [pm.lookup(0x1000 * (i + 1)) for i in range(6)] == [None] * 6
    assert [pm.lookup(0x1000 * (i + 1) + 4).name for i in range(6, 10)] == [
        "f6", "f7", "f8", "f9"]
    assert said == [f"{path} has more than 4 entries: only the newest are used"]
    with open(path, "a") as f:
        f.write("a000 20 f9-replaced\n")
    assert pm.lookup(0xa018).name == "f9-replaced"
    assert (pm.lookup(0x7004), pm.lookup(0x8004).name) == (None, "f7")   # pushed out


def test_a_process_start_time_is_read():
    child = subprocess.Popen(["sleep", "30"])
    now = time.time()
    try:
        assert now - 3 <= started(child.pid) <= now + 1
    finally:
        child.kill()
        child.wait()


def test_a_map_left_by_an_earlier_process_with_the_pid_is_not_read(tmp_path, monkeypatch):
    """Pids are reused, and node and a JVM never remove their maps: one
    last written before its process started is not believed (its names
    would misname this process's code), and the header still says how to
    get a map. Written since, it is read."""
    path = tmp_path / "perf-11.map"
    path.write_text("7f0000001000 40 JS:*leaf /a/b.js:3:15\n")
    hour_ago = time.time() - 3600
    os.utime(path, (hour_ago, hour_ago))
    said: list = []
    perf_map = PerfMap(str(path), warn=said.append, started=time.time() - 10)
    assert perf_map.lookup(0x7F0000001010) is None and not perf_map.seen
    assert said == [f"{path} was last written before the process started (by an earlier "
                    "process with the same pid): not used"]
    path.write_text("7f0000001000 40 JS:*leaf /a/b.js:3:15\n")          # written now
    assert perf_map.lookup(0x7F0000001010).name == "JS:*leaf /a/b.js:3:15"

    me = os.getpid()                       # a live process, so its start is known
    monkeypatch.setattr("ustack.symbols.perfmap.perf_map_path",
                        lambda pid: str(tmp_path / f"perf-{pid}.map"))
    (tmp_path / f"perf-{me}.map").write_text("")
    os.utime(tmp_path / f"perf-{me}.map", (hour_ago, hour_ago))
    node = Mapping(0x560000000000, 0x560000100000, 0, "/usr/bin/node")
    code = Mapping(0x7F0000000000, 0x7F0000010000, 0, "")
    assert header_hint(me, [node, code]) == \
        "no perf map (node --perf-basic-prof writes one): its JIT frames stay unnamed"
