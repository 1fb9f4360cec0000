"""`ustack memleak`: allocations not freed, by stack, kept in the kernel.

The target (programs/leaky.c, built -O2 -fomit-frame-pointer: only the
in-kernel DWARF walk reaches main and _start through it and Debian's libc)
leaves known blocks from six call chains (malloc, calloc, realloc of a
malloc'd block, posix_memalign, mmap, a malloc that calls mmap itself) and
frees everything it allocates from a seventh (malloc, realloc,
posix_memalign, aligned_alloc, mmap and munmap): the report must hold
exactly the six leaking stacks with their bytes and block counts.
Other stacks in the report are libc's own (stdio's buffers): a test looks
only at the stacks through the program's own functions."""
from __future__ import annotations

import json
import re
import signal
import subprocess

import pytest

from helpers import (O2_NOFP, build, fail_one_line, finish, ok, parse_folded, pprof,
                     release, run_ustack, spawn, start_ustack, stop, ustack_lines,
                     wait_tracing, wait_until)

pytestmark = pytest.mark.kernel

ROUNDS = 5
START = ("main", "__libc_start_call_main", "__libc_start_main", "_start")
# leaky.c's leaking stacks, innermost (the allocator) first -> (bytes, blocks)
LEAKS = {
    ("malloc", "leak_inner", "leak_outer", *START): (ROUNDS * 1000, ROUNDS),
    ("calloc", "calloc_leak", *START): (ROUNDS * 3 * 100, ROUNDS),
    ("realloc", "realloc_leak", *START): (ROUNDS * 2000, ROUNDS),
    ("posix_memalign", "memalign_leak", *START): (ROUNDS * 512, ROUNDS),
    # one function under two names in glibc: both said, not the symbol table's pick
    ("aligned_alloc|memalign", "old_memalign_leak", *START): (ROUNDS * 320, ROUNDS),
    ("mmap", "mmap_leak", *START): (ROUNDS * 8192, ROUNDS),
    # malloc gets these from mmap: counted once, as malloc's
    ("malloc", "big_leak", *START): (ROUNDS * 200000, ROUNDS),
}
YOUNG = {("malloc", "young_leak", *START): (ROUNDS * 4444, ROUNDS)}
OWN = {"leak_inner", "leak_outer", "calloc_leak", "realloc_leak", "memalign_leak",
       "old_memalign_leak",
       "mmap_leak", "big_leak", "young_leak", "keep_inner", "keep_outer", "freed_ones"}

HEAD = re.compile(r"^\[\d\d:\d\d:\d\d\] Top (\d+) stacks with outstanding allocations:$")
ENTRY = re.compile(r"^\t(\d+) bytes in (\d+) allocations? from stack$")
FRAME = re.compile(r"^\t\t(\S+) \[(\S+)\]$")
TARGET_LINES = ("ready", "young")       # what leaky itself prints (-c: on our stdout)


@pytest.fixture(scope="module")
def prog():
    return build("leaky", flags=O2_NOFP)


def parse_reports(out: str) -> list[list[tuple]]:
    """Each printed report: [(frames, bytes, blocks)] in its order."""
    reports: list = []
    for line in out.splitlines():
        if line in TARGET_LINES or not line:     # (a blank line between reports)
            continue
        if HEAD.match(line):
            reports.append([])
        elif m := ENTRY.match(line):
            reports[-1].append(([], int(m.group(1)), int(m.group(2))))
        elif m := FRAME.match(line):
            reports[-1][-1][0].append(m.group(1))
        else:
            raise AssertionError(f"unexpected line {line!r} in:\n{out}")
    return [[(tuple(f), b, n) for f, b, n in r] for r in reports]


def own_stacks(report: list) -> dict:
    """The report's stacks through leaky's own functions: {frames: (bytes, blocks)}."""
    out = {}
    for frames, nbytes, blocks in report:
        if OWN & set(frames):
            assert frames not in out, f"{frames} printed twice"
            out[frames] = (nbytes, blocks)
    return out


def probes_gone(pid: int) -> None:
    """The run's probes are removed (by its detached closer: 20 probes)."""
    wait_until(lambda: not ustack_lines(pid), timeout=120,
               what=f"the probes of ustack {pid} removed")


def memleak(*args) -> subprocess.CompletedProcess:
    return ok(run_ustack("memleak", *args, stdin=subprocess.DEVNULL))


def test_command_exactly_the_leaking_stacks(prog):
    res = memleak("-c", f"{prog} go")
    (report,) = parse_reports(res.stdout)
    assert own_stacks(report) == LEAKS
    bytes_order = [b for _f, b, _n in report]
    assert bytes_order == sorted(bytes_order, reverse=True), "largest first"


def test_attached_by_pid_and_nothing_left(prog):
    """-p: the target waits on stdin until ustack's probes are live; when
    it exits, the run ends with its report and its probes are gone."""
    target = spawn(prog, "-", stdin=subprocess.PIPE)
    try:
        us = start_ustack("memleak", "-p", target.pid, stdout=subprocess.PIPE)
        try:
            header = wait_tracing(us)
            assert ustack_lines(us.pid), "no probes while tracing"
            release(target)
            out, err = finish(us)
        finally:
            stop(us)
        assert target.wait(timeout=10) == 0
    finally:
        stop(target)
    ok(subprocess.CompletedProcess(us.args, us.returncode, out, header + err))
    (report,) = parse_reports(out)
    assert own_stacks(report) == LEAKS
    probes_gone(us.pid)


