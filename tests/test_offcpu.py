"""`ustack offcpu`: where threads block, weighted by their time off the
CPU, summed in the kernel at sched_switch with complete user stacks
(DWARF in the kernel, through Debian's libc that has no frame pointers).

The target (programs/offcpu.c, built -O2 -fomit-frame-pointer) blocks
ROUNDS times for BLOCK_MS in each of nanosleep, a pipe read, a condition
variable and a mutex another thread holds, and prints how long each kind
of call took, measured around the calls: ustack's totals per stack must
agree within 5 %."""
from __future__ import annotations

import json
import re
import signal
import subprocess

import pytest
from browser import chromium  # noqa: F401 (fixture)

from helpers import (O2_NOFP, build, counted as fg_counted, element, fail_one_line,
                     finish, ok, one, open_page, point_at, raw, release, run_ustack,
                     start_ustack, stop, top, wait_tracing, write)
from ustack.report.formats import ReportContext, stack_report

# off-CPU totals are checked against the program's own clock within 5 %:
# a parallel worker's load delays wake-ups, so the file runs alone (.ci/run)
pytestmark = [pytest.mark.kernel, pytest.mark.alone]

ROUNDS, BLOCK_MS = 5, 40
START = ["main", "__libc_start_call_main", "__libc_start_main", "_start"]
# each kind of block: its function, and the libc call it blocks in
KINDS = {"sleep": ("sleeper_fn", "nanosleep"), "pipe": ("pipe_reader_fn", "read"),
         "cond": ("cond_waiter_fn", "pthread_cond_wait"),
         "mutex": ("mutex_waiter_fn", "pthread_mutex_lock")}


@pytest.fixture(scope="module")
def prog():
    return build("offcpu", flags=O2_NOFP)


