"""End to end: `--backend tracefs` (the ftrace and uprobe_events recipes automated) against the
perf backend and gdb, fetch-args on both backends, isolation of concurrent
runs, and cleanup of a killed run's instance and probes.

Oracles: the perf backend (same program, same event), gdb's backtrace
(DWARF CFI) for -O2 -fomit-frame-pointer, the values the chain program
passes (d(i) for i = 0…N-1; c returns the sum + 1)."""
from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from helpers import (FP, O2_NOFP, build, build_go, fail_one_line, finish, funcs,
                     gdb_backtrace, kill_run_and_guardian, ok, parse_counts, parse_trace,
                     private_copy, program_frames, run_ustack, spawn, start_ustack, stop,
                     traced_pid, uprobe_hits, ustack_lines, wait_tracing, wait_until)

TRACEFS = Path("/sys/kernel/tracing")
pytestmark = pytest.mark.kernel


def trace(backend: str, *args) -> list[dict]:
    res = ok(run_ustack("trace", "--backend", backend, *args))
    return parse_trace(res.stdout)


def named(rec) -> list[tuple]:
    return [(f["func"], f["module"]) for f in rec["frames"]]


@pytest.fixture(scope="module")
def chain() -> Path:
    return build("chain", flags=FP)


# --- stacks: the same frames as the perf backend ---------------------------------

@pytest.mark.parametrize("unwind", ["fp", "dwarf"])
def test_uprobe_chain_same_as_perf(chain, unwind):
    n = 3
    got = {b: trace(b, "--unwind", unwind, f"uprobe:{chain}:d", "-c", f"{chain} {n}")
           for b in ("tracefs", "perf")}
    assert len(got["tracefs"]) == len(got["perf"]) == n
    for t, p in zip(got["tracefs"], got["perf"]):
        assert named(t) == named(p)
        assert t["label"] == p["label"] == f"uprobe:{chain}:d"
    # and the frames are the chain itself, not merely equal
    rec = got["tracefs"][0]
    names = funcs(rec["frames"])
    mods = [f["module"] for f in rec["frames"]]
    assert program_frames(names, mods) == ["d", "c", "b", "a", "main"]


def test_syscall_write_same_as_perf(chain):
    """rawwrite: the syscall instruction is inside d. ftrace's
    userstacktrace walks frame pointers like perf's callchain but keeps at
    most 8 frames: the same frames, cut at 8."""
    n = 2
    t = trace("tracefs", "syscall:write", "-c", f"{chain} {n} rawwrite")
    p = trace("perf", "--unwind", "fp", "syscall:write", "-c", f"{chain} {n} rawwrite")
    assert len(t) == len(p) == n
    for a, b in zip(t, p):
        assert [f for f, _m in named(a)[:5]] == ["d", "c", "b", "a", "main"], a
        assert named(a) == named(b)[:8]


def test_header_says_8_frames(chain):
    res = ok(run_ustack("trace", "--backend", "tracefs", "syscall:write",
                        "-c", f"{chain} 1 rawwrite"))
    assert ("[backend tracefs, unwind fp; ftrace userstacktrace: frame pointers, "
            "at most 8 frames]") in res.stderr.splitlines()[0]


def test_nofp_uprobe_complete_with_dwarf():
    """-O2 -fomit-frame-pointer: frame pointers give nothing; the stack
    words fetched at the uprobe, unwound with CFI, give gdb's stack."""
    prog = build("chain", flags=O2_NOFP)
    want = gdb_backtrace(prog, ["2"], "d")
    assert want[:5] == ["d", "c", "b", "a", "main"]
    recs = trace("tracefs", f"uprobe:{prog}:d", "-c", f"{prog} 2")
    assert len(recs) == 2
    for rec in recs:
        names = funcs(rec["frames"])
        assert names[:len(want)] == want, (names, want)
        assert not rec["notes"], rec["notes"]


