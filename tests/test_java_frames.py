"""Java (HotSpot) frames with the JVM's default flags and no perf map, on
each JDK installed under /usr/lib/jvm (17, 25: their vmStructs differ):
the kernel hands a JVM's stacks through its code cache to user space with
their copy, where they are walked through the Java frames (compiled
frames by their size, interpreted ones on the interpreter's rbp chain)
and named from libjvm's vmStructs tables (unwind/hotspot_live.py).

Chain.java's main -> outer -> middle -> leaf is the oracle, once compiled
by C2 during the run (each method kept out of its caller: a frame each),
once inlined by C2 into one frame (expanded from the nmethod's scopes;
-XX:+DebugNonSafepoints gives its loops debug info, which C2 otherwise
records only at calls and safepoint polls) and once interpreted only
(excluded from compilation): each sample in leaf() must
show exactly main, outer, middle, leaf as Java frames, in order, down to
the root of the thread the launcher runs main on (JavaMain, start_thread,
clone3). One JVM per way and JDK, shared by the tests."""
from __future__ import annotations

import collections
import json
import signal
import subprocess
from pathlib import Path

import pytest

import ustack
from helpers import (PROGRAMS, compiled_java_chain, end_after_cpu, finish, java_tool, ok,
                     parse_folded, run_for_cpu, run_ustack, start_ustack, stop,
                     wait_tracing)
from ustack.model import SymbolOptions

pytestmark = pytest.mark.kernel

CHAIN = ["Chain.main", "Chain.outer", "Chain.middle", "Chain.leaf"]
# Chain.java's lines of the calls down the chain, and of leaf()'s loop (0:
# none known, at a pc with no debug info or on the method's entry)
CALL_LINES = {"Chain.main": 31, "Chain.outer": 20, "Chain.middle": 15}
LEAF_LINES = {0, 9, 10}
WAYS = {
    # compiled while the run samples it (C1, then C2)
    "compiled": ("-XX:CompileCommand=quiet", "-XX:CompileCommand=dontinline,Chain::*"),
    # C2 inlines leaf, middle and outer into main's frame; debug info at
    # every pc, not only at calls and safepoint polls
    "inlined": ("-XX:+UnlockDiagnosticVMOptions", "-XX:+DebugNonSafepoints"),
    # interpreted only
    "interpreted": ("-XX:CompileCommand=quiet", "-XX:CompileCommand=exclude,Chain::*"),
}


JVM_HOMES = Path("/usr/lib/jvm")


def _jdks() -> list:
    """The name of each JDK under /usr/lib/jvm (once, whatever its other
    names), or ["PATH"] (the java on the PATH) where there is none."""
    homes: dict = {}
    # a JDK's own directory named before the links to it
    for home in sorted(JVM_HOMES.glob("*"), key=lambda p: (p.is_symlink(), p.name)) \
            if JVM_HOMES.is_dir() else ():
        if (home / "bin" / "java").is_file() and (home / "bin" / "javac").is_file():
            homes.setdefault(home.resolve(), home.name)
    return sorted(homes.values()) or ["PATH"]


@pytest.fixture(scope="module", params=_jdks())
def jdk(request) -> str:
    return request.param


def _tool(name: str, jdk: str = "PATH") -> str:
    """The JDK tool `name` of JDK `jdk` ("PATH": the one on the PATH)."""
    return java_tool(name) if jdk == "PATH" else str(JVM_HOMES / jdk / "bin" / name)


@pytest.fixture(scope="module")
def classes(tmp_path_factory, jdk) -> tuple:
    """(the JDK, the classpath of Chain.java compiled by its javac)."""
    directory = tmp_path_factory.mktemp("java")
    if jdk == "PATH":
        return jdk, compiled_java_chain(directory)
    subprocess.run([_tool("javac", jdk), "-d", str(directory),
                    str(PROGRAMS / "java" / "Chain.java")], check=True)
    return jdk, directory


