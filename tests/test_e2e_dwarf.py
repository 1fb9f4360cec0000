"""End to end, DWARF unwinding through the `ustack` command on real kernel
probes: programs built without frame pointers (-O2 -fomit-frame-pointer),
stacks that cross libc (a syscall wrapper, qsort calling back), a signal
frame, C++, a recursion deeper than the kernel's callchain limit, timed
samples, and the CFI cache shared between runs.

Oracles: gdb (it unwinds with the same CFI): helpers.gdb_backtrace for the
function names, and the gdb stop of test_dwarf_unwind.gdb_capture for every
pc down to _start; `perf record --call-graph dwarf` + `perf script`; nm and
objdump for the recursion's frame size.

ASLR: ustack's -c target is randomized, gdb's is not, so pcs are compared
as (module, pc - the first pc of that module in the stack), which is the
same in both when each frame is the same instruction."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from helpers import (O2_NOFP, PERF_BUILD_IDS, RECURSE_FLAGS, build, build_cxx, disassembly, funcs,
                     gdb_backtrace, gdb_capture, nm_symbols, ok, parse_counts,
                     parse_trace, perf_script_samples, private_copy, run_ustack,
                     truncation_note, unnamed, ustack_env)

pytestmark = pytest.mark.kernel

CHAIN = ["d", "c", "b", "a", "main"]
UNWINDS = ["dwarf", "auto"]          # auto must pick DWARF for these programs
MAX_STACK = 65528
DEPTH = 200                          # recurse.c's default
# gdb's name for the signal frame: None, or __restore_rt with libc's debug file
SIGNAL_FRAME = (None, "__restore_rt")


# --- fixtures ------------------------------------------------------------------

@pytest.fixture(scope="module")
def chain() -> Path:
    return build("chain", flags=O2_NOFP)


@pytest.fixture(scope="module")
def recurse() -> Path:
    return build("recurse", flags=RECURSE_FLAGS)


# --- output with notes ----------------------------------------------------------

def _is_note(line: str, indent: str) -> bool:
    return line.startswith(indent + "(") and line.endswith(")")


def trace_records(out: str) -> list[dict]:
    """parse_trace, plus each record's notes (the ` (…)` lines after its frames)."""
    records = []
    for block in out.split("\n\n"):
        if not block.strip():
            continue
        lines = block.strip("\n").split("\n")
        notes = [l[2:-1] for l in lines if _is_note(l, " ")]
        frames = [l for l in lines if not _is_note(l, " ")]
        assert lines[len(frames):] == [f" ({n})" for n in notes], \
            f"notes must follow the frames: {block!r}"
        (rec,) = parse_trace("\n".join(frames) + "\n")
        rec["notes"] = notes
        records.append(rec)
    return records


def count_stacks(out: str) -> list[dict]:
    """parse_counts, with the `  (…)` note lines moved from frames to notes."""
    stacks = parse_counts(out)
    for s in stacks:
        s["notes"] = [f[1:-1] for f, m in s["frames"] if m is None and f.startswith("(")]
        s["frames"] = [(f, m) for f, m in s["frames"]
                       if not (m is None and f.startswith("("))]
    return stacks