def test_count_same_as_perf(chain):
    n = 200
    counts = {}
    for b in ("tracefs", "perf"):
        res = ok(run_ustack("count", "--backend", b, "--unwind", "dwarf",
                            f"uprobe:{chain}:d", "-c", f"{chain} {n}"))
        counts[b] = [(s["frames"], s["count"]) for s in parse_counts(res.stdout)]
    assert counts["tracefs"] == counts["perf"]
    assert [c for _f, c in counts["tracefs"]] == [n]
    # both unwind with ustack's own DWARF code: check the chain itself too
    (frames, _n), = counts["tracefs"]
    assert program_frames([f for f, _m in frames], [m for _f, m in frames]) == \
        ["d", "c", "b", "a", "main"], frames
    assert frames[-1] == ("_start", "chain"), frames


# --- fetch-args --------------------------------------------------------------------

@pytest.mark.parametrize("backend", ["tracefs", "perf"])
def test_fetch_args_exact(chain, backend):
    recs = trace(backend, f"uprobe:{chain}:d %di n=%di:u64 low=%di:u8 c=$comm",
                 f"uretprobe:{chain}:c $retval:u64", "-c", f"{chain} 3")
    heads = [r["label"] for r in recs]
    want = [f'uprobe:{chain}:d arg1=0x{i:x} n={i} low={i} c="chain"' for i in range(3)]
    assert heads == want + [f"uretprobe:{chain}:c retval=4"]     # 0+1+2, plus 1
    assert funcs(recs[0]["frames"])[:2] == ["d", "c"]


@pytest.mark.parametrize("backend", ["tracefs", "perf"])
def test_fetch_arg_string_from_user_memory(chain, backend):
    """+0(%si):string: write(2)'s buffer, read in the probe."""
    recs = trace(backend, "uprobe:libc:write s=+0(%si):string len=%dx:u64",
                 "-c", f"{chain} 2 write")
    # the label names the library as resolved in the target's mappings
    assert len(recs) == 2 and all(
        re.fullmatch(r'uprobe:/\S*/libc\.so\.6:write s="x" len=1', r["label"])
        for r in recs), [r["label"] for r in recs]
    assert [funcs(r["frames"])[:2] for r in recs] == [["write", "d"]] * 2


def test_count_syscall_through_tracefs(chain):
    res = ok(run_ustack("count", "--backend", "tracefs", "syscall:write",
                        "-c", f"{chain} 50 rawwrite"))
    assert [(program_frames(funcs(s["frames"]), [m for _f, m in s["frames"]]),
             s["count"]) for s in parse_counts(res.stdout)] == \
        [(["d", "c", "b", "a", "main"], 50)]


def test_fetch_args_negative_and_stack(chain):
    """s32 prints signed; $stack0 is the word at sp: at d's entry, the
    return address into c (which is also the stack's second frame)."""
    recs = trace("tracefs", f"uprobe:{chain}:d m=%di:s32 $stack0", "-c", f"{chain} 1")
    assert len(recs) == 1
    ret = recs[0]["frames"][1]
    assert ret["func"] == "c"
    assert recs[0]["label"] == f"uprobe:{chain}:d m=0 arg2=0x{ret['addr']:x}"


@pytest.mark.parametrize("backend", ["tracefs", "perf"])
def test_bad_fetch_arg_kernel_reason(chain, backend):
    msg = fail_one_line(run_ustack("trace", "--backend", backend,
                                   f"uprobe:{chain}:d %zz", "-c", f"{chain} 1"))
    assert msg == (f"ustack: the kernel refused uprobe:{chain}:d: "
                   "Invalid register name (at '%zz')")


def test_bad_fetch_arg_local_checks(chain):
    assert fail_one_line(run_ustack("trace", f"uprobe:{chain}:d $retval", "-c",
                                    f"{chain} 1")) == (
        f"ustack: bad fetch-arg '$retval' in 'uprobe:{chain}:d $retval': "
        "$retval exists only for uretprobe")
    assert fail_one_line(run_ustack("trace", "syscall:write %di")) == (
        "ustack: malformed event 'syscall:write %di': only uprobe, uretprobe and usdt "
        "take fetch-args; expected e.g. syscall:write, uprobe:/bin/ls:main, profile:hz:99")