def _profile(classes: tuple, flags: tuple, no_java: bool = False) -> tuple:
    """(counted stacks, warnings, the summary's notes) of `profile -c java
    FLAGS Chain 1`."""
    jdk, classpath = classes
    opts = ustack.Options(
        command="profile", events=["profile:hz:199"],
        cmdline=f"{_tool('java', jdk)} {' '.join(flags)} -cp {classpath} Chain 1",
        symbols=SymbolOptions(java=not no_java))
    run = ustack.Session(opts)
    with run:
        counted = run.counts()
        warnings = run.warnings
        run.losses()                    # the run's counters, read for its summary
        notes = run.capture.end_notes()
    return counted, warnings, notes


@pytest.fixture(scope="module")
def runs() -> dict:
    """(JDK, way) -> _profile()'s result: each way's JVM run once per JDK,
    whichever test asks first."""
    return {}


def _run(runs: dict, classes: tuple, way: str) -> tuple:
    if (classes[0], way) not in runs:
        runs[classes[0], way] = _profile(classes, WAYS[way])
    return runs[classes[0], way]


@pytest.fixture(scope="module", params=sorted(WAYS))
def profiled(request, classes, runs):
    return request.param, *_run(runs, classes, request.param)


def test_inlined_leaf_keeps_its_frame(classes, runs):
    """A sample in leaf()'s loop, inlined by C2 with middle() and outer()
    into main's compiled frame, shows leaf() under middle(): the scopes of
    the interrupted pc (the PcDesc past it), not only its callers'. (With
    the JVM's default flags C2 records no scope in that loop, and JFR
    shows middle() there as the walk does.)"""
    counted = _run(runs, classes, "inlined")[0]
    tops = collections.Counter()
    for frames, n in _main_thread(counted):
        java = [f.function for f in frames if f.kind == "java" and f.function[0] != "["]
        if java and java[-1].startswith("Chain."):
            tops[tuple(java) if java == CHAIN else java[-1]] += n
    total = sum(tops.values())
    assert total >= 100 and tops[tuple(CHAIN)] >= 0.85 * total, tops


def test_jvm_stacks_said_walked_from_copies(profiled):
    """The kernel hands each stack through the JVM's code cache to ustack
    with its copy (another JIT's it walks itself), and the summary says
    how many: at least every sample in leaf()."""
    way, counted, _warnings, notes = profiled
    busy = sum(n for fs, n in _main_thread(counted) if any(
        f.function == "Chain.leaf" for f in fs))
    said = [int(n.split()[0]) for n in notes if n.endswith(
        "through a JVM's JIT code walked by ustack from copies")]
    assert busy >= 100 and said and said[0] >= busy, (way, busy, notes)


def _main_thread(counted) -> list:
    """(frames outermost first, count) of the stacks of the thread that
    runs main (those through JavaMain)."""
    stacks = [(list(reversed(c.stack.frames)), c.count) for c in counted]
    return [(fs, n) for fs, n in stacks if any(f.function == "JavaMain" for f in fs)]


def test_java_methods_named_in_order_to_the_thread_root(profiled):
    way, counted, warnings, _notes = profiled
    busy = whole = 0
    lines: set = set()
    for frames, n in _main_thread(counted):
        # Java methods (the JVM's stubs, "[StubRoutines (1)]", left out)
        java = [f.function for f in frames if f.kind == "java" and f.function[0] != "["]
        if "Chain.leaf" not in java:
            continue
        busy += n
        roots = [f.function for f in frames[:3]]
        if roots == ["clone3", "start_thread", "ThreadJavaMain"] and java == CHAIN:
            whole += n
            lines |= {(f.function, f.line) for f in frames if f.function in CHAIN}
    assert busy >= 100 and whole >= 0.9 * busy, \
        f"{way}: {whole} of {busy} samples in leaf() whole, main, outer, middle, leaf named"
    assert not [w for w in warnings if "perf map" in w or "PreserveFramePointer" in w
                or "[java" in w], warnings
    # each caller at the line of its call (its bci, read from its method's
    # line table), leaf() in its loop
    assert {(f, line) for f, line in lines if f != "Chain.leaf"} == set(CALL_LINES.items()), lines
    assert {line for f, line in lines if f == "Chain.leaf"} <= LEAF_LINES, lines
    stubs = {f.function for c in counted for f in c.stack.frames
             if f.kind == "java" and f.function[0] == "["}
    # the call stub that enters main ("(1)" in JDK 17, "(initialstubs)" in 25)
    assert {s for s in stubs if s.startswith("[StubRoutines (")}, stubs