def dwarf_ok(res: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    """A successful run that unwound with DWARF and lost nothing."""
    ok(res)
    first = res.stderr.splitlines()[0]
    assert first.endswith("[backend perf, unwind dwarf]... Hit Ctrl-C to end."), first
    assert "Lost" not in res.stderr, res.stderr
    return res


def program_names(frames, prog: Path) -> list[str]:
    """The program's own frames (by module), innermost through main."""
    names = [f for f, m in ((fr["func"], fr["module"]) if isinstance(fr, dict) else fr
                            for fr in frames) if m == prog.name]
    return names[:names.index("main") + 1] if "main" in names else names


def demangle(names: list[str]) -> list[str]:
    """C++ names as c++filt prints them (what ustack shows: `leaf(long)`);
    others unchanged."""
    if not any(n.startswith("_Z") for n in names):
        return list(names)
    if shutil.which("c++filt") is None:
        pytest.skip("c++filt is not installed (binutils)")
    out = subprocess.run(["c++filt"], input="\n".join(names) + "\n",
                         capture_output=True, text=True, check=True).stdout
    return out.split("\n")[:len(names)]


def gdb_name(name: str) -> str:
    """A demangled name as gdb's `bt` shows it: without the parameters."""
    return name.split("(", 1)[0] if name.endswith(")") else name


def gdb_program_names(prog: Path, args, brk: str) -> list[str]:
    """gdb's `bt` (helpers.gdb_backtrace), keeping the program's own
    functions: what ustack must show as [prog] frames, in this order."""
    own = {gdb_name(n) for n in demangle(list(nm_symbols(prog)))}
    return [n for n in gdb_backtrace(prog, args, brk) if n in own]


def assert_pcs_like_gdb(rec: dict, cap, prog: Path, skip=()) -> None:
    """Every frame of a ustack trace record against gdb's stop: same length
    (gdb walks to _start too), same module per frame, same pc relative to
    the module's first pc in the stack (ASLR-free), the program's frames
    named as gdb names them and libc's named frames an alias of gdb's name.
    `skip`: indexes whose pc legitimately differs between the two runs."""
    ours = rec["frames"]
    names = [f["func"] for f in ours]
    diag = f"\nustack: {names}\ngdb:    {cap.gdb_names}"
    assert len(ours) == len(cap.gdb_pcs), diag
    gdb_mods = [os.path.basename(cap.find_mapping(pc).path) for pc in cap.gdb_pcs]
    assert [f["module"] for f in ours] == gdb_mods, diag
    # a frame after a signal frame is the interrupted pc: not the same twice
    skip = set(skip) | {i + 1 for i, n in enumerate(cap.gdb_names) if n in SIGNAL_FRAME}
    base_ours, base_gdb = {}, {}
    for i, (f, pc, mod) in enumerate(zip(ours, cap.gdb_pcs, gdb_mods)):
        if i in skip:
            continue
        base_ours.setdefault(mod, f["addr"])
        base_gdb.setdefault(mod, pc)
        assert f["addr"] - base_ours[mod] == pc - base_gdb[mod], \
            f"frame {i} ({names[i]}) is not at gdb's pc{diag}"
    for f, gname in zip(ours, cap.gdb_names):
        if f["module"] == prog.name:
            assert gdb_name(f["func"]) == gname, diag
        elif not unnamed(f["func"]) and gname:
            # symtab vs DWARF alias names (qsort_r: __GI___qsort_r), and
            # gcc's clones (msort_with_tmp.part.0: DWARF's msort_with_tmp)
            assert f["func"].split(".")[0].strip("_") in gname, diag


# --- 1. uprobe on d, chain without frame pointers -----------------------------------

@pytest.mark.parametrize("unwind", UNWINDS)
def test_uprobe_count_chain(chain, unwind):
    n = 1000
    res = dwarf_ok(run_ustack("count", "--backend", "perf", "--unwind", unwind, f"uprobe:{chain}:d",
                              "-c", f"{chain} {n}"))
    stacks = count_stacks(res.stdout)
    assert [(program_names(s["frames"], chain), s["count"], s["notes"]) for s in stacks] \
        == [(CHAIN, n, [])], res.stdout
    assert program_names(stacks[0]["frames"], chain) == gdb_program_names(chain, [1], "d")
    assert stacks[0]["frames"][-1] == ("_start", chain.name), "not unwound to the entry"


@pytest.mark.parametrize("unwind", UNWINDS)
def test_uprobe_trace_chain_pcs(chain, unwind, tmp_path):
    n = 3
    res = dwarf_ok(run_ustack("trace", "--backend", "perf", "--unwind", unwind, f"uprobe:{chain}:d",
                              "-c", f"{chain} {n}"))
    records = trace_records(res.stdout)
    assert len(records) == n, res.stdout
    assert all(r["notes"] == [] for r in records), res.stdout
    assert len({tuple(f["addr"] for f in r["frames"]) for r in records}) == 1
    cap = gdb_capture(chain, [1], "*d", tmp_path)          # the uprobe is at d's entry
    assert_pcs_like_gdb(records[0], cap, chain)
    assert program_names(records[0]["frames"], chain) == gdb_program_names(chain, [1], "d")


# --- 2. syscall:write from libc's write (no frame pointer in libc) ------------------

@pytest.mark.parametrize("unwind", UNWINDS)
def test_syscall_write_count(chain, unwind):
    n = 500
    res = dwarf_ok(run_ustack("count", "--backend", "perf", "--unwind", unwind, "syscall:write",
                              "-c", f"{chain} {n} write"))
    stacks = count_stacks(res.stdout)
    assert len(stacks) == 1 and stacks[0]["count"] == n, res.stdout
    frames = stacks[0]["frames"]
    assert frames[0] == ("write", "libc.so.6"), frames      # gdb: __GI___libc_write
    assert frames[1:6] == [(f, chain.name) for f in CHAIN], frames   # d is not skipped
    assert program_names(frames, chain) == gdb_program_names(chain, [1, "write"], "write")
    assert frames[-1] == ("_start", chain.name) and stacks[0]["notes"] == []


def test_dynamic_loader_startup_ends_cleanly():
    """ld.so's own _start has no CFI and rbp 0: its syscalls' stacks end
    there without a "frame pointer used" note (nothing was guessed)."""
    res = dwarf_ok(run_ustack("count", "--backend", "perf", "--unwind", "dwarf", "syscall:mmap", "-c", "true"))
    stacks = count_stacks(res.stdout)
    loader = [s for s in stacks if s["frames"][-1][1].startswith("ld-linux")]
    assert loader, res.stdout
    assert all(s["notes"] == [] for s in loader), res.stdout
    assert {s["frames"][-1][0] for s in loader} == {"_start"}, res.stdout


@pytest.mark.parametrize("unwind", UNWINDS)
def test_syscall_write_trace_pcs(chain, unwind, tmp_path):
    n = 3
    res = dwarf_ok(run_ustack("trace", "--backend", "perf", "--unwind", unwind, "syscall:write",
                              "-c", f"{chain} {n} write"))
    records = trace_records(res.stdout)
    assert len(records) == n, res.stdout
    assert all(r["notes"] == [] for r in records), res.stdout
    cap = gdb_capture(chain, [1, "write"], "write", tmp_path)
    # gdb stops at write's entry, the syscall tracepoint after its syscall
    # instruction: frame 0 differs by design, all callers must not
    assert_pcs_like_gdb(records[0], cap, chain, skip={0})
    assert (records[0]["frames"][0]["func"], records[0]["frames"][0]["module"]) == \
        ("write", "libc.so.6")


# --- 3. same stacks as perf --call-graph dwarf ---------------------------------------


def test_same_stack_as_perf_dwarf(chain, tmp_path):
    perf = shutil.which("perf")
    if perf is None:
        pytest.skip("perf is not installed (linux-perf): no perf comparison")
    prog = private_copy(chain, tmp_path)     # the probe is on this inode only
    event = f"dwe2e{os.getpid()}:d"          # no "ustack" in it: not ours to clean
    n = 3
    add = subprocess.run([perf, "probe", "-q", "-x", str(prog), "-a", f"{event}=d"],
                         capture_output=True, text=True)
    if add.returncode != 0:
        pytest.skip(f"perf probe cannot create a uprobe: {add.stderr.strip()}")
    try:
        data = tmp_path / "perf.data"
        rec = subprocess.run([perf, "record", "-q", "-B", *PERF_BUILD_IDS, "-e", event,
                              "--call-graph", "dwarf", "-o", str(data), "--", str(prog), str(n)],
                             capture_output=True, text=True, timeout=60)
        assert rec.returncode == 0, rec.stderr
    finally:
        subprocess.run([perf, "probe", "-q", "-d", event], capture_output=True)
    script = subprocess.run([perf, "script", "-i", str(data)], capture_output=True,
                            text=True, timeout=60)
    assert script.returncode == 0, script.stderr
    theirs = perf_script_samples(script.stdout)
    assert len(theirs) == n, script.stdout

    res = dwarf_ok(run_ustack("trace", "--backend", "perf", "--unwind", "dwarf", f"uprobe:{prog}:d",
                              "-c", f"{prog} {n}"))
    ours = trace_records(res.stdout)
    assert len(ours) == n
    for mine, perfs in zip(ours, theirs):
        mine_prog = [f for f in mine["frames"] if f["module"] == prog.name]
        perf_prog = [s for s, dso in perfs if dso == str(prog)]
        assert [f["func"] for f in mine_prog] == [s.split("+")[0] for s in perf_prog] \
            == CHAIN + ["_start"], (mine["frames"], perfs)
        # perf shows a caller's pc as the return address - 1 (the call
        # instruction), ustack the return address itself
        for i, (f, s) in enumerate(zip(mine_prog, perf_prog)):
            assert s == f"{f['func']}+{f['off'] - (i > 0):#x}", (mine["frames"], perfs)


# --- 4. qsort calling back: the stack crosses libc back to main ---------------------

def test_qsort_callback(tmp_path):
    prog = build("qsort_cb", flags=O2_NOFP)
    res = dwarf_ok(run_ustack("trace", "--backend", "perf", "--unwind", "dwarf", f"uprobe:{prog}:cmp",
                              "-c", f"{prog} 64"))
    records = trace_records(res.stdout)
    compares = len(records)
    assert compares > 64 and all(r["notes"] == [] for r in records), res.stdout
    first = records[0]["frames"]
    mods = [f["module"] for f in first]
    i = mods.index(prog.name, 1)                       # back in the program
    assert first[0]["func"] == "cmp" and i > 1 and set(mods[1:i]) == {"libc.so.6"}, first
    assert program_names(first, prog) == ["cmp", "sort_things", "main"] == \
        gdb_program_names(prog, [64], "cmp")
    cap = gdb_capture(prog, [64], "*cmp", tmp_path)    # the same (first) comparison
    assert_pcs_like_gdb(records[0], cap, prog)
    for r in records:                                  # every comparison gets there
        assert program_names(r["frames"], prog) == ["cmp", "sort_things", "main"], r
    res = dwarf_ok(run_ustack("count", "--backend", "perf", "--unwind", "dwarf", f"uprobe:{prog}:cmp",
                              "-c", f"{prog} 64"))
    assert sum(s["count"] for s in count_stacks(res.stdout)) == compares


# --- 5. a signal handler: across the kernel's signal frame ---------------------------

@pytest.mark.parametrize("unwind", UNWINDS)
def test_signal_handler(unwind, tmp_path):
    prog = build("sighandler", flags=O2_NOFP)
    res = dwarf_ok(run_ustack("trace", "--backend", "perf", "--unwind", unwind, f"uprobe:{prog}:handler",
                              "-c", f"{prog} 0.2"))
    records = trace_records(res.stdout)
    assert len(records) == 20, res.stdout     # 0.2 s of 10 ms ticks; spin waits for 20
    for r in records:
        f = r["frames"]
        assert (f[0]["func"], f[0]["module"]) == ("handler", prog.name), f
        assert f[1]["module"] == "libc.so.6", f          # __restore_rt
        assert f[1]["func"] == "__restore_rt", f          # exact: not looked up at pc-1
        assert program_names(f, prog) == ["handler", "spin", "main"], f
        assert (f[-1]["func"], r["notes"]) == ("_start", []), r
    assert gdb_program_names(prog, [1], "handler") == ["handler", "spin", "main"]
    cap = gdb_capture(prog, [1], "*handler", tmp_path)
    assert cap.gdb_names[1] in SIGNAL_FRAME               # gdb's <signal handler called>
    assert_pcs_like_gdb(records[0], cap, prog)


# --- 6. C++ without frame pointers ---------------------------------------------------

@pytest.mark.parametrize("unwind", UNWINDS)
def test_cxx(unwind, tmp_path):
    prog = build_cxx("cxx_throw", ("-O2", "-g", "-fomit-frame-pointer"))
    n = 6                                   # leaf throws 3 times: the unwinder survives it
    # the probe names leaf as a person does; names print demangled (c++filt)
    res = dwarf_ok(run_ustack("count", "--backend", "perf", "--unwind", unwind, f"uprobe:{prog}:leaf",
                              "-c", f"{prog} {n}"))
    stacks = count_stacks(res.stdout)
    assert len(stacks) == 1 and stacks[0]["count"] == n, res.stdout
    frames = stacks[0]["frames"]
    names = program_names(frames, prog)
    assert names == demangle(["_Z4leafl", "_Z2f2l", "_Z2f1l", "main"]) == \
        ["leaf(long)", "f2(long)", "f1(long)", "main"], frames
    assert [gdb_name(n) for n in names] == gdb_program_names(prog, [1], "leaf") == \
        ["leaf", "f2", "f1", "main"]
    assert frames[-1] == ("_start", prog.name) and stacks[0]["notes"] == []
    # --no-demangle: the linker's names, and the probe by its mangled name
    res = dwarf_ok(run_ustack("count", "--backend", "perf", "--no-demangle", "--unwind", unwind,
                              f"uprobe:{prog}:_Z4leafl", "-c", f"{prog} 2"))
    (stack,) = count_stacks(res.stdout)
    assert program_names(stack["frames"], prog) == ["_Z4leafl", "_Z2f2l", "_Z2f1l", "main"]
    res = dwarf_ok(run_ustack("trace", "--backend", "perf", "--unwind", unwind, f"uprobe:{prog}:leaf(long)",
                              "-c", f"{prog} 1"))
    (rec,) = trace_records(res.stdout)
    assert_pcs_like_gdb(rec, gdb_capture(prog, [1], "*leaf", tmp_path), prog)


# --- 7. timed samples --------------------------------------------------------------

@pytest.mark.parametrize("unwind", UNWINDS)
def test_profile_without_frame_pointers(unwind):
    busy = build("busy", flags=O2_NOFP)
    want = gdb_program_names(busy, [0.1], "spin_here")
    assert want == ["spin_here", "work", "main"]
    res = dwarf_ok(run_ustack("profile", "--backend", "perf", "-F", "999", "--unwind", unwind,
                              "-c", f"{busy} 1"))
    stacks = count_stacks(res.stdout)
    total = sum(s["count"] for s in stacks)
    assert total >= 300, f"{total} samples in 1 s at 999 Hz\n{res.stdout}"
    top = stacks[-1]
    assert program_names(top["frames"], busy) == want, res.stdout
    assert top["frames"][0] == ("spin_here", busy.name)
    assert top["frames"][-1] == ("_start", busy.name), top["frames"]
    assert top["count"] >= 0.9 * total, res.stdout
    for s in stacks:          # in spin_here, always the whole chain, never cut
        names = program_names(s["frames"], busy)
        if names and names[0] == "clock_gettime@plt":   # on its way to the vDSO
            names = names[1:]
        if "spin_here" in names:
            assert names == want and s["notes"] == [], s
        else:                 # e.g. the exit path through crt code without CFI
            assert all(n.startswith("frame pointer used for ") for n in s["notes"]), s


# --- 8. deeper than the kernel's callchain limit -------------------------------------

def test_recursion_deeper_than_kernel_limit(recurse):
    max_stack = int(Path("/proc/sys/kernel/perf_event_max_stack").read_text())
    assert DEPTH + 1 > max_stack, "recurse.c no longer out-recurses the kernel limit"
    want = ["leaf"] + ["rec"] * DEPTH + ["main"]
    assert gdb_backtrace(recurse, [], "leaf") == want
    res = dwarf_ok(run_ustack("trace", "--backend", "perf", "--unwind", "dwarf", "--stack-size", MAX_STACK,
                              f"uprobe:{recurse}:leaf", "-c", str(recurse)))
    (rec,) = trace_records(res.stdout)
    got = program_names(rec["frames"], recurse)
    assert got == want, f"{len(got)} of {len(want)} frames: {got[:3]}…{got[-3:]}, " \
                        f"notes {rec['notes']}"
    assert rec["frames"][-1]["func"] == "_start" and rec["notes"] == []


def _rec_frame_bytes(prog: Path) -> int:
    """Stack bytes of one rec frame: its `sub $N,%rsp` plus the return address."""
    insns = disassembly(prog)["rec"]
    subs = [int(m.group(1), 16) for _, t in insns
            if (m := re.match(r"sub\s+\$0x([0-9a-f]+),%rsp$", t))]
    assert len(subs) == 1 and not any(t.startswith("push") for _, t in insns), insns
    return subs[0] + 8


@pytest.mark.parametrize("size", [1024, 8192])
def test_recursion_stack_copy_too_small(recurse, size):
    """The copy holds leaf's return address at offset 0, then one every
    frame: leaf + (size - 8) // frame + 1 rec frames, then the note."""
    res = dwarf_ok(run_ustack("trace", "--backend", "perf", "--unwind", "dwarf", "--stack-size", size,
                              f"uprobe:{recurse}:leaf", "-c", str(recurse)))
    (rec,) = trace_records(res.stdout)
    assert rec["notes"] == [truncation_note(size)], res.stdout
    recs = (size - 8) // _rec_frame_bytes(recurse) + 1
    assert funcs(rec["frames"]) == ["leaf"] + ["rec"] * recs, rec["frames"]


# --- 9. the CFI cache: the second run parses nothing --------------------------------

_CLI_WITH_STATS = textwrap.dedent("""
    import json, sys
    from ustack import cli
    from ustack.unwind.cfi import UnwindTable
    rc = cli.main(sys.argv[1:])
    sys.stdout.flush()
    tables = {t.path: t.from_cache for t in UnwindTable.loaded()}
    print("STATS " + json.dumps(dict(rc=rc, parses=UnwindTable.parse_count,
                                     tables=tables)), file=sys.stderr)
""")


def _cli_run(cache: Path, *args) -> tuple[str, dict]:
    """The real CLI (cli.main) in a fresh process; then what its unwinder
    parsed and loaded."""
    env = dict(ustack_env(), USTACK_CACHE_DIR=str(cache))
    res = run_ustack(*args, cmd=(sys.executable, "-c", _CLI_WITH_STATS), env=env)
    head, _, stats = res.stderr.rpartition("STATS ")
    assert stats, res.stderr
    dwarf_ok(subprocess.CompletedProcess(res.args, res.returncode, res.stdout, head))
    return res.stdout, json.loads(stats)


def test_cfi_cache_across_runs(chain, tmp_path):
    cache = tmp_path / "cache"
    args = ("count", "--backend", "perf", "--unwind", "dwarf", "syscall:write", "-c", f"{chain} 20 write")
    out1, first = _cli_run(cache, *args)
    tables = first["tables"]
    assert str(chain) in tables and any(p.endswith("/libc.so.6") for p in tables), tables
    assert first["parses"] == len(tables) and not any(tables.values()), first
    files = sorted((cache / "cfi").glob("*.v2"))
    assert len(files) == len(tables), (files, tables)
    out2, second = _cli_run(cache, *args)
    assert second["parses"] == 0, second
    assert second["tables"] == {p: True for p in tables}, second
    assert out2 == out1
    assert sorted((cache / "cfi").glob("*.v2")) == files
    stacks = count_stacks(out2)
    assert [(program_names(s["frames"], chain), s["count"]) for s in stacks] == [(CHAIN, 20)]


def test_losses_of_copied_stacks_do_not_advise_a_larger_buffer(chain):
    """Copied stacks are lost because decoding falls behind, which a larger
    buffer only delays: the advice says so instead of --buffer-pages N*4
    (which sent users round a loop to 1.3 GB). One page for 8 KiB copies:
    most events of a tight loop are lost."""
    res = run_ustack("count", "--backend", "perf", "--unwind", "dwarf",
                     "--buffer-pages", "1", f"uprobe:{chain}:d", "-c", f"{chain} 20000",
                     timeout=120)
    assert res.returncode == 0, res.stderr
    lost = [line for line in res.stderr.splitlines() if line.startswith("Lost ")]
    assert len(lost) == 1, res.stderr
    assert "a larger --buffer-pages only delays the losses" in lost[0]
    assert "--backend bpf" in lost[0] and "try --buffer-pages" not in lost[0]


@pytest.mark.parametrize("backend", ["bpf", "perf"])
def test_inside_the_signal_trampoline(backend):
    """The event of rt_sigreturn itself: the pc is __restore_rt's, just
    after its syscall (its CFI ends before it). The stack goes on from the
    ucontext to the interrupted spin and main, complete, on either walk."""
    prog = build("sighandler", flags=O2_NOFP)
    res = ok(run_ustack("count", "--backend", backend, "syscall:rt_sigreturn",
                        "-c", f"{prog} 0.2"))
    stacks = count_stacks(res.stdout)
    assert sum(s["count"] for s in stacks) == 20, res.stdout
    for s in stacks:
        f = s["frames"]
        assert f[0] == ("__restore_rt", "libc.so.6"), f
        assert [name for name, module in f if module == prog.name] == ["spin", "main", "_start"], f
        assert s["notes"] == [], s