def test_go_args_registers():
    """Go's register ABI: $arg1 of main.d is the loop index (in AX)."""
    prog = build_go("gochain")
    recs = trace("tracefs", f"uprobe:{prog}:main.d $arg1:u64", "-c", f"{prog} 3")
    assert [r["label"] for r in recs] == [f"uprobe:{prog}:main.d arg1={i}"
                                           for i in range(3)]
    assert funcs(recs[0]["frames"])[:5] == ["main.d", "main.(*T).c", "main.b",
                                            "main.a", "main.main"]


# --- a Go program's syscalls ---------- ---------------------------------------------------

def quiet(prog, *args) -> str:
    """A -c command whose stdout goes to /dev/null (gochain writes 'x's)."""
    return f"sh -c 'exec {prog} {' '.join(map(str, args))} >/dev/null'"


def test_go_syscall_write_full_names():
    prog = build_go("gochain")
    res = ok(run_ustack("trace", "--backend", "tracefs", "syscall:write",
                        "-c", quiet(prog, 3, "write")))
    recs = parse_trace(res.stdout)
    assert len(recs) == 3 and {r["pid"] for r in recs} == {traced_pid(res.stderr)}
    perf = parse_trace(ok(run_ustack("trace", "--unwind", "fp", "syscall:write",
                                     "-c", quiet(prog, 3, "write"))).stdout)
    assert len(perf) == 3
    for rec, want in zip(recs, perf):
        names = funcs(rec["frames"])
        assert names and all("." in n for n in names), names   # package.function
        # userstacktrace walks the same frame pointers as perf, up to 8 frames
        assert names == funcs(want["frames"])[:8]


# --- isolation and cleanup ------------------------------------------------------------

def test_two_runs_do_not_see_each_other(chain):
    prog = build_go("gochain")
    a = start_ustack("trace", "--backend", "tracefs", "syscall:write",
                     "-c", f"{chain} 40 rawwrite", stdout=subprocess.PIPE)
    b = start_ustack("trace", "--backend", "tracefs", "syscall:write",
                     "-c", quiet(prog, 30, "write"), stdout=subprocess.PIPE)
    out_a, err_a = finish(a)
    out_b, err_b = finish(b)
    assert a.returncode == b.returncode == 0, err_a + err_b
    ra, rb = parse_trace(out_a), parse_trace(out_b)
    assert {r["pid"] for r in ra} == {traced_pid(err_a)} and len(ra) == 40
    assert {r["pid"] for r in rb} == {traced_pid(err_b)} and len(rb) == 30


def test_sigkill_leftovers_removed_and_options_untouched(chain):
    """The run and its guardian both killed (the OOM killer, kill -9 of
    both): the next run removes what they left."""
    options = (TRACEFS / "trace_options").read_text()
    target = spawn(chain, 10 ** 12)
    try:
        us = start_ustack("trace", "--backend", "tracefs", f"uprobe:{chain}:d",
                          "syscall:write", "-p", target.pid)
        try:
            wait_tracing(us)
            instance = TRACEFS / "instances" / f"ustack_{us.pid}"
            assert instance.is_dir()
            assert (instance / "options" / "userstacktrace").read_text().strip() == "1"
            assert (TRACEFS / "trace_options").read_text() == options
            kill_run_and_guardian(us)
            us.wait()
        finally:
            stop(us)
        if not (ustack_lines(us.pid) and instance.is_dir()):
            # the killed run's lock is free: any ustack run starting meanwhile
            # (a parallel test's, another user's) removes what it left
            pytest.skip("another ustack run on this machine removed the killed run's "
                        "probes first: nothing left for the next run to prove")
    finally:
        stop(target)
    res = ok(run_ustack("count", "--backend", "tracefs", f"uprobe:{chain}:d",
                        "-c", f"{chain} 2"))
    assert not instance.exists(), "the next run did not remove the killed run's instance"
    assert ustack_lines(us.pid) == [], "the next run did not remove its probes"
    assert [s["count"] for s in parse_counts(res.stdout)] == [2]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["INT", "TERM"])
