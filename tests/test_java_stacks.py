"""Java (HotSpot 17): frames of JIT-compiled methods named from the perf
map the JVM writes (`jcmd PID Compiler.perfmap` while it runs, or
-XX:+DumpPerfMapAtExit), walked on the frame pointers
-XX:+PreserveFramePointer keeps: the way without the walk of the JVM's
own tables (--no-java; test_java_frames.py tests that one). Chain.java's
main -> outer -> middle -> leaf is the oracle: each sample in leaf() must show outer, middle, leaf in
order, down to the root of the thread the launcher runs main on (JavaMain,
start_thread, clone3). Each method is kept out of its caller
(CompileCommand dontinline): an inlined call has no frame of its own."""
from __future__ import annotations

import re
import signal
import subprocess
from pathlib import Path

import pytest

import ustack
from ustack.model import SymbolOptions
from helpers import (compiled_java_chain, end_after_cpu, finish, java_tool, ok, parse_folded,
                     parse_trace, run_for_cpu, run_ustack, start_ustack, stop, wait_tracing,
                     wait_until)

pytestmark = pytest.mark.kernel

FLAGS = ("-XX:+PreserveFramePointer", "-XX:CompileCommand=quiet",
         "-XX:CompileCommand=dontinline,Chain::*")
# the JVM's CPU time an attached run lasts: at 199 Hz about 400 samples,
# however loaded the machine is
CPU_SECONDS = 2
# how HotSpot's map names a method: "double Chain.leaf(int)"
_METHOD = re.compile(r"\w+ Chain\.(\w+)\(")


_tool = java_tool


@pytest.fixture(scope="module")
def classes(tmp_path_factory) -> Path:
    return compiled_java_chain(tmp_path_factory.mktemp("java"))


def _chain(functions) -> list:
    """Chain's methods among the frames (outermost first), main left out:
    it runs interpreted until the JVM compiles its loop."""
    return [m[1] for f in functions if (m := _METHOD.match(f or "")) and m[1] != "main"]


def _judge(stacks) -> tuple:
    """(samples in leaf(), those complete to the thread's root with outer,
    middle, leaf named in order): `stacks` are (functions outermost first,
    count)."""
    busy = [(fs, n) for fs, n in stacks if "leaf" in _chain(fs)]
    whole = sum(n for fs, n in busy
                if fs[:3] == ["clone3", "start_thread", "ThreadJavaMain"]
                and _chain(fs) == ["outer", "middle", "leaf"])
    return sum(n for _fs, n in busy), whole


def test_map_written_at_exit_names_the_chain(classes):
    """A -c run: -XX:+DumpPerfMapAtExit writes the map as the JVM exits,
    before ustack names the stacks it counted."""
    java = _tool("java")
    opts = ustack.Options(command="profile", events=["profile:hz:199"], cmdline=(
        f"{java} {' '.join(FLAGS)} -XX:+UnlockDiagnosticVMOptions -XX:+DumpPerfMapAtExit "
        f"-cp {classes} Chain 3"), symbols=SymbolOptions(java=False))
    run = ustack.Session(opts)
    try:
        with run:
            counted = run.counts()
            warnings = run.warnings
    finally:
        if run.target is not None:
            Path(f"/tmp/perf-{run.target.pid}.map").unlink(missing_ok=True)
    stacks = [([f.function for f in reversed(c.stack.frames)], c.count) for c in counted]
    busy, whole = _judge(stacks)
    assert busy >= 100 and whole >= 0.9 * busy, \
        f"{whole} of {busy} samples in leaf() are whole with outer, middle, leaf named"
    jit = {(f.function, f.kind) for c in counted for f in c.stack.frames if f.module == "JIT"}
    assert ("double Chain.leaf(int)", "java") in jit and {k for _f, k in jit} == {"java"}, jit
    assert not [w for w in warnings if "perf map" in w or "PreserveFramePointer" in w], warnings


@pytest.fixture
def running_jvm(classes):
    """A JVM spinning in Chain's loop, its methods compiled (-Xbatch: it
    says "ready" only once they are); its map removed afterwards."""
    java = subprocess.Popen([_tool("java"), "-Xbatch", *FLAGS, "-cp", str(classes),
                             "Chain", "600"], stdout=subprocess.PIPE, text=True)
    try:
        assert java.stdout.readline() == "ready\n"
        yield java
    finally:
        java.send_signal(signal.SIGTERM)
        java.wait()
        Path(f"/tmp/perf-{java.pid}.map").unlink(missing_ok=True)


def _perfmap(pid: int) -> None:
    subprocess.run([_tool("jcmd"), str(pid), "Compiler.perfmap"], check=True,
                   capture_output=True, timeout=60)