def test_main_thread_stacks_reach_its_root(profiled):
    """Every sample of main's thread in Java code is complete, not only
    those in leaf(): none ends in the code cache."""
    way, counted, _warnings, _notes = profiled
    java = [(fs, n) for fs, n in _main_thread(counted) if any(f.kind == "java" for f in fs)]
    total = sum(n for _fs, n in java)
    rooted = sum(n for fs, n in java if fs[0].function == "clone3")
    assert total >= 100 and rooted >= 0.95 * total, f"{way}: {rooted} of {total} rooted"


def test_no_java_leaves_the_code_cache_unnamed(classes):
    """--no-java: the Java frames are the JIT's unnamed code, as before."""
    counted, _warnings, _notes = _profile(classes, WAYS["compiled"], no_java=True)
    assert counted
    assert not [f for c in counted for f in c.stack.frames if f.kind == "java"]


def test_attached_jvm_folded(classes, tmp_path):
    """`ustack profile -p PID` of a JVM already busy in its loop (its
    methods compiled or being compiled before the run): the folded stacks
    through leaf() end main, outer, middle, leaf, no perf map advised."""
    jdk, classpath = classes
    java = subprocess.Popen([_tool("java", jdk), *WAYS["compiled"], "-cp", str(classpath),
                             "Chain", "600"], stdout=subprocess.PIPE, text=True)
    try:
        assert java.stdout.readline() == "ready\n"
        out = tmp_path / "java.folded"
        err = ok(run_for_cpu(java.pid, "profile", "-F", "199", "-o", out, seconds=1)).stderr
    finally:
        java.send_signal(signal.SIGTERM)
        java.wait()
    busy = whole = 0
    for frames, n in parse_folded(out.read_text()):
        chain = [f for f in frames if f.startswith("Chain.")]
        if chain[-1:] == ["Chain.leaf"]:
            busy += n
            whole += n * (frames[1:4] == ["clone3", "start_thread", "ThreadJavaMain"]
                          and chain == CHAIN)
    assert busy >= 50 and whole >= 0.9 * busy, f"{whole} of {busy} samples in leaf() whole"
    assert "perf map" not in err and "PreserveFramePointer" not in err, err


def test_a_recording_keeps_the_java_frames(classes, tmp_path):
    """`record` walks the JVM's copied stacks while it lives and keeps each
    Java frame's names and line (its bci's): the report of the file, the
    JVM gone, shows main, outer, middle, leaf in order, down to the
    thread's root, each caller at the line of its call."""
    rec = tmp_path / "chain.ustack"
    jdk, classpath = classes
    ok(run_ustack("record", "profile:hz:199", "-o", rec, "-c",
                  f"{_tool('java', jdk)} {' '.join(WAYS['compiled'])} -cp {classpath} Chain 1"))
    res = run_ustack("report", "-f", "json", rec)
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    busy = whole = 0
    lines: set = set()
    for s in json.loads(res.stdout)["stacks"]:
        frames = list(reversed(s["frames"]))          # outermost first
        java = [f["function"] for f in frames
                if f.get("kind") == "java" and f["function"][0] != "["]
        if "Chain.leaf" not in java:
            continue
        busy += s["count"]
        if [f["function"] for f in frames[:3]] == ["clone3", "start_thread",
                                                   "ThreadJavaMain"] and java == CHAIN:
            whole += s["count"]
            lines |= {(f["function"], f.get("line")) for f in frames if f["function"] in CHAIN}
    assert busy >= 100 and whole >= 0.9 * busy, \
        f"{whole} of {busy} samples in leaf() whole, main, outer, middle, leaf named"
    assert {(f, line) for f, line in lines if f != "Chain.leaf"} == set(CALL_LINES.items()), lines
    assert "[java" not in res.stderr and "perf map" not in res.stderr, res.stderr