def test_signal_cleans_up_pid_target(chain, sig, tmp_path):
    prog = private_copy(chain, tmp_path)     # its uprobe hits are this test's
    target = spawn(prog, 10 ** 12)
    try:
        us = start_ustack("count", "--backend", "tracefs", f"uprobe:{prog}:d",
                          "-p", target.pid, stdout=subprocess.PIPE)
        try:
            wait_tracing(us)
            # the signal comes once calls of d have been recorded
            wait_until(lambda: uprobe_hits(prog) >= 1000, timeout=20,
                       what="1000 hits of the probe on d")
            us.send_signal(sig)
            out, err = us.communicate(timeout=20)
            assert us.returncode == 0, err
            counts = parse_counts(out)
            assert len(counts) == 1 and counts[0]["count"] > 0
            names = [f for f, _m in counts[0]["frames"]]
            assert names[:5] == ["d", "c", "b", "a", "main"]
            assert not (TRACEFS / "instances" / f"ustack_{us.pid}").exists()
            assert ustack_lines(us.pid) == []
            assert target.poll() is None, "the target died"
        finally:
            stop(us)
    finally:
        stop(target)


def test_lost_events_counted_exactly(tmp_path):
    """A 1-page buffer overruns: printed + reported lost = every event
    (the instance's overrun stats, two entries per event)."""
    prog = build("chain")
    n = 100_000
    out = tmp_path / "trace.txt"
    with open(out, "w") as f:
        res = run_ustack("trace", "--backend", "tracefs", "--unwind", "fp",
                         f"uprobe:{prog}:d", "-c", f"{prog} {n}", "--buffer-pages", "1",
                         stdout=f, timeout=120)
    assert res.returncode == 0, res.stderr
    m = re.search(r"^Lost (\d+) events: the tracefs buffer was full", res.stderr, re.M)
    assert m, f"a 1-page buffer and {n} events lost nothing?\n{res.stderr}"
    printed = sum(1 for line in out.read_text().splitlines()
                  if line.startswith("chain "))
    assert printed + int(m.group(1)) == n


def test_lost_process_records_are_not_counted_as_lost_events(tmp_path):
    """A shell starting the program 300 times (a fork and an exec each)
    through a 1-page buffer: the lost count is of the probe's events
    alone, printed + lost = every call, whatever fork and exec records
    were lost beside them."""
    prog = build("chain")
    runs, calls = 300, 30
    out = tmp_path / "trace.txt"
    with open(out, "w") as f:
        res = run_ustack("trace", "--backend", "tracefs", "--unwind", "fp",
                         f"uprobe:{prog}:d", "--buffer-pages", "1", "-c",
                         f"sh -c 'for i in $(seq {runs}); do {prog} {calls}; done'",
                         stdout=f, timeout=120)
    assert res.returncode == 0, res.stderr
    m = re.search(r"^Lost (\d+) events: the tracefs buffer was full", res.stderr, re.M)
    assert m, res.stderr
    printed = sum(1 for line in out.read_text().splitlines()
                  if line.startswith("chain "))
    assert printed + int(m.group(1)) == runs * calls, res.stderr


def test_name_of_an_exited_process_from_ftrace():
    """A process already gone from /proc when its stacks are named keeps its
    name: ftrace saved it (saved_cmdlines) when it recorded its event."""
    from ustack.target.mappings import MappingTracker
    prog = build("chain")
    res = ok(run_ustack("trace", "--backend", "tracefs", "--unwind", "fp",
                        f"uprobe:{prog}:d", "-c", f"{prog} 1"))
    (record,) = parse_trace(res.stdout)
    pid = record["pid"]
    assert record["comm"] == "chain"
    assert not Path(f"/proc/{pid}").exists()     # ustack reaped it
    assert MappingTracker().comm(pid, pid) == "chain"