@pytest.mark.parametrize("when", ["before", "during", "after"])
def test_attached_jvm_named_by_jcmd(running_jvm, when, tmp_path):
    """`ustack profile -p PID` of a running JVM, the map written by jcmd
    before the run or while it runs: stacks are named when the run ends;
    or `ustack record`, then jcmd, then `ustack report`."""
    out = tmp_path / "java.folded"
    pid = running_jvm.pid
    args = ("profile", "-F", "199", "--no-java", "-o", out)
    if when == "before":
        _perfmap(pid)
        err = ok(run_for_cpu(pid, *args, seconds=CPU_SECONDS)).stderr
    elif when == "after":
        recording = tmp_path / "java.data"
        err = ok(run_for_cpu(pid, "record", "profile:hz:199", "--no-java", "-o", recording,
                             seconds=CPU_SECONDS)).stderr
        _perfmap(pid)
        res = run_ustack("report", recording, "-f", "folded", "-o", out)
        assert res.returncode == 0, res.stderr
        err += res.stderr
    else:
        us = start_ustack(*args, "-p", pid)
        try:
            err = wait_tracing(us)
            _perfmap(pid)
            err += end_after_cpu(us, pid, CPU_SECONDS)
        finally:
            stop(us)
        assert us.returncode == 0, err
    stacks = [([f for f in fs[1:] if not f.startswith("[")], n)
              for fs, n in parse_folded(out.read_text())]
    stacks = [([f.replace("_", " ") if "Chain." in f else f for f in fs], n) for fs, n in stacks]
    busy, whole = _judge(stacks)
    assert busy >= 100 and whole >= 0.9 * busy, \
        f"{whole} of {busy} samples in leaf() are whole with outer, middle, leaf named"
    said = [line for line in err.splitlines() if line.startswith("ustack: ")]
    assert not [w for w in said if "perf map" in w or "PreserveFramePointer" in w], err
    # the header says it while a map can still be asked for
    hint = f"; no perf map yet: `jcmd {pid} Compiler.perfmap` during the run names its JIT frames]"
    assert (hint in err.splitlines()[0]) == (when != "before"), err


def test_trace_named_once_the_map_is_written(running_jvm, tmp_path):
    """`trace` names each stack as it comes: those seen before jcmd wrote
    the map are named again after it (not kept unnamed from a cache), and
    the end of the run says the earlier ones are unnamed."""
    out = tmp_path / "trace.txt"

    def events() -> int:
        return out.read_text().count(": profile:hz:99\n")

    with open(out, "w") as stdout:
        us = start_ustack("trace", "profile:hz:99", "--no-java", "-p", running_jvm.pid,
                          stdout=stdout)
    try:
        err = wait_tracing(us)
        wait_until(lambda: events() >= 200, timeout=60, what="200 events before the map")
        _perfmap(running_jvm.pid)
        after = events()
        wait_until(lambda: events() >= after + 200, timeout=60, what="200 events after it")
        us.send_signal(signal.SIGINT)
        err += finish(us)[1]
    finally:
        stop(us)
    records = parse_trace(out.read_text())
    first = [any(f["func"] == "double Chain.leaf(int)" for f in r["frames"])
             for r in records].index(True)
    # where each event's innermost frame in JIT code is named, or not
    jit = [[f["func"] for f in r["frames"] if f["func"] == "[unknown]" or f["module"] == "JIT"]
           for r in records]
    unnamed = [bool(fs) and fs[0] == "[unknown]" for fs in jit]
    assert first >= 200, first
    assert sum(unnamed[first:]) <= 0.01 * len(records[first:]), \
        f"{sum(unnamed[first:])} of {len(records[first:])} events unnamed after the first named"
    pid = running_jvm.pid
    assert (f"ustack: PID {pid} (java) wrote its perf map (/tmp/perf-{pid}.map) during "
            f"the run: the JIT frames of stacks named before are unnamed") in err, err


def test_no_perf_map_nor_frame_pointers_said_once(classes, tmp_path):
    """A JVM without a map nor -XX:+PreserveFramePointer: its stacks end in
    its (unnamed) JIT code; the end of the run says why, once each."""
    res = ok(run_ustack("profile", "-F", "199", "--no-java", "-o", tmp_path / "out.folded", "-c",
                        f"{_tool('java')} -cp {classes} Chain 2"))
    pid = int(re.search(r"\(PID (\d+)\)", res.stderr.splitlines()[0])[1])
    said = [line for line in res.stderr.splitlines() if line.startswith("ustack: ")]
    assert said == [
        f"ustack: PID {pid} (java) ran JIT code but wrote no perf map "
        f"(/tmp/perf-{pid}.map): its JIT frames are unnamed; run `jcmd {pid} "
        f"Compiler.perfmap` while it runs (the map holds the code compiled until "
        f"then), or start java with -XX:+UnlockDiagnosticVMOptions "
        f"-XX:+DumpPerfMapAtExit",
        f"ustack: stacks of PID {pid} (java) end in its JIT code: a JVM started "
        f"without -XX:+PreserveFramePointer keeps no frame pointer there to walk on"
    ], res.stderr
