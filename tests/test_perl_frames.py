"""Perl frames at their place in the native stack: the in-kernel walk
replaces the run loop's C frame (Perl_runops_standard) with the subs it
ran, read from the interpreter's context stack at the sample (bpf/perl.h),
named by what the kernel copied (symbols/perl.py). calls.pl's a() -> b() ->
Work::c() is the oracle: every sample in c() must show the chain in order,
with the sub's package, the file and each caller's line, down to _start."""
from __future__ import annotations

import json
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

import ustack
from ustack.model import Frame, Stack, StackCount
from ustack.report.folded import format_folded
from ustack.report.formats import ReportContext
from ustack.report.text import format_stack

from helpers import (COPIED_STACKS, profile_copied,
                     finish, ok, parse_folded, pprof, run_for_cpu, run_ustack, start_ustack, stop,
                     wait_tracing, write_report)

pytestmark = pytest.mark.kernel

CALLS = Path(__file__).parent / "programs" / "perl" / "calls.pl"
# (sub, line) outermost first: the main loop's line, then each caller's call
CHAIN = [("<main>", 37), ("main::a", 32), ("main::b", 30)]
C_LINES = {10, 11, 12}            # Work::c's body


def _perl() -> str:
    perl = shutil.which("perl")
    if perl is None:
        pytest.skip("perl is not installed: no Perl frames to merge")
    return perl


def _perl_frames(frames) -> list:
    """(function, line) of the Perl frames, outermost first."""
    return [(f.function, f.line) for f in reversed(frames) if f.kind == "perl"]


@pytest.fixture(scope="module")
def profiled():
    """One profile of `perl calls.pl` (-c): its counted stacks."""
    opts = ustack.Options(command="profile", events=["profile:hz:199"], backend="bpf",
                          cmdline=f"{_perl()} {CALLS} 1500")
    with ustack.Session(opts) as run:
        counted = run.counts()
    return counted


def test_the_chain_is_named_in_order_to_start(profiled):
    in_c = [c for c in profiled if "Work::c" in [f.function for f in c.stack.frames]]
    samples = sum(c.count for c in in_c)
    whole = sum(c.count for c in in_c
                if _perl_frames(c.stack.frames)[:3] == CHAIN
                and [n for n, _line in _perl_frames(c.stack.frames)] == [
                    "<main>", "main::a", "main::b", "Work::c"]
                and _perl_frames(c.stack.frames)[3][1] in C_LINES
                and c.stack.frames[-1].function == "_start")
    assert samples >= 20, profiled
    assert whole >= 0.9 * samples, f"{whole} of {samples} samples in c() whole"
    files = {f.file for c in in_c for f in c.stack.frames if f.kind == "perl"}
    assert files == {str(CALLS)}, files


def test_perl_frames_stand_where_the_run_loop_ran(profiled):
    """The run loop's C frame is replaced by the subs: perl_run under the
    main program's body, the op that ran (a pp_ function) above c()."""
    best = max((c for c in profiled if "Work::c" in [f.function for f in c.stack.frames]),
               key=lambda c: c.count)
    functions = [f.function for f in best.stack.frames]
    at = functions.index("Work::c")
    assert functions[at:at + 5] == ["Work::c", "main::b", "main::a", "<main>", "perl_run"], \
        functions
    assert "Perl_runops_standard" not in functions, functions