# --- what a tracefs uprobe reaches ------------------------------------------------

LIBC = "/lib/x86_64-linux-gnu/libc.so.6"


def test_header_says_tracefs_uprobes_fire_in_every_process_mapping_the_file(chain):
    res = ok(run_ustack("count", "--backend", "tracefs", f"uprobe:{chain}:d",
                        "uprobe:libc:writ[e]", "-c", f"{chain} 2 write", "-a"))
    header = res.stderr.splitlines()[0]
    libc = os.path.realpath(LIBC)
    assert header.endswith(f"; its uprobes fire in every process that maps "
                           f"{chain}, {libc}]... Hit Ctrl-C to end."), header


@pytest.mark.parametrize("target", ["-c", "-p"])
def test_a_glob_over_a_library_is_refused_without_a(chain, target):
    proc = None
    if target == "-c":
        where, who = ["-c", f"{chain} 2 write"], "the -c command"
    else:
        proc = spawn(chain, 10 ** 12)
        where, who = ["-p", str(proc.pid)], f"PID {proc.pid}"
    try:
        msg = fail_one_line(run_ustack("count", "--backend", "tracefs",
                                       "uprobe:libc:str*", *where))
    finally:
        if proc is not None:
            stop(proc)
    assert msg == (f"ustack: uprobe:libc:str*: on the tracefs backend its uprobes fire "
                   f"in every process that maps {os.path.realpath(LIBC)}, not only in "
                   f"{who}; add -a to accept that, or use --backend perf or bpf")


def test_a_glob_over_a_library_runs_with_a_and_counts_the_target_only(chain):
    res = ok(run_ustack("count", "--backend", "tracefs", "--every-process",
                        "uprobe:libc:writ[e]", "-c", f"{chain} 5 write"))
    assert [s["count"] for s in parse_counts(res.stdout)] == [5]


def test_a_glob_over_the_program_itself_needs_no_a(chain):
    res = ok(run_ustack("count", "--backend", "tracefs", f"uprobe:{chain}:[d]",
                        "-c", f"{chain} 3"))
    assert [s["count"] for s in parse_counts(res.stdout)] == [3]


# --- how much stack a tracefs uprobe copies ----------------------------------------

TRACEFS_LIMIT = 3048    # 3072 bytes of fields (MAX_PROBE_EVENT_SIZE) less %ip, %sp, %bp
AT_LIMIT = ("stack copy too small (3048 bytes): the stack was cut short; that is "
            "the kernel's per-event limit for a tracefs uprobe: --backend perf or "
            "bpf copy deeper stacks")


def _deep_leaf(backend: str, size: int) -> dict:
    """recurse 60: ~6 KiB of stack under leaf, more than a tracefs uprobe
    can copy; the trace's one stack and its header."""
    from helpers import RECURSE_FLAGS
    prog = build("recurse", flags=RECURSE_FLAGS)
    res = ok(run_ustack("trace", "--backend", backend, "--unwind", "dwarf",
                        "--stack-size", size, f"uprobe:{prog}:leaf", "-c", f"{prog} 60"))
    (rec,) = parse_trace(res.stdout)
    rec["header"] = res.stderr.splitlines()[0]
    return rec


def test_uprobe_copies_up_to_the_kernel_limit_and_says_so():
    """The whole 3048 bytes the kernel allows (not 5 arrays of 64 words):
    the frames perf gives from a copy of that size; the note names the
    limit instead of advising a --stack-size that cannot help."""
    got, want = _deep_leaf("tracefs", 8192), _deep_leaf("perf", TRACEFS_LIMIT)
    assert named(got) == named(want) and len(got["frames"]) > 30
    assert got["notes"] == [AT_LIMIT]
    assert ("uprobes: DWARF on 3048 stack bytes per event (the kernel's per-event "
            "limit for a tracefs uprobe)") in got["header"]


