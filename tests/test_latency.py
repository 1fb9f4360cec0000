"""ustack latency: entry-to-return histograms counted in the kernel, per
function and per calling stack; --slower's calls with their stacks; Go
functions timed through their RET instructions, paired per goroutine.

The durations (1.3/2.6/5.2/10.4 ms, 4.2/17 ms in Go) sit well inside
their log2-millisecond buckets, and the targets run SCHED_FIFO (`chrt -f
1`): on a loaded machine a normal task may wake late from a sleep, or be
preempted between its own clock and a probe; a real-time one is not. A
virtual machine may still stall even a real-time task for milliseconds
(a 1.3 ms call once took over 8 ms in CI), so the programs time their
calls themselves and write how many fell in each bucket: the program's
own buckets, which see such a stall too, are what ustack's histograms
must match."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from helpers import (O2_FP, O2_NOFP, build, build_cxx, build_go, disassembly, gdb_backtrace, ok,
                     parse_trace, run_attached, run_ustack, spawn, stop)

pytestmark = pytest.mark.kernel

TITLE = re.compile(r"^(\S+): count (\d+), min \S+, avg \S+, max \S+$")
BUCKET = re.compile(r"^(\[[^)]*\))\s+(\d+) \|[@ ]*\|$")
FRAME = re.compile(r"^  (\S+) \[(\S+)\]$")
LIBC_TAIL = ["main", "__libc_start_call_main", "__libc_start_main", "_start"]
FIFO = "chrt -f 1"


def parse_histograms(out: str) -> list[dict]:
    """[{event, count, stack: [function…], buckets: {label: n}}] in order."""
    hists = []
    for line in out.splitlines():
        if m := TITLE.match(line):
            hists.append({"event": m.group(1), "count": int(m.group(2)),
                          "stack": [], "buckets": {}})
        elif m := FRAME.match(line):
            hists[-1]["stack"].append(m.group(1))
        elif m := BUCKET.match(line):
            if int(m.group(2)):
                hists[-1]["buckets"][m.group(1)] = int(m.group(2))
        elif line:
            raise AssertionError(f"unexpected line {line!r} in:\n{out}")
    return hists


def added(*buckets: dict) -> dict:
    total: dict = {}
    for each in buckets:
        for label, n in each.items():
            total[label] = total.get(label, 0) + n
    return total


def measured(path: Path) -> dict:
    """The program's own buckets: {'[1ms, 2ms)': n, …} ('calls' left out)."""
    out = {}
    for line in path.read_text().splitlines():
        label, _, n = line.rpartition(" ")
        if label != "calls":
            out[label] = int(n)
    return out


@pytest.fixture(scope="module")
def prog() -> Path:
    return build("latency", flags=O2_NOFP)


def latency(*args) -> subprocess.CompletedProcess:
    res = ok(run_ustack("latency", "--units", "ms", *args))
    assert "had not returned" not in res.stderr and "Lost" not in res.stderr, res.stderr
    return res


@pytest.mark.parametrize("returns", ["uretprobe", "ret-sites"])
def test_function_histogram_exact(prog, tmp_path, returns):
    rounds, out = 3, tmp_path / "measured"
    extra = ("--ret-sites",) if returns == "ret-sites" else ()
    res = latency(f"uprobe:{prog}:nap", *extra, "-c", f"{FIFO} {prog} go naps {rounds} {out}")
    header = res.stderr.splitlines()[0]
    assert "[backend bpf, unwind none; returns: " in header
    assert ("uretprobe]" if returns == "uretprobe" else "uprobes on 1 RET instruction]") \
        in header
    (hist,) = parse_histograms(res.stdout)
    assert hist["event"] == f"uprobe:{prog}:nap" and hist["count"] == 4 * rounds
    assert hist["buckets"] == measured(out)