@pytest.fixture(scope="module")
def running_perl():
    """`perl calls.pl` running its chain until ended, once it said so."""
    proc = subprocess.Popen([_perl(), str(CALLS)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "ready\n"
    yield proc
    proc.kill()
    proc.wait()


def test_running_perl_by_pid(running_perl, tmp_path):
    """-p: a perl already running; folded frames carry file and line."""
    out = tmp_path / "p.folded"
    ok(run_for_cpu(running_perl.pid, "profile", "-F", "199", "-o", out))
    stacks = parse_folded(out.read_text())
    in_c = sum(n for stack, n in stacks if any(f.startswith("Work::c ") for f in stack))
    whole = sum(n for stack, n in stacks
                if "_start" in stack and stack[stack.index("perl_run") + 1:][:3] == [
                    "<main> (calls.pl:37)", "main::a (calls.pl:32)", "main::b (calls.pl:30)"]
                and any(f"Work::c (calls.pl:{line})" in stack for line in C_LINES))
    assert in_c >= 20, out.read_text()[-2000:]
    assert whole >= 0.9 * in_c, f"{whole} of {in_c}"


def test_no_perl_leaves_the_run_loop(running_perl, tmp_path):
    """--no-perl: the stacks as walked, the interpreter's C frames only."""
    out = tmp_path / "p.folded"
    ok(run_ustack("profile", "-F", "199", "-d", "1", "--no-perl",
                  "-p", str(running_perl.pid), "-o", out))
    text = out.read_text()
    assert "Work::c" not in text and "Perl_runops_standard" in text, text[-2000:]


def test_a_sort_block_runs_a_loop_of_its_own():
    """sort's block runs in a nested run loop (a stackinfo of its own):
    weigh() stands above pp_sort, under d() and its callers."""
    opts = ustack.Options(command="profile", events=["profile:hz:199"], backend="bpf",
                          cmdline=f"{_perl()} {CALLS} 2000 sort")
    with ustack.Session(opts) as run:
        counted = run.counts()
    in_weigh = [c for c in counted if "Work::weigh" in [f.function for f in c.stack.frames]]
    samples = sum(c.count for c in in_weigh)
    whole = 0
    for c in in_weigh:
        functions = [f.function for f in reversed(c.stack.frames)]
        perl = [n for n, _line in _perl_frames(c.stack.frames)]
        if perl == ["<main>", "main::a", "main::b", "Work::d", "Work::weigh"] \
                and functions.index("Perl_pp_sort") == functions.index("Work::d") + 1:
            whole += c.count
    assert samples >= 20, counted
    assert whole >= 0.9 * samples, f"{whole} of {samples} samples in weigh() whole"


def test_perl_started_during_a_whole_machine_run():
    """A whole-machine run: a perl started once ustack says it samples has
    its chain from its first samples the kernel walks. Perl is known by its
    object (its facts loaded with its rows, which the walk wants), not by
    the process; a stack ustack unwinds itself (before those rows load)
    keeps the run loop's C frame."""
    perl = _perl()
    us = start_ustack("profile", "-F", "199", "-f", "json", stdout=subprocess.PIPE)
    try:
        wait_tracing(us, timeout=60)
        # ~1.7 s of perl's CPU here: its rows are loaded as it is sampled,
        # after other processes' objects on a busy machine (1,500 chains
        # took 0.5 s, and a CI run's perl ended before they were in)
        prog = subprocess.Popen([perl, str(CALLS), "5000"], stdout=subprocess.DEVNULL)
        assert prog.wait(timeout=60) == 0
        us.send_signal(signal.SIGINT)
        out, err = finish(us, 60)
    finally:
        stop(us)
    assert us.returncode == 0, err
    stacks = [s for s in json.loads(out)["stacks"] if s["pid"] == prog.pid]
    in_c = [s for s in stacks if "Work::c" in [f["function"] for f in s["frames"]]]
    samples = sum(s["count"] for s in in_c)
    whole = sum(s["count"] for s in in_c
                if [(f["function"], f["line"]) for f in reversed(s["frames"])
                    if f["kind"] == "perl"][:3] == CHAIN
                and s["frames"][-1]["function"] == "_start")
    assert samples >= 20, [s["frames"][:6] for s in stacks[:5]]
    assert whole >= 0.9 * samples, f"{whole} of {samples} samples in c() whole"


def test_a_recording_keeps_the_perl_frames(tmp_path):
    """record keeps each Perl frame's names, read while perl ran: the
    report of the file shows the chain in order, with each frame's line,
    where the run loop ran, down to _start."""
    rec = tmp_path / "calls.ustack"
    ok(run_ustack("record", "profile:hz:199", "-o", rec, "-c", f"{_perl()} {CALLS} 1500"))
    res = run_ustack("report", "-f", "folded", rec)
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    rows = parse_folded(res.stdout)
    in_c = [(stack, n) for stack, n in rows if any(f.startswith("Work::c (") for f in stack)]
    samples = sum(n for _stack, n in in_c)
    chain = [f"{name} (calls.pl:{line})" for name, line in CHAIN]
    c_frames = {f"Work::c (calls.pl:{line})" for line in C_LINES}
    whole = sum(n for stack, n in in_c
                if [f for f in stack if " (calls.pl:" in f][:3] == chain
                and [f for f in stack if " (calls.pl:" in f][3:] in [[c] for c in c_frames]
                and "_start" in stack)
    assert samples >= 20, res.stdout[-2000:]
    assert whole >= 0.9 * samples, f"{whole} of {samples} samples in c() whole"
    assert not [stack for stack, _n in parse_folded(res.stdout) if "Perl_runops_standard" in stack], \
        res.stdout[-2000:]


def test_a_required_file_runs_under_its_require():
    """A sub the top level of a required file calls stands under the sub
    that required it, at the require's line; each frame in its own file."""
    requires = CALLS.parent / "requires.pl"
    opts = ustack.Options(command="profile", events=["profile:hz:199"], backend="bpf",
                          cmdline=f"env SPIN_ROUNDS=600 {_perl()} {requires}")
    with ustack.Session(opts) as run:
        counted = run.counts()
    in_go = [c for c in counted if "Spin::go" in [f.function for f in c.stack.frames]]
    samples = sum(c.count for c in in_go)
    whole = sum(c.count for c in in_go
                if [(f.function, f.module, f.line) for f in reversed(c.stack.frames)
                    if f.kind == "perl"][:2] == [("<main>", "requires.pl", 12),
                                                 ("main::loader", "requires.pl", 9)]
                and [(f.function, f.module) for f in c.stack.frames
                     if f.kind == "perl"][0] == ("Spin::go", "Spin.pm"))
    assert samples >= 20, counted
    assert whole >= 0.9 * samples, f"{whole} of {samples} samples in go() whole"


def _pl(function, line):
    return Frame(addr=0, module="calls.pl", function=function, file="/srv/calls.pl",
                 line=line, kind="perl")


# innermost first: Work::c called by main::b, run by perl's run loop's caller
PERL_STACK = Stack((_pl("Work::c", 11), _pl("main::b", 30),
                    Frame(addr=0x401000, module="perl", function="perl_run", offset=0x10,
                          path="/usr/bin/perl")))


def test_reports_mark_perl_frames_as_python_frames(tmp_path):
    """text: `sub [perl] file:line` with no address; folded: `sub
    (file:LINE)`; pprof: a location of no mapping, named pl::sub:file."""
    assert format_stack(PERL_STACK).splitlines()[:2] == [
        "                    : Work::c [perl] /srv/calls.pl:11",
        "                    : main::b [perl] /srv/calls.pl:30"]
    assert format_folded([StackCount("perl", 7, PERL_STACK, 5)]) == \
        "perl;perl_run;main::b (calls.pl:30);Work::c (calls.pl:11) 5\n"
    path = write_report("pprof", [StackCount("perl", 7, PERL_STACK, 5)],
                        tmp_path / "pl.pb.gz", ReportContext(command="count",
                                                              events=("profile:hz:99",)))
    locations = pprof("-raw", path).split("\nLocations\n")[1].split("\nMappings\n")[0]
    assert [ln.split(": ", 1)[1] for ln in locations.splitlines()[:2]] == [
        "0x0 Work::c /srv/calls.pl:11 s=0(pl::Work::c:/srv/calls.pl)",
        "0x0 main::b /srv/calls.pl:30 s=0(pl::main::b:/srv/calls.pl)"]


@pytest.mark.parametrize("copied", COPIED_STACKS)
def test_stacks_unwound_by_ustack_carry_the_chain(tmp_path, copied):
    """A rows table too small for perl's rows (--unwind-memory 1): the
    kernel hands every stack over unwalked; --backend perf: every sample
    is a copy. ustack reads the Perl
    frames from the live process as it unwinds the copy, putting them
    where the run loop was, with their lines, down to _start."""
    rows = profile_copied(tmp_path, copied, f"{_perl()} {CALLS} 1500")
    in_c = [(stack, n) for stack, n in rows if any(f.startswith("Work::c ") for f in stack)]
    samples = sum(n for _stack, n in in_c)
    expected = [f"{name} (calls.pl:{line})" for name, line in CHAIN]
    whole = sum(n for stack, n in in_c
                if [f for f in stack if " (calls.pl:" in f][:3] == expected
                and stack[1] == "_start" and "Perl_runops_standard" not in stack
                and int(stack[-1 - stack[::-1].index(next(
                    f for f in reversed(stack) if f.startswith("Work::c ")))]
                        .split(":")[-1].rstrip(")")) in C_LINES)
    assert samples >= 20, rows
    assert whole >= 0.9 * samples, f"{whole} of {samples} samples in c() whole"


THREADS = Path(__file__).parent / "programs" / "perl" / "threads.pl"
# each ithread's chain, outermost first: its interpreter's main body at
# the threads->create line, then a() at its call of b(), b() at Work::c()'s
THREAD_CHAIN = ["<main> (threads.pl:31)", "main::a (threads.pl:24)",
                "main::b (threads.pl:19)"]


@pytest.mark.parametrize("copied", COPIED_STACKS)
def test_copied_stacks_of_ithreads_carry_their_chain(tmp_path, copied):
    """Two ithreads (`use threads`) busy in a() -> b() -> Work::c() while
    the main thread waits to join them: each runs an interpreter of its
    own, found in its thread block, so the stacks ustack unwinds itself
    carry the chain where the run loop was, down to the thread's root."""
    rows = profile_copied(tmp_path, copied, f"{_perl()} {THREADS} 600")
    in_c = [(stack, n) for stack, n in rows
            if "start_thread" in stack and any(f.startswith("Work::c ") for f in stack)
            or "start_thread" in stack and "Perl_runops_standard" in stack]
    samples = sum(n for _stack, n in in_c)
    whole = sum(n for stack, n in in_c
                if stack[1:3] == ["clone3", "start_thread"]
                and [f for f in stack if " (threads.pl:" in f] in (
                    THREAD_CHAIN + [f"Work::c (threads.pl:{line})"] for line in (12, 13, 14)))
    assert samples >= 20, rows
    assert whole >= 0.9 * samples, f"{whole} of {samples} ithread samples in c() whole"
