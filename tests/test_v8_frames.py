"""Node with default flags (no perf map): the in-kernel walk names each JS
frame from node's heap (bpf/v8.h, symbols/v8.py), by the layout node's
v8dbg_* symbols give. calls.js's first() -> second() -> third() is the
oracle of the JS chain (each too large for TurboFan to inline, so each is
a frame): every sample in third() must show the three, in order, with
their script, down to _start; a frame's line is its function's first
(optimized code) or the one its bytecode was at (interpreted)."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

import ustack
from helpers import finish, ok, parse_folded, run_ustack, start_ustack, stop, wait_tracing

pytestmark = pytest.mark.kernel

CALLS = Path(__file__).parent / "programs" / "js" / "calls.js"
WAITS = Path(__file__).parent / "programs" / "js" / "waits.js"
# where calls.js defines them, and the line each calls the next on (third: its loop)
LINES = {"first": 17, "second": 11, "third": 5}
CALL_LINES = {"first": 20, "second": 13, "third": 7}


def _node() -> str:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed: no JS frames to name")
    return node


def _chain(frames) -> list:
    """calls.js's named functions among the frames, outermost first."""
    return [f.function for f in reversed(frames)
            if f.kind == "js" and f.file == str(CALLS) and f.function in LINES]


def _memory_open() -> list:
    """The /proc/PID/mem files this process holds open."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue                    # the listing's own descriptor
        if re.fullmatch(r"/proc/\d+/mem", target):
            found.append(target)
    return found


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    """One profile of `node calls.js` with default flags: its counted
    stacks, its warnings, and the process memory files open before it,
    while it ran and after it closed."""
    node = _node()
    opts = ustack.Options(command="profile", events=["profile:hz:199"], backend="bpf",
                          cmdline=f"{node} {CALLS} 2000")
    run = ustack.Session(opts)
    before = _memory_open()
    with run:
        counted = run.counts()
        warnings = run.warnings
        during = _memory_open()
    return counted, warnings, (before, during, _memory_open())


def test_default_flags_name_the_js_chain_to_start(profiled):
    counted, warnings, _memory = profiled
    in_third = [c for c in counted if "third" in _chain(c.stack.frames)]
    samples = sum(c.count for c in in_third)
    whole = sum(c.count for c in in_third
                if _chain(c.stack.frames) == ["first", "second", "third"]
                and c.stack.frames[-1].function == "_start")
    assert samples >= 20, counted
    assert whole >= 0.9 * samples, f"{whole} of {samples} samples in third() whole"
    named = {(f.function, f.module) for c in in_third for f in c.stack.frames
             if f.function in LINES}
    assert named == {(name, "calls.js") for name in LINES}, named
    lines = {(f.function, f.line) for c in in_third for f in c.stack.frames
             if f.function in LINES}
    assert lines <= {(n, LINES[n]) for n in LINES} | {(n, CALL_LINES[n]) for n in LINES}, lines
    # no advice to restart node with a perf map: its JS frames have names
    assert not [w for w in warnings if "perf map" in w], warnings


def test_a_closed_run_holds_no_process_memory_open(profiled):
    """The stacks ustack unwinds itself get their JS frames read from
    node's memory while the run goes on; an API user's closed run keeps
    none of those descriptors (a long-lived user runs many)."""
    _counted, _warnings, (before, during, after) = profiled
    assert set(during) - set(before), "nothing read node's memory: the test proves nothing"
    assert sorted(after) == sorted(before)


def test_js_frames_sit_where_their_jit_code_ran(profiled):
    """The JS frames replace the JIT and builtin frames that ran them:
    node's C++ entry (Builtins_JSEntry) below them, nothing of calls.js
    left unnamed above them."""
    counted, _warnings, _memory = profiled
    best = max((c for c in counted if "third" in _chain(c.stack.frames)),
               key=lambda c: c.count)
    functions = [f.function for f in best.stack.frames]
    assert functions[:3] == ["third", "second", "first"], functions[:12]
    assert functions.index("Builtins_JSEntry") > 3, functions
    assert not [f for f in best.stack.frames[:3] if f.module == "JIT"], best.stack.frames[:3]


def test_interpreted_frames_give_the_line_of_their_bytecode():
    """Kept in V8's interpreter (--no-opt --no-sparkplug), each frame's
    line is where its bytecode was: first() and second() on the line of
    their call, third() in its loop."""
    node = _node()
    opts = ustack.Options(command="profile", events=["profile:hz:199"], backend="bpf",
                          cmdline=f"{node} --no-opt --no-sparkplug {CALLS} 2000")
    with ustack.Session(opts) as run:
        counted = run.counts()
    in_third = [c for c in counted if "third" in _chain(c.stack.frames)]
    samples = sum(c.count for c in in_third)
    at_calls = sum(c.count for c in in_third
                   if [(f.function, f.line) for f in c.stack.frames if f.function in LINES]
                   == [("third", 7), ("second", 13), ("first", 20)])
    assert samples >= 20, counted
    assert at_calls >= 0.9 * samples, f"{at_calls} of {samples} at their lines"


def test_offcpu_names_the_js_frames_that_wait(tmp_path):
    """offcpu: the time node's main thread waits in Atomics.wait is under
    nap() and loop(), named as in a profile."""
    node = _node()
    out = tmp_path / "off.folded"
    ok(run_ustack("offcpu", "-o", out, "-c", f"{node} {WAITS} 1000"))
    stacks = parse_folded(out.read_text())
    napping = [(stack, n) for stack, n in stacks if "nap" in stack]
    under_loop = sum(n for stack, n in napping
                     if stack[stack.index("nap") - 1] == "loop" and "_start" in stack)
    assert napping, out.read_text()[-2000:]
    assert under_loop >= 0.9 * sum(n for _s, n in napping), napping


def test_latency_entry_stacks_name_the_js_callers():
    """latency --by-stack: first() calls Date.now() (clock_gettime) in its
    loop; the entry stacks name it, called by calls.js's top level. A
    second of it: functions are read every 0.1 s while node lives, and
    node frees its heap before it exits, so those met only in a short
    run's last moments stay unnamed on a busy machine."""
    node = _node()
    res = ok(run_ustack("latency", "--by-stack", "uprobe:libc:clock_gettime",
                        "-c", f"{node} {CALLS} 1000"))
    lines = [line.strip() for line in res.stdout.splitlines()]
    first = [i for i, line in enumerate(lines) if line.startswith("first [calls.js] ")]
    assert first, res.stdout[-3000:]
    assert all(lines[i + 1].startswith("(anonymous) [calls.js] ") for i in first), \
        [lines[i:i + 2] for i in first]