def test_recursion_pairs_each_return_with_its_entry(prog, tmp_path):
    """rec_nap(3) nests four calls of 10.4, 5.2, 2.6 and 1.3 ms: a stack of
    entry times per thread pairs each return with its own entry."""
    rounds, out = 3, tmp_path / "measured"
    for extra in ((), ("--ret-sites",)):
        res = latency(f"uprobe:{prog}:rec_nap", *extra,
                      "-c", f"{FIFO} {prog} go rec {rounds} {out}")
        (hist,) = parse_histograms(res.stdout)
        assert hist["count"] == 4 * rounds
        assert hist["buckets"] == measured(out), res.stdout


def test_syscall_latency_of_nanosleep(prog, tmp_path):
    """nap's one nanosleep is libc's clock_nanosleep(2): sys_enter to sys_exit."""
    rounds, out = 2, tmp_path / "measured"
    res = latency("syscall:clock_nanosleep", "-c", f"{FIFO} {prog} go naps {rounds} {out}")
    (hist,) = parse_histograms(res.stdout)
    assert hist["event"] == "syscall:clock_nanosleep" and hist["count"] == 4 * rounds
    assert hist["buckets"] == measured(out)


def test_a_named_syscall_never_called_shows_count_0(prog, tmp_path):
    """Each event named one by one gets its line, in the order given: one
    never called says count 0 instead of being left out."""
    res = latency("syscall:pivot_root", "syscall:clock_nanosleep",
                  "-c", f"{FIFO} {prog} go naps 1 {tmp_path / 'measured'}")
    lines = [line for line in res.stdout.splitlines() if ": count " in line]
    assert lines[0] == "syscall:pivot_root: count 0"
    assert lines[1].startswith("syscall:clock_nanosleep: count 4, ") and len(lines) == 2


def test_a_cxx_method_is_named_as_written_and_suggested(tmp_path):
    """shop::Counter::add, not _ZN4shop7Counter3addEiPKc, in the header and
    the histogram; a near miss suggests the name a user types."""
    cxx = build_cxx("args_cxx", O2_NOFP)
    res = latency(f"uprobe:{cxx}:shop::Counter::add", "-c", f"{cxx} 0 3")
    assert res.stderr.startswith(f"Tracing uprobe:{cxx}:shop::Counter::add in ")
    (hist,) = parse_histograms(res.stdout)
    assert (hist["event"], hist["count"]) == (f"uprobe:{cxx}:shop::Counter::add", 3)
    for typo in ("Counter::ad", "addd"):
        res = run_ustack("latency", f"uprobe:{cxx}:{typo}", "-c", f"{cxx} 0 3")
        assert (res.returncode, res.stdout) == (1, "")
        assert res.stderr == (f"ustack: no function '{typo}' in {cxx}; did you mean: "
                              "shop::Counter::add?\n")


def test_syscall_latency_follows_a_commands_children(prog, tmp_path):
    """-c 'sh -c …': the calls are the shell's two children's, which the
    in-kernel programs follow (the traced set grows at each fork)."""
    one, two = tmp_path / "one", tmp_path / "two"
    res = latency("syscall:clock_nanosleep", "-c",
                  f"sh -c '{FIFO} {prog} go naps 1 {one}; {FIFO} {prog} go naps 1 {two}'")
    (hist,) = parse_histograms(res.stdout)
    assert hist["count"] == 8
    assert hist["buckets"] == added(measured(one), measured(two))


def test_output_in_a_format_latency_does_not_write_is_refused(prog, tmp_path):
    """Histograms are text: `-o lat.html` would hold text under a page's name."""
    res = run_ustack("latency", f"uprobe:{prog}:nap", "-c", "true",
                     "-o", tmp_path / "lat.html")
    assert res.returncode == 1 and res.stdout == ""
    assert res.stderr == f"ustack: -o {tmp_path}/lat.html: latency writes text, not html\n"
    assert list(tmp_path.iterdir()) == []