def test_a_smaller_stack_size_is_honoured():
    got, want = _deep_leaf("tracefs", 1000), _deep_leaf("perf", 1000)
    assert named(got) == named(want)
    assert got["notes"] == want["notes"] == [
        "stack copy too small (1000 bytes): the stack was cut short; raise --stack-size"]
    assert "uprobes: DWARF on 1000 stack bytes per event;" in got["header"]


# --- ftrace's userstacktrace keeps 8 frames ------------------------------------------

FTRACE_CUT = ("stack cut at ftrace's 8-frame limit (userstacktrace): "
              "--backend bpf or perf give the whole stack")


def test_userstacktrace_cut_at_8_frames_says_so():
    """recurse 20 (frame pointers): leaf under 20 rec frames. ftrace's walk
    keeps the first 8 and the stack says it was cut there."""
    prog = build("recurse")
    (rec,) = trace("tracefs", "--unwind", "fp", f"uprobe:{prog}:leaf", "-c", f"{prog} 20")
    (whole,) = trace("perf", "--unwind", "fp", f"uprobe:{prog}:leaf", "-c", f"{prog} 20")
    names = funcs(rec["frames"])
    assert names[0] == "leaf" and set(names[1:]) == {"rec"} and len(names) >= 8
    assert names == funcs(whole["frames"])[:len(names)] and len(whole["frames"]) > 20
    assert rec["notes"] == [FTRACE_CUT]


def test_go_syscall_stack_cut_at_8_frames_says_so():
    prog = build_go("gochain")
    (rec,) = trace("tracefs", "syscall:write", "-c", quiet(prog, 1, "write"))
    assert len(rec["frames"]) == 8 and rec["notes"] == [FTRACE_CUT]


def test_a_stack_under_8_frames_has_no_note(chain):
    (rec,) = trace("tracefs", "syscall:write", "-c", f"{chain} 1 rawwrite")
    assert funcs(rec["frames"])[:5] == ["d", "c", "b", "a", "main"]
    assert len(rec["frames"]) < 8 and rec["notes"] == []


# --- maps that appear during the run: ftrace has no mmap records ---------------------

def test_library_dlopened_after_attach_is_named(tmp_path):
    """-p, then the target dlopen()s plugin.so and calls into it 3 times
    and waits: ustack, ended then, reads its maps when it reads those
    events, so the recording names the plugin after the target is gone
    (frame pointers: nothing else looks the addresses up while it lives)."""
    from helpers import PLUGIN_CHAIN
    prog = build("dlopen_main")
    plugin = private_copy(build("plugin", kind="shared"), tmp_path)  # its hits are ours
    data = tmp_path / "run.data"
    target = spawn(prog, "-", plugin, 3, "-", stdin=subprocess.PIPE)
    try:
        us = start_ustack("record", "--backend", "tracefs", "--unwind", "fp",
                          f"uprobe:{plugin}:plugin_leaf", "-p", target.pid, "-o", data)
        try:
            wait_tracing(us)
            target.stdin.write(b"go\n")              # dlopen, 3 calls, then wait
            target.stdin.flush()
            wait_until(lambda: uprobe_hits(plugin) >= 3, timeout=20,
                       what="3 calls of plugin_leaf")
            us.send_signal(signal.SIGINT)
            _out, err = finish(us)
            assert us.returncode == 0, err
        finally:
            stop(us)
    finally:
        stop(target)
    res = run_ustack("report", "--as", "count", data)
    assert res.returncode == 0, res.stderr
    assert [(s["frames"][:4], s["count"]) for s in parse_counts(res.stdout)] == \
        [(PLUGIN_CHAIN, 3)], res.stdout


NO_MAPS = ("no memory map of this process was seen: it exited before ustack "
           "could read it (--backend perf or bpf record every mapping)")