def run_on_target(prog, *args) -> tuple:
    """`ustack offcpu ARGS -p TARGET` on the target released once ustack
    traces: (ustack's CompletedProcess, the target's own times in ms)."""
    target = subprocess.Popen([str(prog), "-", str(ROUNDS), str(BLOCK_MS)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        us = start_ustack("offcpu", *args, "-p", target.pid, stdout=subprocess.PIPE)
        try:
            header = wait_tracing(us)
            release(target)
            out, err = finish(us, timeout=60)
            err = header + err
        finally:
            stop(us)
        measured = target.stdout.read()
        assert target.wait(timeout=10) == 0
    finally:
        stop(target)
    times = {k: float(v) for k, v in (line.split() for line in measured.decode().splitlines())}
    return ok(subprocess.CompletedProcess(us.args, us.returncode, out, err)), times


def functions(stack: dict) -> list:
    return [f["function"] for f in stack["frames"]]



def test_blocked_time_per_stack_through_libc(prog):
    res, times = run_on_target(prog, "-f", "json")
    doc = json.loads(res.stdout)
    assert doc["command"] == "offcpu" and doc["unit"] == "nanoseconds", doc
    stacks = doc["stacks"]
    assert {s["pid"] for s in stacks} == {stacks[0]["pid"]}
    for kind, (function, call) in KINDS.items():
        under = [s for s in stacks if function in functions(s)]
        total_ms = sum(s["value"] for s in under) / 1e6
        # (on failure: the stacks under none of the four functions, where a
        # missing block's time would be)
        assert abs(total_ms - times[kind]) <= 0.05 * times[kind], \
            (kind, total_ms, times,
             [(s["value"], s["tid"] if "tid" in s else None, functions(s), s["notes"])
              for s in stacks if not any(f in functions(s) for f, _c in KINDS.values())])
        # the stack that holds most of the time, complete from libc to _start
        main = max(under, key=lambda s: s["value"])
        names = functions(main)
        at = names.index(function)
        assert names[at:] == [function] + START, names
        assert names[at - 1] == call and main["frames"][0]["module"] == "libc.so.6", names
        assert main["notes"] == [], main
    sleep = max((s for s in stacks if "sleeper_fn" in functions(s)), key=lambda s: s["value"])
    assert functions(sleep) == ["clock_nanosleep", "nanosleep", "sleeper_fn"] + START


NAPS, NAP_MS, FRESH = 5, 20, 20


def test_first_blocks_whole_in_fresh_processes(tmp_path):
    """FRESH processes, started one after another under one run, each nap
    NAPS times (programs/naps.c): a fresh process's first blocks meet
    regions of its memory map the walk has not seen yet, which the
    kernel's find_vma answers only once per switch (interrupts are off
    there). Every block of every one of them is whole to _start, no note;
    each process's sleeping time (--state S: a preemption on a loaded
    machine is the R state's) is at least its naps' and at most what it
    measured around them."""
    naps = build("naps", flags=O2_NOFP)
    out = tmp_path / "offcpu.json"
    loop = "; ".join([f"{naps} 0 {NAPS} {NAP_MS}"] * FRESH)
    res = ok(run_ustack("offcpu", "-P", "--state", "S", "-o", str(out),
                        "-c", f"sh -c '{loop}'"))
    measured = {int(pid): (int(n), float(ms)) for pid, n, ms in
                (line.split() for line in res.stdout.splitlines())}
    assert len(measured) == FRESH and {n for n, _ms in measured.values()} == {NAPS}, res.stdout
    stacks = json.loads(out.read_text())["stacks"]
    for pid, (_n, ms) in measured.items():
        mine = [s for s in stacks if s["pid"] == pid]
        cut = [(functions(s), s["notes"]) for s in mine
               if s["notes"] or functions(s)[-1] != "_start"]
        assert not cut, (pid, cut, res.stderr)
        napped = [s for s in mine if "nap_fn" in functions(s)]
        assert {tuple(functions(s)) for s in napped} == \
            {("clock_nanosleep", "nanosleep", "nap_fn", *START)}, (pid, napped)
        total_ms = sum(s["value"] for s in napped) / 1e6
        assert 0.99 * NAPS * NAP_MS <= total_ms <= ms + 1, (pid, total_ms, ms, mine)


def test_deep_blocks_whole_with_stack_size(tmp_path):
    """Naps under 200 frames (~22 KiB of stack): deeper than the in-kernel
    walk goes (128 frames) and than the default 8 KiB copy; with
    --stack-size 65528 each block's stack goes to ustack whole, first to
    last, and is unwound there to _start."""
    naps = build("naps", flags=O2_NOFP)
    out = tmp_path / "offcpu.json"
    res = ok(run_ustack("offcpu", "--state", "S", "--stack-size", "65528", "-o", str(out),
                        "-c", f"{naps} 0 3 {NAP_MS} 200"))
    (_pid, n, ms), = (line.split() for line in res.stdout.splitlines())
    napped = [s for s in json.loads(out.read_text())["stacks"] if "nap_fn" in functions(s)]
    assert [(functions(s), s["notes"]) for s in napped] == \
        [(["clock_nanosleep", "nanosleep", "nap_fn"] + ["deep"] * 200 + START, [])], \
        (res.stderr, [(functions(s)[-3:], s["notes"]) for s in napped])
    total_ms = sum(s["value"] for s in napped) / 1e6
    assert 0.99 * int(n) * NAP_MS <= total_ms <= float(ms) + 1, (total_ms, ms)


def test_a_commands_children_are_followed(prog, tmp_path):
    """-c 'sh -c PROG': the blocks are the shell's child's, which the
    in-kernel programs follow (a set of the traced processes that grows
    at each fork), as perf's inherited events would."""
    out = tmp_path / "offcpu.json"
    res = ok(run_ustack("offcpu", "-o", str(out), "-c",
                        f"sh -c '{prog} 0 {ROUNDS} {BLOCK_MS}'"))
    times = {k: float(v) for k, v in (line.split() for line in res.stdout.splitlines())}
    stacks = json.loads(out.read_text())["stacks"]
    for kind, (function, _call) in KINDS.items():
        total_ms = sum(s["value"] for s in stacks if function in functions(s)) / 1e6
        assert abs(total_ms - times[kind]) <= 0.05 * times[kind], \
            (kind, total_ms, times, [(s["value"], functions(s), s["notes"]) for s in stacks
                                     if not any(f in functions(s) for f, _c in KINDS.values())])


def test_text_shows_times(prog):
    res, times = run_on_target(prog, "--min-block", 20000)
    blocks = res.stdout.rstrip().split("\n\n")
    for block in blocks:            # every block of 20 ms or more, and only those
        *frames, value = block.splitlines()
        assert value.strip().endswith(" ms"), block
        assert float(value.split()[0]) >= 20, block
    sleeper = [b for b in blocks if "  sleeper_fn [offcpu]" in b.splitlines()]
    assert len(sleeper) == 1, res.stdout
    assert sleeper[0].splitlines()[:3] == ["  clock_nanosleep [libc.so.6]",
                                           "  nanosleep [libc.so.6]",
                                           "  sleeper_fn [offcpu]"]
    total = float(sleeper[0].splitlines()[-1].split()[0])
    assert abs(total - times["sleep"]) <= 0.05 * times["sleep"], (total, times)
    assert "warm_up" not in res.stdout       # its 1 ms sleeps are below 20 ms


def test_per_thread_splits_each_thread(prog):
    """-T: a block per thread, each naming its thread, as count -T does:
    the helper threads' sleeps apart from main's."""
    res, _times = run_on_target(prog, "-T", "--min-block", 20000)
    pid = None
    by_function = {}
    for block in res.stdout.rstrip().split("\n\n"):
        *frames, who, _value = block.splitlines()
        m = re.fullmatch(r"    (\S+) \[(\d+)\] tid (\d+)", who)
        assert m, block
        pid = pid or int(m.group(2))
        assert int(m.group(2)) == pid, block
        for f in frames:
            by_function.setdefault(f.split()[0], set()).add(int(m.group(3)))
    assert by_function["sleeper_fn"] == {pid}                  # main's own sleeps
    (writer,) = by_function["pipe_writer"]
    (signaller,) = by_function["cond_signaller"]
    assert len({pid, writer, signaller}) == 3, by_function


def test_wakers_pipe_and_condition_variable(prog):
    res, times = run_on_target(prog, "--wakers", "-f", "folded")
    lines = [line.rsplit(" ", 1) for line in res.stdout.splitlines()]
    folded = [(stack.split(";"), int(us)) for stack, us in lines]

    def woken(function: str) -> dict:
        """The waker parts (from the separator on) of the stacks through
        `function`, with their microseconds."""
        found: dict = {}
        for names, us in folded:
            if function in names and "[woken_by]" in names:
                part = tuple(names[names.index("[woken_by]") + 1:])
                found[part] = found.get(part, 0) + us
        return found

    pipe = woken("pipe_reader_fn")
    best = max(pipe, key=pipe.get)
    assert list(best) == ["write", "pipe_writer_fn", "pipe_writer", "start_thread",
                          "clone3", "pipe_writer"], pipe
    assert pipe[best] >= 0.9 * times["pipe"] * 1000, (pipe, times)
    cond = woken("cond_waiter_fn")
    best = max(cond, key=cond.get)
    assert list(best) == ["pthread_cond_signal", "cond_signal_fn", "cond_signaller",
                          "start_thread", "clone3", "cond_signal"], cond
    assert cond[best] >= 0.9 * times["cond"] * 1000, (cond, times)
    # the blocked part reads as without --wakers: from the root to the call
    sample = next(names for names, _us in folded
                  if "pipe_reader_fn" in names and "[woken_by]" in names)
    assert sample[:sample.index("[woken_by]")] == \
        ["offcpu"] + START[::-1] + ["pipe_reader_fn", "read"], sample
    # a timer's wakeup is no thread's doing
    sleep = woken("sleeper_fn")
    assert max(sleep, key=sleep.get) == ("[interrupt]",), sleep


def test_pprof_has_a_time_sample_type(prog, tmp_path):
    path = tmp_path / "offcpu.pb.gz"
    res, times = run_on_target(prog, "-o", path)
    profile = raw(path)
    assert profile["sample_types"] == ["offcpu/nanoseconds"], profile["sample_types"]
    rows = top(path)
    cum = pprof_ms(rows["sleeper_fn"][1])
    assert abs(cum - times["sleep"]) <= 0.05 * times["sleep"], (rows["sleeper_fn"], times)


def pprof_ms(text: str) -> float:
    """A time as `go tool pprof -top` prints it (`200.53ms`, `0.21s`), in ms."""
    m = re.fullmatch(r"([\d.]+)(ns|us|µs|ms|s)", text)
    assert m, text
    return float(m[1]) * {"ns": 1e-6, "us": 1e-3, "µs": 1e-3, "ms": 1, "s": 1e3}[m[2]]


def test_system_wide_leaves_out_ustack_and_idle(prog):
    """A whole-machine run counts a program that blocks while it runs (the
    target below; a quiet machine may have no other thread that blocks and
    wakes within the run) and never ustack itself or the idle task."""
    target = subprocess.Popen([str(prog), "-", "2", "10"],
                              stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    try:
        us = start_ustack("offcpu", "-f", "json", stdout=subprocess.PIPE)
        try:
            header = wait_tracing(us)
            release(target)
            assert target.wait(timeout=30) == 0
            us.send_signal(signal.SIGINT)
            out, err = finish(us, timeout=60)
        finally:
            stop(us)
    finally:
        stop(target)
    res = ok(subprocess.CompletedProcess(us.args, us.returncode, out, header + err))
    pids = {s["pid"] for s in json.loads(res.stdout)["stacks"]}
    assert target.pid in pids, (target.pid, pids, res.stderr)
    assert 0 not in pids and us.pid not in pids, pids


@pytest.mark.parametrize("args, message", [
    (["--min-block", "100", "--max-block", "10"],
     "--min-block 100 is above --max-block 10: no block could count"),
    (["--state", "Q"], "unknown --state 'Q'"),
    (["--max-block", "0"], "--max-block must be a positive number of microseconds"),
])
def test_bad_input_one_line(args, message, prog):
    res = run_ustack("offcpu", *args, "-c", f"{prog} 1")
    assert fail_one_line(res).startswith(f"ustack: {message}")


# --- the formats show time (no kernel needed) ---------------------------------------

OFFCPU = ReportContext(command="offcpu", events=("offcpu",), title="ustack offcpu",
                       value_unit="nanoseconds")
TIMED = [fg_counted("main", "left", "leaf", count=300_000_000),
         fg_counted("main", "right", "leaf", count=100_000_000)]


def rendered(fmt: str, tmp_path):
    report = stack_report(fmt, context=OFFCPU)
    for sc in TIMED:
        report.add(sc)
    path = tmp_path / f"off.{fmt}"
    with open(path, "wb" if getattr(report, "binary", False) else "w") as out:
        report.finish(out)
    return path


def test_counted_formats_show_time(tmp_path):
    assert rendered("text", tmp_path).read_text().split("\n\n")[0].splitlines() == \
        ["  leaf [prog]", "  right [prog]", "  main [prog]", "    100.000 ms"]
    assert rendered("folded", tmp_path).read_text() == \
        "prog;main;right;leaf 100000\nprog;main;left;leaf 300000\n"     # µs, as bcc's
    svg = rendered("svg", tmp_path).read_text()
    assert "<title>left (300.000 ms, 75.00%) [prog]</title>" in svg, svg
    speed = json.loads(rendered("speedscope", tmp_path).read_text())
    (profile,) = speed["profiles"]
    assert profile["unit"] == "nanoseconds" and sorted(profile["weights"]) == \
        [100_000_000, 300_000_000], profile
    doc = json.loads(rendered("json", tmp_path).read_text())
    assert doc["unit"] == "nanoseconds" and [s["value"] for s in doc["stacks"]] == \
        [300_000_000, 100_000_000], doc
    rows = top(rendered("pprof", tmp_path))
    assert rows["leaf"] == ("400ms", "400ms") and rows["left"][1] == "300ms", rows


def test_html_tooltip_shows_time(chromium, tmp_path):
    open_page(chromium, write(stack_report("html", context=OFFCPU), tmp_path / "off.html",
                              TIMED))
    point_at(chromium, one(chromium, "left"))
    assert element(chromium, "tooltip").text.splitlines()[-1] == "300.000 ms, 75.00%"


def test_python_api_counts_are_nanoseconds(prog):
    """Session.counts() of an offcpu run: StackCounts whose counts are the
    nanoseconds each stack spent off the CPU; the sleeps' add up to the
    time the target measured around them."""
    from ustack import Options, Session
    from ustack.commands.offcpu import offcpu_filter, offcpu_options
    target = subprocess.Popen([str(prog), "-", str(ROUNDS), str(BLOCK_MS)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        opts = offcpu_options(Options(pid=target.pid),
                              offcpu_filter(1000, None, ["S"], False))
        with Session(opts) as run:          # the probes are live from here
            release(target)
            counts = run.counts()           # to the target's exit
        measured = target.stdout.read().decode()
        assert target.wait(timeout=10) == 0
    finally:
        stop(target)
    times = {k: float(v) for k, v in (line.split() for line in measured.splitlines())}
    sleeps = [c for c in counts if any(f.function == "sleeper_fn" for f in c.stack.frames)]
    assert sleeps and all(c.event == "tracepoint:sched:sched_switch" for c in sleeps)
    total_ms = sum(c.count for c in sleeps) / 1e6
    assert abs(total_ms - times["sleep"]) <= 0.05 * times["sleep"], (total_ms, times, sleeps)


def test_state_filter_keeps_only_the_states_asked_for(prog):
    """--state as the tracepoint reports it, read from the raw one: the
    target's nanosleeps, pipe reads and condition waits are S (sleeping),
    so `--state D` leaves them all out and `--state S` keeps them."""
    def stacks_with(states: str) -> set:
        res = run_ustack("offcpu", "--state", states, "-f", "json", "-c", f"{prog} 0 2 20")
        names = set()
        # the target's four lines of times come first on the shared stdout
        for s in json.loads(ok(res).stdout.split("\n", 4)[-1])["stacks"]:
            names.update(functions(s))
        return names
    asleep = {"sleeper_fn", "pipe_reader_fn", "cond_waiter_fn"}
    assert asleep <= stacks_with("S")
    assert not asleep & stacks_with("D")