def test_by_stack_splits_by_caller(prog, tmp_path):
    rounds, out = 2, tmp_path / "measured"
    res = latency(f"uprobe:{prog}:nap", "--by-stack",
                  "-c", f"{FIFO} {prog} go naps {rounds} {out}")
    assert "entry stacks unwound in the kernel" in res.stderr.splitlines()[0]
    hists = parse_histograms(res.stdout)
    # one histogram per stack (nap's two call sites in each caller merged)
    assert sorted((h["stack"], h["count"]) for h in hists) == [
        (["nap", "long_naps", *LIBC_TAIL], 2 * rounds),
        (["nap", "short_naps", *LIBC_TAIL], 2 * rounds)]
    by_caller = {h["stack"][1]: h["buckets"] for h in hists}
    assert added(*by_caller.values()) == measured(out)
    nominal = {"short_naps": {"[1ms, 2ms)": rounds, "[2ms, 4ms)": rounds},
               "long_naps": {"[4ms, 8ms)": rounds, "[8ms, 16ms)": rounds}}
    if measured(out) == added(*nominal.values()):     # no call was stalled
        assert by_caller == nominal


def test_by_stack_frame_pointers(tmp_path):
    """--unwind fp (what a kernel that refuses the DWARF program gets): the
    kernel walks frame pointers, ustack adds the caller the walk skips at
    an entry (the word at [sp]); Debian's libc has none, so the walk ends
    in __libc_start_call_main."""
    prog, out = build("latency", flags=O2_FP), tmp_path / "measured"
    res = latency(f"uprobe:{prog}:nap", "--by-stack", "--unwind", "fp",
                  "-c", f"{FIFO} {prog} go naps 1 {out}")
    assert "[backend bpf, unwind fp; returns: uprobes on 1 RET instruction]" in \
        res.stderr.splitlines()[0]
    hists = parse_histograms(res.stdout)
    tail = ["main", "__libc_start_call_main"]
    assert sorted((h["stack"], h["count"]) for h in hists) == [
        (["nap", "long_naps", *tail], 2), (["nap", "short_naps", *tail], 2)]
    # each call where the program's own clock put it (a nap stalled on a
    # loaded machine lands a bucket later, in both)
    by_caller = {h["stack"][1]: h["buckets"] for h in hists}
    assert added(*by_caller.values()) == measured(out)
    nominal = {"short_naps": {"[1ms, 2ms)": 1, "[2ms, 4ms)": 1},
               "long_naps": {"[4ms, 8ms)": 1, "[8ms, 16ms)": 1}}
    if measured(out) == added(*nominal.values()):     # no call was stalled
        assert by_caller == nominal


def test_slower_lists_exactly_the_slow_calls_with_their_stacks(prog, tmp_path):
    rounds, out = 2, tmp_path / "measured"
    res = latency(f"uprobe:{prog}:nap", "--slower", "4",
                  "-c", f"{FIFO} {prog} go naps {rounds} {out}")
    calls = parse_trace(res.stdout)
    slow = sum(n for label, n in measured(out).items()
               if int(label.split(",")[0].strip("[ms")) >= 4)
    assert len(calls) == slow == 2 * rounds         # the 5.2 and 10.4 ms naps
    for call in calls:
        assert re.fullmatch(rf"uprobe:{re.escape(str(prog))}:nap took [\d.]+ms",
                            call["label"]), call["label"]
        assert float(call["label"].split(" took ")[1][:-2]) >= 4
        names = [f["func"] for f in call["frames"]]
        assert names[0] == "nap" and names[1] in ("short_naps", "long_naps")
        assert names[2:] == LIBC_TAIL, names
    assert sum(c["frames"][1]["func"] == "long_naps" for c in calls) == 2 * rounds


def test_attached_by_pid(prog, tmp_path):
    """-p: the target waits on stdin until ustack's probes are live."""
    out = tmp_path / "measured"
    target = spawn(*FIFO.split(), prog, "-", "naps", 2, out, stdin=subprocess.PIPE)
    try:
        res = ok(run_attached(target, "latency", "--units", "ms", f"uprobe:{prog}:nap"))
        assert target.wait(timeout=10) == 0
    finally:
        stop(target)
    (hist,) = parse_histograms(res.stdout)
    assert hist["count"] == 8
    assert hist["buckets"] == measured(out)


