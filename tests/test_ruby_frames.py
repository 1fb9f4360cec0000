"""A Ruby script's frames where its VM calls ran (bpf/ruby.h,
symbols/ruby.py): calls.rb's <main> -> a -> block in a -> b -> c, c
spinning, is the oracle of the chain; methods are named with their class
as Ruby 3.4's backtraces name them (Object#a for a top-level def, Worker#c). Each sample of the busy script
must carry the chain in order with calls.rb's file and the line each
frame was at, at the place of the rb_vm_exec frames that ran it, down to
_start; --no-ruby leaves those C frames as walked."""
from __future__ import annotations

import json
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

import ustack
from helpers import (COPIED_STACKS, profile_copied,
                     cpu_seconds, finish, ok, parse_folded, run_for_cpu, run_ustack, start_ustack, stop,
                     wait_tracing, wait_until)

pytestmark = pytest.mark.kernel

CALLS = Path(__file__).parent / "programs" / "ruby" / "calls.rb"
CHAIN = ["<main>", "Object#a", "block in Object#a", "Object#b", "Worker#c"]
WARM_UP = ["<main>", "Object#b", "Worker#c"]      # calls.rb's b(w) before it says ready
# the lines each frame can be at: c's loop, b's call, the block's call, a's loop, <main>'s calls
# (a block entered but not yet at its first line is at the line it opens on,
# `loop do`, as Ruby's own backtrace says)
LINES = {"Worker#c": {7, 8, 9, 10, 11, 13}, "Object#b": {18}, "block in Object#a": {22, 23, 24},
         "Object#a": {22}, "<main>": {29, 32}}
# a copy's frames are read moments after the sample (~4 ms behind perf's):
# a method may be at its return by then, the line of its `end`
COPIED_LINES = dict(LINES, **{"Worker#c": LINES["Worker#c"] | {14},
                              "Object#b": LINES["Object#b"] | {19}})


def _ruby() -> str:
    ruby = shutil.which("ruby")
    if ruby is None:
        pytest.skip("ruby is not installed: no Ruby frames to show")
    return ruby


def _chain(frames) -> list:
    """calls.rb's frames, outermost first."""
    return [f.function for f in reversed(frames) if f.kind == "ruby" and f.file == str(CALLS)]


def _folded_chain(stack: list) -> list:
    """calls.rb's frames of a folded stack (outermost first), by name."""
    return [f.split(" (calls.rb:")[0] for f in stack if " (calls.rb:" in f]


@pytest.fixture(scope="module")
def profiled():
    """One profile of `ruby calls.rb` (2 s of CPU): its counted stacks."""
    ruby = _ruby()
    opts = ustack.Options(command="profile", events=["profile:hz:199"], backend="bpf",
                          cmdline=f"{ruby} {CALLS} 2")
    run = ustack.Session(opts)
    with run:
        counted = run.counts()
        warnings = run.warnings
    return counted, warnings