def test_system_wide_short_process_named_or_marked(chain, tmp_path):
    """Whole machine, a process started during the run that exits at once:
    ustack reads its maps when it reads its first event, if it still runs;
    a stack it could not name says why instead of bare [unknown] frames."""
    prog = private_copy(chain, tmp_path)          # its uprobe fires in our runs only
    us = start_ustack("count", "--backend", "tracefs", "--unwind", "fp",
                      f"uprobe:{prog}:d", stdout=subprocess.PIPE)
    try:
        wait_tracing(us)
        for _ in range(3):
            subprocess.run([str(prog), "1"], check=True)
        wait_until(lambda: uprobe_hits(prog) >= 3, timeout=20, what="3 calls of d")
        us.send_signal(signal.SIGINT)
        out, err = finish(us)
    finally:
        stop(us)
    assert us.returncode == 0, err
    stacks = parse_counts(out)
    assert sum(s["count"] for s in stacks) == 3, out
    for s in stacks:                 # a note prints as a "(…)" line after the frames
        names = [f for f, _m in s["frames"] if not f.startswith("(")]
        notes = [f[1:-1] for f, _m in s["frames"] if f.startswith("(")]
        assert names[:5] == ["d", "c", "b", "a", "main"] or (
            notes == [NO_MAPS] and set(names) == {"[unknown]"}), s


# --- a frame-pointer walk that ends short of the root says so ---------------------

@pytest.mark.parametrize("backend", ["tracefs", "perf"])
def test_frame_pointer_walk_cut_by_a_caller_without_them_is_marked(backend):
    """-O2 -fomit-frame-pointer: the walk from write ends inside libc, short
    of _start; the stack says so (and what unwinds it whole), never reads
    as a complete stack rooted at write."""
    prog = build("chain", flags=O2_NOFP)
    res = ok(run_ustack("count", "--backend", backend, "--unwind", "fp", "syscall:write",
                        "-c", f"{prog} 3 rawwrite"))
    stacks = parse_counts(res.stdout)
    assert sum(s["count"] for s in stacks) == 3, res.stdout
    for s in stacks:
        notes = [f for f, m in s["frames"] if m is None and f.startswith("(stack cut at")]
        assert len(notes) == 1, s
        assert "the frame-pointer walk ends there, short of the program's entry" in notes[0]
        advice = ("--backend bpf or perf unwind with CFI" if backend == "tracefs"
                  else "--unwind dwarf unwinds with CFI")
        assert notes[0].endswith(advice + ")"), notes[0]


def test_frame_pointer_walk_to_the_root_has_no_mark(chain):
    """A program with frame pointers: the walk reaches libc's
    __libc_start_call_main, the root of a frame-pointer stack: no note."""
    res = ok(run_ustack("count", "--backend", "perf", "--unwind", "fp", "syscall:write",
                        "-c", f"{chain} 3 rawwrite"))
    (s,) = parse_counts(res.stdout)
    assert s["frames"][-1] == ("__libc_start_call_main", "libc.so.6"), s
    assert not [f for f, m in s["frames"] if m is None], s


def test_a_command_that_signals_itself_runs_at_its_own_pace():
    """Under tracefs the command is traced (ptrace holds it at exec and at
    exit), so each signal it gets stops it until ustack passes the signal
    on: 3,000 self-signals all reach its handler, and the run ends (a stop
    held until the run's next poll made this take minutes; 60 s is only
    the test's guard against a hang)."""
    prog = build("selfsignal", flags=FP)
    res = ok(run_ustack("count", "--backend", "tracefs", "syscall:write",
                        "-c", f"{prog} 3000", timeout=60))
    lines = res.stdout.splitlines()
    assert lines[0] == "3000", res.stdout              # the program's own output first
    assert sum(s["count"] for s in parse_counts("\n".join(lines[1:]))) == 1, res.stdout


def test_a_command_gets_its_own_sigtrap():
    """The tracer's exec and exit stops are event stops of their own: a
    SIGTRAP the program sends itself is the program's, delivered to its
    handler every time, not taken for the tracer's."""
    prog = build("selfsignal", flags=FP)
    res = ok(run_ustack("count", "--backend", "tracefs", "syscall:write",
                        "-c", f"{prog} 5 trap"))
    assert res.stdout.splitlines()[0] == "5", res.stdout