def test_go_goroutines_whose_stacks_move(tmp_path):
    """main.work grows its goroutine's stack at its entry (runtime.morestack
    runs its start again) and by deep recursion, and sleeps (the goroutine
    may resume on another thread): timed through its RET instructions, keyed
    by goroutine, the program runs to its end with the right results (exit
    status 0), and every call is counted once, in the bucket the program
    measured."""
    gobin, out = build_go("golatency"), tmp_path / "measured"
    goroutines, calls = 4, 6
    res = latency(f"uprobe:{gobin}:main.work",
                  "-c", f"{FIFO} {gobin} {out} {goroutines} {calls}")
    assert "exited with status" not in res.stderr and "was killed by" not in res.stderr, \
        res.stderr
    assert "returns: uprobes on 1 RET instruction, paired per goroutine]" in \
        res.stderr.splitlines()[0]
    assert out.read_text().splitlines().count(f"calls {goroutines * calls}") == 1
    (hist,) = parse_histograms(res.stdout)
    assert hist["count"] == goroutines * calls
    assert hist["buckets"] == measured(out)


def test_go_by_stack(tmp_path):
    gobin, out = build_go("golatency"), tmp_path / "measured"
    res = latency(f"uprobe:{gobin}:main.work", "--by-stack", "-c",
                  f"{FIFO} {gobin} {out} 2 2")
    (hist,) = parse_histograms(res.stdout)
    assert hist["count"] == 4
    oracle = gdb_backtrace(gobin, [out, 1, 1], "main.work")     # gdb's, to goexit
    goexit = oracle.index("runtime.goexit")
    assert hist["stack"] == oracle[:goexit] + ["runtime.goexit.abi0"]


@pytest.mark.parametrize("args, error", [
    (("uprobe:{prog}:nap+0x4",),
     "latency times whole calls: give the function without +0x4: uprobe:{prog}:nap+0x4"),
    (("uprobe:{prog}:buckets",), "no function 'buckets' in {prog}"),
    (("uprobe:{prog}:nap", "--slower", "-1"),
     "--slower takes a duration in milliseconds, 0 or more"),
    (("profile:hz:99",), "latency measures functions (uprobe:PATH:FUNC) and syscalls "
                         "(syscall:NAME), not profile events: profile:hz:99"),
    (("uprobe:{prog}:nap n=%di",), "latency takes no fetch-args: uprobe:{prog}:nap n=%di"),
])
def test_errors(prog, args, error):
    res = run_ustack("latency", *(a.format(prog=prog) for a in args),
                     "-c", f"{prog} go naps 1 /dev/null")
    assert res.returncode == 1
    assert res.stderr == f"ustack: {error.format(prog=prog)}\n"
    assert res.stdout == ""


def test_tail_calls(prog, tmp_path):
    """tail_nap leaves long naps through `jmp nap`: a uretprobe still sees
    those calls end (nap's RET returns to tail_nap's caller); RET uprobes
    cannot, so those calls end at the jmp untimed, and the run says so."""
    rounds, out = 2, tmp_path / "measured"
    res = latency(f"uprobe:{prog}:tail_nap", "-c", f"{FIFO} {prog} go tail {rounds} {out}")
    (hist,) = parse_histograms(res.stdout)
    assert hist["count"] == 2 * rounds and hist["buckets"] == measured(out)
    res = latency(f"uprobe:{prog}:tail_nap", "--ret-sites",
                  "-c", f"{FIFO} {prog} go tail {rounds} {out}")
    (hist,) = parse_histograms(res.stdout)
    assert hist["count"] == rounds
    insns = disassembly(prog)["tail_nap"]
    jmp = next(a for a, text in insns if text.startswith("jmp")) - insns[0][0]
    notes = [line for line in res.stderr.splitlines() if line.startswith("ustack:")]
    assert notes == [
        f"ustack: tail_nap leaves through a tail call at +0x{jmp:x}: such calls end "
        "there untimed (the callee returns for it)",
        f"ustack: {rounds} calls of uprobe:{prog}:tail_nap left through a tail call "
        "and were not timed"]