def test_threads_allocating_together(prog):
    """Four threads, started together, each leak 1000 blocks and free 1000
    others, interleaved: entries and returns pair per thread."""
    res = memleak("-c", f"{prog} go threads")
    (report,) = parse_reports(res.stdout)
    ours = {frames: (b, n) for frames, b, n in report
            if {"thread_leak", "thread_keep"} & set(frames)}
    assert ours == {("malloc", "thread_leak", "thread_main", "start_thread", "clone3"):
                    (4 * 1000 * 48, 4 * 1000)}


def test_nothing_outstanding_is_an_empty_report():
    """Not 'no events were seen': every block may have been freed."""
    res = memleak("-c", "true")
    assert parse_reports(res.stdout) == [[]]
    assert len(res.stderr.splitlines()) == 1, res.stderr


def test_top_keeps_the_largest(prog):
    res = memleak("--top", "2", "-c", f"{prog} go")
    (report,) = parse_reports(res.stdout)
    heads = [m.group(1) for line in res.stdout.splitlines() if (m := HEAD.match(line))]
    assert heads == ["2"]
    assert len(report) == 2
    assert report[0][1] == max(b for b, _n in LEAKS.values())


def test_older_shows_only_blocks_that_old(prog):
    """leaky waits OLDER_MS after its first allocations (by its own clock)
    before it leaks from young_leak and exits: at the end of the run the
    first ones are at least that old, the young ones far younger."""
    res = memleak("--older", "3000", "-c", f"{prog} go 3500")
    (report,) = parse_reports(res.stdout)
    assert own_stacks(report) == LEAKS
    res = memleak("--older", "0", "-c", f"{prog} go 1")
    (report,) = parse_reports(res.stdout)
    assert own_stacks(report) == {**LEAKS, **YOUNG}


def test_interval_reports(prog):
    """-i: a report every interval while leaky waits, then the final one."""
    res = memleak("-i", "0.2", "-c", f"{prog} go 1500")
    reports = parse_reports(res.stdout)
    assert len(reports) >= 2
    assert own_stacks(reports[-1]) == {**LEAKS, **YOUNG}


def test_folded_and_json_weigh_bytes(prog, tmp_path):
    res = memleak("-f", "folded", "-c", f"{prog} go")
    lines = "".join(line for line in res.stdout.splitlines(keepends=True)
                    if line.rstrip("\n") not in TARGET_LINES)
    folded = {tuple(reversed(frames[1:])): n for frames, n in parse_folded(lines)
              if OWN & set(frames)}
    assert folded == {frames: b for frames, (b, _n) in LEAKS.items()}
    memleak("-o", tmp_path / "leaks.json", "-c", f"{prog} go")
    doc = json.loads((tmp_path / "leaks.json").read_text())
    assert doc["unit"] == "bytes"
    values = {tuple(f["function"] for f in s["frames"]): s["value"] for s in doc["stacks"]
              if OWN & {f["function"] for f in s["frames"]}}
    assert values == {frames: b for frames, (b, _n) in LEAKS.items()}


def test_pprof_is_a_heap_profile(prog, tmp_path):
    """pprof's inuse_space in bytes: each leaking function's cumulative
    bytes are its stack's."""
    memleak("-o", tmp_path / "leaks.pb.gz", "-c", f"{prog} go")
    text = pprof("-top", "-unit=B", "-nodefraction=0", tmp_path / "leaks.pb.gz")
    assert "\nType: inuse_space\n" in text
    cum = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) == 6 and fields[5] in OWN:
            cum[fields[5]] = fields[3]
    assert cum == {f: f"{b}B" for frames, (b, _n) in LEAKS.items()
                   for f in frames if f in OWN}


def test_ctrl_c_reports_and_leaves_nothing(prog):
    """A target still running (never released): Ctrl-C ends the run with
    its report, removes every probe, and the target lives on."""
    target = spawn(prog, "-", stdin=subprocess.PIPE)
    try:
        us = start_ustack("memleak", "-p", target.pid, stdout=subprocess.PIPE)
        try:
            wait_tracing(us)
            assert ustack_lines(us.pid), "no probes while tracing"
            us.send_signal(signal.SIGINT)
            out, err = finish(us)
        finally:
            stop(us)
        assert us.returncode == 0, err
        assert "Traceback" not in err, err
        assert len(parse_reports(out)) == 1
        probes_gone(us.pid)
        assert target.poll() is None, "the target died"
    finally:
        stop(target)


@pytest.mark.parametrize("args,error", [
    ((), "ustack: memleak traces one process: give -p PID or -c CMD"),
    (("-c", " "), "ustack: -c needs a command"),
    (("-p", "1,2"), "ustack: memleak traces one process: give one -p PID"),
    (("-c", "true", "--unwind", "fp"),
     "ustack: memleak unwinds with DWARF in the kernel; --unwind fp is not an option here"),
    (("-c", "true", "--top", "0"), "ustack: --top must be a positive number of stacks"),
    (("-c", "true", "-i", "1", "-f", "folded"),
     "ustack: -i prints text reports as the run goes; folded is written once, at the end"),
    (("-c", "true", "--older", "-1"), "ustack: --older takes an age in milliseconds, 0 or more"),
])
def test_errors(args, error):
    assert fail_one_line(run_ustack("memleak", *args)) == error


def test_refuses_what_has_no_libc_allocator():
    assert fail_one_line(run_ustack("memleak", "-c", "nosuchcmd")) == \
        "ustack: no such command: nosuchcmd"
    static = build("leaky", flags=("-O2", "-static"))
    assert fail_one_line(run_ustack("memleak", "-c", f"{static} go")) == \
        f"ustack: {static} does not load libc (a static program?): memleak traces " \
        "libc's allocator"