@pytest.fixture(scope="module")
def running_ruby():
    """calls.rb running already (for -p), its chain started."""
    ruby = _ruby()
    proc = subprocess.Popen([ruby, str(CALLS), "120"], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "ready\n"
        yield proc
    finally:
        stop(proc)


def test_command_shows_the_chain_in_order(profiled):
    counted, warnings = profiled
    samples = sum(c.count for c in counted)
    whole = sum(c.count for c in counted
                if _chain(c.stack.frames) == CHAIN and c.stack.frames[-1].function == "_start")
    assert samples >= 50, counted
    assert whole >= 0.9 * samples, f"{whole} of {samples} samples carry the chain to _start"
    lines = {(f.function, f.line) for c in counted for f in c.stack.frames
             if f.kind == "ruby" and f.file == str(CALLS)}
    assert lines <= {(n, line) for n, ls in LINES.items() for line in ls}, lines
    # every frame of the script's stacks named (start-up's throwaway iseqs,
    # freed before they were read, may be shown as [ruby 0x...]: never misnamed)
    unnamed = [c for c in counted if _chain(c.stack.frames)
               and any(f.kind == "ruby" and f.function.startswith("[ruby") for f in c.stack.frames)]
    assert not unnamed, (unnamed, warnings)


def test_ruby_frames_sit_where_the_vm_ran_them(profiled):
    """Each VM call's rb_vm_exec frame is replaced by its Ruby frames: the
    block's frames above the C frames of `loop` (rb_rescue2), a and
    <main> below them, ruby_run_node under <main>."""
    counted, _warnings = profiled
    best = max((c for c in counted if _chain(c.stack.frames) == CHAIN), key=lambda c: c.count)
    names = [f.function for f in best.stack.frames]
    assert "rb_vm_exec" not in names, names
    at = {n: names.index(n) for n in ("Worker#c", "Object#b", "block in Object#a", "rb_rescue2",
                                      "Object#a", "<main>", "ruby_run_node")}
    assert at["Worker#c"] < at["Object#b"] < at["block in Object#a"] < at["rb_rescue2"] < at["Object#a"] \
        < at["<main>"] < at["ruby_run_node"], names


def test_running_script_by_pid(running_ruby, tmp_path):
    out = tmp_path / "p.folded"
    ok(run_for_cpu(running_ruby.pid, "profile", "-F", "199", "-f", "folded", "-o", str(out)))
    rows = parse_folded(out.read_text())
    samples = sum(n for _stack, n in rows)
    whole = sum(n for stack, n in rows if _folded_chain(stack) == CHAIN)
    assert samples >= 20, rows
    assert whole >= 0.9 * samples, f"{whole} of {samples} samples carry the chain"


def test_no_ruby_shows_the_vm_calls_as_c_frames(running_ruby, tmp_path):
    out = tmp_path / "p.folded"
    ok(run_ustack("profile", "-F", "199", "-d", "1", "-f", "folded", "--no-ruby",
                  "-p", str(running_ruby.pid), "-o", str(out)))
    rows = parse_folded(out.read_text())
    assert rows
    assert not [stack for stack, _n in rows if _folded_chain(stack)], rows
    assert [stack for stack, _n in rows if "rb_vm_exec" in stack], rows


def test_ruby_started_during_a_whole_machine_run():
    """A ruby started once a whole-machine run samples has its chain from
    the samples the kernel walks: libruby is known by its object (its
    facts loaded with its rows), nothing is read of the process. Its
    samples before libruby's rows are loaded are unwound in user space,
    its VM calls left as C frames: they carry no calls.rb frame, and the
    share of those is measured in bench/results/ruby_frames.md."""
    ruby = _ruby()
    us = start_ustack("profile", "-F", "199", "-f", "json", stdout=subprocess.PIPE)
    try:
        wait_tracing(us, timeout=60)
        prog = subprocess.Popen([ruby, str(CALLS), "1"], stdout=subprocess.DEVNULL)
        assert prog.wait(timeout=60) == 0
        us.send_signal(signal.SIGINT)
        out, err = finish(us, 60)
    finally:
        stop(us)
    assert us.returncode == 0, err
    stacks = [s for s in json.loads(out)["stacks"] if s["pid"] == prog.pid]
    chains = [([f["function"] for f in reversed(s["frames"])
                if f.get("kind") == "ruby" and f.get("file") == str(CALLS)], s)
              for s in stacks]
    in_script = sum(s["count"] for chain, s in chains if chain)
    whole = sum(s["count"] for chain, s in chains
                if chain == CHAIN and s["frames"][-1]["function"] == "_start")
    assert in_script >= 50, [c for c, _s in chains][:10]
    assert whole >= 0.9 * in_script, f"{whole} of {in_script} samples in calls.rb whole"


def test_ruby_running_before_a_whole_machine_run(running_ruby, tmp_path):
    """A whole-machine run loads the rows of the interpreters running as it
    starts first (libruby, libc, ruby's executable), so a busy ruby's
    samples are walked in the kernel, with its chain, from the start; a
    second of its CPU time (a loaded machine's loader is slow: a short
    run's samples would otherwise go to user space, as C frames)."""
    out = tmp_path / "all.json"
    us = start_ustack("profile", "-F", "199", "-f", "json", "-o", out)
    try:
        wait_tracing(us, timeout=60)
        start = cpu_seconds(running_ruby.pid)
        wait_until(lambda: cpu_seconds(running_ruby.pid) - start >= 1.0, 300,
                   "a second of ruby's CPU time")
        us.send_signal(signal.SIGINT)
        _out, err = finish(us, 120)     # every process of the machine named
    finally:
        stop(us)
    assert us.returncode == 0, err
    stacks = [s for s in json.loads(out.read_text())["stacks"] if s["pid"] == running_ruby.pid]
    samples = sum(s["count"] for s in stacks)
    whole = sum(s["count"] for s in stacks
                if [f["function"] for f in reversed(s["frames"])
                    if f.get("kind") == "ruby" and f.get("file") == str(CALLS)] == CHAIN)
    assert samples >= 100, stacks[:5]
    assert whole >= 0.9 * samples, f"{whole} of {samples} samples carry the chain"


def test_reports_mark_ruby_frames():
    """Folded, the flame graphs and text name a Ruby frame by its method,
    file and line, as they do a Python frame, and give it its kind."""
    from ustack.model import Frame
    from ustack.report.flametree import KINDS, frame_kind, frame_name
    from ustack.report.folded import folded_name
    from ustack.report.text import frame_label
    f = Frame(addr=0, module="calls.rb", function="block in a", file="/x/calls.rb", line=23,
              kind="ruby")
    assert folded_name(f) == "block in a (calls.rb:23)"
    assert frame_name(f) == "block in a (calls.rb:23)"
    assert frame_kind(f) == "ruby" and "ruby" in KINDS
    assert frame_label(f) == "block in a [ruby] /x/calls.rb:23"


def test_methods_named_with_their_class():
    """A nested class's methods by its path, a singleton method with a
    dot, as Ruby 3.4's backtraces show them: <main> -> Outer::Inner.build
    -> Outer::Inner#run."""
    script = CALLS.parent / "classes.rb"
    opts = ustack.Options(command="profile", events=["profile:hz:199"], backend="bpf",
                          cmdline=f"{_ruby()} {script} 1")
    with ustack.Session(opts) as run:
        counted = run.counts()
    chains = [([f.function for f in reversed(c.stack.frames)
                if f.kind == "ruby" and f.file == str(script)], c.count) for c in counted]
    running = sum(n for chain, n in chains if chain)
    named = sum(n for chain, n in chains
                if chain == ["<main>", "Outer::Inner.build", "Outer::Inner#run"])
    assert running >= 50, chains
    assert named >= 0.9 * running, chains


@pytest.mark.parametrize("copied", COPIED_STACKS)
def test_stacks_unwound_by_ustack_carry_the_chain(tmp_path, copied):
    """A rows table too small for libruby's rows (--unwind-memory 1): the
    kernel hands every stack over unwalked; --backend perf: every sample
    is a copy. ustack reads the Ruby
    frames from the live process as it unwinds the copy, putting them
    where rb_vm_exec was, as the kernel's pass does. A frame read while
    the script was elsewhere than at the sample is never shown: each
    stack's calls.rb frames are the chain or its start, in order (a part
    of it where the stack was cut short)."""
    rows = profile_copied(tmp_path, copied, f"{_ruby()} {CALLS} 1")
    samples = sum(n for _stack, n in rows)
    whole = [(stack, n) for stack, n in rows if _folded_chain(stack) == CHAIN]
    # the share read depends on when ustack's reader runs against the
    # script (89-94 % on a quiet machine, ~60 % at load average 15:
    # bench/results/script_frames_copied.md); the code before had none
    assert sum(n for _stack, n in whole) >= 0.25 * samples, rows
    for stack, _n in rows:
        chain = _folded_chain(stack)
        if chain == WARM_UP[:len(chain)]:
            continue            # sampled in the script's first call, before `ready`
        if stack[1] == "_start":
            assert chain == CHAIN[:len(chain)], stack
        else:                   # cut short (a deep C call): its outer frames are not there
            assert any(chain == CHAIN[i:i + len(chain)] for i in range(len(CHAIN))), stack
    stack = max(whole, key=lambda row: row[1])[0]
    assert stack[1] == "_start" and "rb_vm_exec" not in stack, stack
    at = {name: stack.index(next(f for f in stack if f.startswith(name + " (calls.rb:")))
          for name in CHAIN}
    assert stack.index("ruby_run_node") < at["<main>"] < at["Object#a"] \
        < stack.index("rb_rescue2") < at["block in Object#a"] < at["Object#b"] \
        < at["Worker#c"], stack
    lines = {(f.split(" (calls.rb:")[0], int(f.split(":")[-1].rstrip(")")))
             for stack, _n in whole for f in stack if " (calls.rb:" in f}
    assert lines <= {(n, line) for n, ls in COPIED_LINES.items() for line in ls}, lines


def test_copied_stacks_of_other_threads_carry_their_chain(tmp_path):
    """Every stack copied (--unwind-memory 1): each thread's Ruby frames
    are its own, found through the VM's thread list by the thread's id
    (the kernel reaches them through the thread's TLS, which user space
    does not see): the two threads beside the main one spin in
    `block in <main> -> Object#worker -> Object#spin`."""
    script = Path(__file__).parent / "programs" / "ruby" / "threads.rb"
    out = tmp_path / "threads.folded"
    ok(run_ustack("profile", "-F", "199", "--unwind-memory", "1", "--per-thread", "-f",
                  "folded", "-o", str(out), "-c", f"{_ruby()} {script} 0.5"))
    by_thread: dict = {}
    for stack, n in parse_folded(out.read_text()):
        pid, tid = stack[0].rsplit("-", 1)[1].split("/")
        chain = [f.split(" (threads.rb:")[0] for f in stack if " (threads.rb:" in f]
        if tid != pid:
            by_thread.setdefault(tid, []).append((chain, n))
    assert len(by_thread) == 2, by_thread.keys()
    for tid, rows in by_thread.items():
        samples = sum(n for _chain, n in rows)
        whole = sum(n for chain, n in rows
                    if chain == ["block (2 levels) in <main>", "Object#worker", "Object#spin"])
        assert samples >= 20, rows
        assert whole >= 0.25 * samples, (tid, rows)   # as above: 100 % on a quiet machine


def test_a_recording_keeps_the_ruby_frames(tmp_path):
    """record keeps each Ruby frame's names and line, read while ruby ran
    (a line is the frame's pc's): the report of the file shows the chain
    in order with each frame's line, down to _start."""
    rec = tmp_path / "calls.ustack"
    ok(run_ustack("record", "profile:hz:199", "-o", rec, "-c", f"{_ruby()} {CALLS} 1"))
    res = run_ustack("report", "-f", "folded", rec)
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    rows = parse_folded(res.stdout)
    in_c = [(stack, n) for stack, n in rows if "Worker#c" in _folded_chain(stack)]
    samples = sum(n for _stack, n in in_c)
    whole = sum(n for stack, n in in_c
                if _folded_chain(stack) == CHAIN and "_start" in stack
                and all(int(f.split(":")[-1].rstrip(")")) in LINES[f.split(" (calls.rb:")[0]]
                        for f in stack if " (calls.rb:" in f))
    assert samples >= 20, res.stdout[-2000:]
    assert whole >= 0.9 * samples, f"{whole} of {samples} samples in c() whole"
    # the VM's calls replaced by the Ruby frames they ran, but in start-up
    # (ruby_options: rubygems' requires) a sample in an object just loaded,
    # its rows not in yet, is copied, and its frames read moments later no
    # longer fit it: such a stack keeps its VM calls as C frames
    assert not [stack for stack, _n in parse_folded(res.stdout)
                if "rb_vm_exec" in stack and "ruby_options" not in stack], res.stdout[-2000:]