def test_a_recording_keeps_the_js_frames(tmp_path):
    """record keeps each JS frame's names, read from node's heap while it
    ran: the report of the file shows first() -> second() -> third() down
    to _start, as the live run does."""
    node = _node()
    rec = tmp_path / "calls.ustack"
    ok(run_ustack("record", "profile:hz:199", "-o", rec, "-c", f"{node} {CALLS} 1000"))
    folded = tmp_path / "calls.folded"
    res = run_ustack("report", "-f", "folded", "-o", folded, rec)
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    assert_whole_chains(folded)


def assert_whole_chains(folded: Path) -> None:
    """At least 90 % of the samples in third() of a folded profile show
    first() -> second() -> third() down to _start (and there are 20)."""
    stacks = parse_folded(folded.read_text())
    in_third = sum(n for stack, n in stacks if "third" in stack)
    whole = sum(n for stack, n in stacks
                if stack[-3:] == ["first", "second", "third"] and "_start" in stack)
    assert in_third >= 20, folded.read_text()[-2000:]
    assert whole >= 0.9 * in_third, f"{whole} of {in_third}"


@pytest.fixture()
def running_node():
    """`node calls.js` running its loop for up to 60 s (ended by the test)."""
    node = _node()
    proc = subprocess.Popen([node, str(CALLS), "60000"], stdout=subprocess.DEVNULL)
    yield proc
    proc.kill()
    proc.wait()