NAPS = ["Naps.main", "Naps.outer", "Naps.middle", "Naps.nap"]
NAP_FLAGS = ("-XX:CompileCommand=quiet", "-XX:CompileCommand=dontinline,Naps::*")


def test_offcpu_java_blocks_named(tmp_path):
    """`ustack offcpu -c java Naps`: a Java thread sleeping in main ->
    outer -> middle -> nap has its time under those Java methods, in
    order, down to its thread's root, though the JVM has exited when the
    report is made (its stacks were walked as they came)."""
    classes = compiled_java_chain(tmp_path, "Naps")
    out = tmp_path / "naps.folded"
    ok(run_ustack("offcpu", "-f", "folded", "-o", out, "-c",
                  f"{_tool('java')} {' '.join(NAP_FLAGS)} -cp {classes} Naps 100"))
    asleep, whole = _whole_in(out.read_text(), "JVM_Sleep", NAPS)
    # 400 naps of at least 2 ms each
    assert asleep >= 800_000 and whole >= 0.9 * asleep, f"{whole} of {asleep} µs named"


def _libjvm() -> str:
    """The libjvm.so of the JDK whose java is on the PATH."""
    return str(Path(_tool("java")).resolve().parents[1] / "lib" / "server" / "libjvm.so")


def test_latency_by_stack_java_methods_named(tmp_path):
    """`ustack latency --by-stack uprobe:libjvm.so:JVM_Sleep -p JVM`: the
    100 sleeps of Naps 25 (4 per outer() call) are timed under one stack
    whose Java frames are nap, middle, outer, main in order, as
    Thread.sleep's callers, down to the thread's root (the entries' stacks
    through the JIT code walked while the JVM lives)."""
    classes = compiled_java_chain(tmp_path, "Naps")
    java = subprocess.Popen([_tool("java"), *NAP_FLAGS, "-cp", str(classes), "Naps", "25",
                             "wait"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    us = None
    try:
        assert java.stdout.readline() == "ready\n"
        us = start_ustack("latency", "--by-stack", f"uprobe:{_libjvm()}:JVM_Sleep",
                          "-p", str(java.pid), stdout=subprocess.PIPE)
        wait_tracing(us)
        java.stdin.write("go\n")
        java.stdin.flush()
        assert java.stdout.readline() == "ok\n"
        us.send_signal(signal.SIGINT)
        out, err = finish(us)
    finally:
        java.stdin.close()
        java.wait()
        if us is not None:
            stop(us)
    assert us.returncode == 0, err
    blocks = [b.splitlines() for b in out.strip().split("\n\n")]
    napping = [b for b in blocks if any(line.startswith("  Naps.nap ") for line in b)]
    assert len(napping) == 1, out
    head, *frames = [line for line in napping[0] if not line.startswith("[")]
    assert ": count 100, " in head, out
    assert [f.split()[0] for f in frames if f.startswith("  Naps.")] == \
        list(reversed(NAPS)), out
    assert [f.split()[0] for f in frames[:2] + frames[-3:]] == \
        ["JVM_Sleep", "java.lang.Thread.sleep", "ThreadJavaMain", "start_thread",
         "clone3"], out


def _whole_in(folded: str, through: str, chain: list, pid: int | None = None) -> tuple:
    """(the weight of the folded lines through frame `through`, of process
    pid's (`-P` lines) where given; that of those whole: the methods of
    `chain`'s class exactly `chain`, in order, down to the thread's root)."""
    mine = chain[0].split(".")[0] + "."
    total = whole = 0
    for frames, n in parse_folded(folded):
        if through not in frames or (pid is not None and not frames[0].endswith(f"-{pid}")):
            continue
        total += n
        whole += n * (frames[1:4] == ["clone3", "start_thread", "ThreadJavaMain"]
                      and [f for f in frames if f.startswith(mine)] == chain)
    return total, whole


def test_whole_machine_java_before_and_during_the_run(classes, tmp_path):
    """`ustack profile` of the whole machine: a JVM busy in its loop since
    before the run, and one started once the run samples (its libjvm, its
    code cache new to the run), both have their samples in leaf() whole
    with main, outer, middle, leaf named, by process (-P)."""
    jdk, classpath = classes
    argv = [_tool("java", jdk), *WAYS["compiled"], "-cp", str(classpath), "Chain", "600"]
    before = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    during = None
    out = tmp_path / "machine.folded"
    try:
        assert before.stdout.readline() == "ready\n"
        us = start_ustack("profile", "-F", "199", "-P", "-f", "folded", "-o", out)
        try:
            wait_tracing(us)
            during = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
            assert during.stdout.readline() == "ready\n"
            err = end_after_cpu(us, during.pid, 1.0)
        finally:
            stop(us)
    finally:
        for java in (before, during):
            if java is not None:
                java.send_signal(signal.SIGTERM)
                java.wait()
    assert us.returncode == 0, err
    folded = out.read_text()
    for java in (before, during):
        busy, whole = _whole_in(folded, "Chain.leaf", CHAIN, java.pid)
        assert busy >= 50 and whole >= 0.9 * busy, \
            f"PID {java.pid}: {whole} of {busy} samples in leaf() whole"


LEAKS = ["Leaks.main", "Leaks.outer", "Leaks.middle", "Leaks.leak"]


def test_memleak_java_allocations_named(tmp_path):
    """`ustack memleak -p` of a JVM that keeps direct buffers (malloc'd by
    the JVM under main -> outer -> middle -> leak): the outstanding bytes
    allocated there are under those Java methods, in order, down to the
    thread's root."""
    classes = compiled_java_chain(tmp_path, "Leaks")
    java = subprocess.Popen([_tool("java"), "-XX:CompileCommand=quiet",
                             "-XX:CompileCommand=dontinline,Leaks::*", "-cp", str(classes),
                             "Leaks"], stdout=subprocess.PIPE, text=True)
    out = tmp_path / "leaks.folded"
    try:
        assert java.stdout.readline() == "ready\n"
        ok(run_ustack("memleak", "-d", "2", "-f", "folded", "-o", out, "-p", str(java.pid)))
    finally:
        java.send_signal(signal.SIGTERM)
        java.wait()
    direct, whole = _whole_in(out.read_text(), "Unsafe_AllocateMemory0", LEAKS)
    assert direct >= 40 * 4096 and whole >= 0.9 * direct, f"{whole} of {direct} bytes named"


JAVA_NOT_WALKED = ("(Java frames not walked: a JVM's compiled code keeps no frame pointer, "
                   "and this stack was walked on frame pointers with no copy to walk it by "
                   "the JVM's own tables; --backend bpf or perf unwind with CFI)")


def test_tracefs_stacks_through_java_code_say_it_is_not_walked(tmp_path):
    """`count --backend tracefs syscall:futex -c java Naps`: ftrace's
    userstacktrace walks frame pointers and copies no stack, so a JVM's
    compiled code cannot be walked: every stack with its unnamed frames
    says why in its note, none is a silent [unknown]."""
    classes = compiled_java_chain(tmp_path, "Naps")
    res = ok(run_ustack("count", "--backend", "tracefs", "syscall:futex", "-c",
                        f"{_tool('java')} {' '.join(NAP_FLAGS)} -cp {classes} Naps 25"))
    blocks = [b.splitlines() for b in res.stdout.strip().split("\n\n")]
    through_jit = [b for b in blocks if "  [unknown]" in b]
    said = [b for b in through_jit if f"  {JAVA_NOT_WALKED}" in b]
    assert through_jit and len(said) == len(through_jit), res.stdout
    # a stack through no JIT code has no such note
    assert not [b for b in blocks if "  [unknown]" not in b
                and f"  {JAVA_NOT_WALKED}" in b], res.stdout