def test_running_node_by_pid(running_node, tmp_path):
    """-p: a node already running, started with default flags."""
    out = tmp_path / "p.folded"
    res = ok(run_ustack("profile", "-F", "199", "-d", "2", "-p", str(running_node.pid),
                        "-o", out))
    assert_whole_chains(out)
    # its JS frames are named without a perf map: no advice to write one
    assert "perf map" not in res.stderr, res.stderr


def test_no_js_leaves_jit_and_builtin_frames(running_node, tmp_path):
    """--no-js: the stacks as walked, V8's builtins and unnamed JIT code."""
    out = tmp_path / "p.folded"
    res = ok(run_ustack("profile", "-F", "199", "-d", "1", "--no-js",
                        "-p", str(running_node.pid), "-o", out))
    text = out.read_text()
    assert "third" not in text and "Builtins_" in text, text[-2000:]
    assert "wrote no perf map" in res.stderr, res.stderr
    assert "no perf map (node --perf-basic-prof writes one)" in res.stderr, res.stderr


def test_node_started_during_a_whole_machine_run(tmp_path):
    """A whole-machine run: a node started once ustack says it samples has
    its JS chain named down to _start from its first samples. V8 is known
    by the node object (its layout loaded with its rows, which the walk
    wants), not by the process: nothing is read of it when it starts; its
    samples before node's rows are loaded (or where the machine's other
    objects left them no room) are named as ustack unwinds them."""
    node = _node()
    us = start_ustack("profile", "-F", "199", "-f", "json", stdout=subprocess.PIPE)
    try:
        wait_tracing(us, timeout=60)
        prog = subprocess.Popen([node, str(CALLS), "3000"], stdout=subprocess.DEVNULL)
        assert prog.wait(timeout=60) == 0
        us.send_signal(signal.SIGINT)
        out, err = finish(us, 60)
    finally:
        stop(us)
    assert us.returncode == 0, err
    stacks = [s for s in json.loads(out)["stacks"] if s["pid"] == prog.pid]
    chains = [([f["function"] for f in reversed(s["frames"])
                if f.get("kind") == "js" and f.get("file") == str(CALLS)
                and f["function"] in LINES], s) for s in stacks]
    in_third = sum(s["count"] for chain, s in chains if "third" in chain)
    whole = sum(s["count"] for chain, s in chains
                if chain == ["first", "second", "third"]
                and s["frames"][-1]["function"] == "_start")
    assert in_third >= 20, [c for c, _s in chains][:10]
    assert whole >= 0.9 * in_third, f"{whole} of {in_third} samples in third() whole"


def test_stacks_unwound_by_ustack_name_their_js_frames(tmp_path):
    """A rows table too small for node's rows (--unwind-memory 1): the
    kernel hands each stack to ustack unwalked, and ustack names its JS
    frames as it unwinds it (from the stack copy and the live process),
    as the kernel names those it walks."""
    node = _node()
    out = tmp_path / "copied.folded"
    res = ok(run_ustack("profile", "-F", "499", "--unwind-memory", "1", "-o", out,
                        "-c", f"{node} {CALLS} 1500"))
    assert "did not fit" in res.stderr, res.stderr
    assert_whole_chains(out)


def test_node_rows_not_fitting_walked_on_frame_pointers():
    """Where node's unwind rows do not fit the in-kernel table (forced
    with --unwind-memory 1), its stacks are walked on their frame pointers
    in the kernel (V8's code keeps them) and their JS frames named there,
    as the header says: a copy handed to ustack is named only while node
    lives, which a busy machine's reader may not see."""
    opts = ustack.Options(command="profile", events=["profile:hz:199"], backend="bpf",
                          cmdline=f"{_node()} {CALLS} 2000", unwind_memory=1 << 20)
    run = ustack.Session(opts)
    with run:
        counted = run.counts()
        note = run.capture.unwind_note
    assert "node: walked on its frame pointers in the kernel" in note, note
    in_third = [c for c in counted if "third" in _chain(c.stack.frames)]
    samples = sum(c.count for c in in_third)
    whole = sum(c.count for c in in_third
                if _chain(c.stack.frames) == ["first", "second", "third"]
                and c.stack.frames[-1].function == "_start")
    assert samples >= 20 and whole >= 0.9 * samples, f"{whole} of {samples} in third() whole"
