#!/usr/bin/env python3
"""java with default flags and no perf map: how many of its samples ustack
walks to the thread's start with Java methods named, and how its top Java
methods compare with Java Flight Recorder's execution samples on the same
run of bench/programs/JavaMix.java (whose second half runs methods first
called then: compiled while the run samples); then what the walk costs
per sample.

    sudo python3 bench/java_frames.py [--seconds S] [--reps R] [--jdk HOME]

--jdk: the JDK whose java, javac, jcmd and jfr run (its bin/ put first on
the PATH), e.g. /usr/lib/jvm/temurin-25-jdk-amd64; the PATH's by default.

Scopes: -p (a JVM started just before, JFR started in it by `jcmd PID
JFR.start`), -c (JFR started by the command's -XX:StartFlightRecording:
the oracle's flag, not ustack's), whole machine (no target, -d: a JVM
started before the run, JFR by jcmd; and one started 1 s into the run,
JFR by its flag), the JVM's own stacks judged. Only the thread that runs main is
compared (JFR's `sampledThread = "main"`; ustack's stacks through
JavaMain). A sample is a Java sample when it holds a Java method's frame;
it is whole when it ends at the thread's root (clone3) with every Java
frame named. A method's share is the samples whose innermost Java method
it is, over the Java samples (JFR: its top frame); the JVM's stubs are
not methods, and the samples whose innermost frame is one (the math
intrinsics, dsin or dlog, sit in StubRoutines' blobs) are left out of
the shares: JFR's sampler cannot walk from there and records none.

JFR leaves DebugNonSafepoints off (`jcmd PID VM.flags -all` while it
records, JDK 17 and 25): it and the walk read the same PcDescs, which C2
records only at calls and safepoint polls. A run without JFR (`-p, no
JFR`) shows what the walk gives with no recording running.

Prints Markdown."""
from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))
MIX = REPO / "bench" / "programs" / "JavaMix.java"
ROOT = "clone3"


def ustack_counts(**scope) -> list:
    import ustack
    opts = ustack.Options(command="profile", events=["profile:hz:199"], backend="bpf", **scope)
    run = ustack.Session(opts)
    with run:
        return run.counts()


def machine_counts(proc: subprocess.Popen | None, start) -> list:
    """Counted stacks of the JVM's process in a whole-machine run that
    ends as it exits: the JVM `proc` running before the run, or, given
    None, the one `start()` starts 1 s into the run."""
    import threading
    import ustack
    run = ustack.Session(ustack.Options(command="profile", events=["profile:hz:199"],
                                        backend="bpf"))
    jvm = {"proc": proc}

    def watch():
        if jvm["proc"] is None:
            time.sleep(1)
            jvm["proc"] = start()
        jvm["proc"].wait()
        run.stop()
    with run:
        threading.Thread(target=watch, daemon=True).start()
        counted = run.counts()
    pid = jvm["proc"].pid
    return [c for c in counted if c.pid == pid]


def ustack_shares(counted: list) -> tuple:
    """(Java samples, whole ones, in stubs, Counter of innermost Java method
    -> samples) of main's thread."""
    java = whole = stub = 0
    top: collections.Counter = collections.Counter()
    for c in counted:
        frames = c.stack.frames
        if not any(f.function == "JavaMain" for f in frames):
            continue
        methods = [f for f in frames if f.kind == "java" and not f.function.startswith("[")]
        if not methods:
            continue
        java += c.count
        named = not any((f.function or "").startswith("[java ") for f in frames)
        whole += c.count * (named and frames[-1].function == ROOT)
        if frames[0].kind == "java" and frames[0].function.startswith("["):
            stub += c.count     # in the JVM's stubs: JFR records no sample there
            continue
        top[methods[0].function] += c.count
    return java, whole, stub, top


_TOP = re.compile(r"^\s+stackTrace = \[\n\s+([\w.$<>]+)\(", re.M)


def jfr_shares(recording: str) -> collections.Counter:
    text = subprocess.run(["jfr", "print", "--events", "jdk.ExecutionSample", recording],
                          capture_output=True, text=True, check=True).stdout
    top: collections.Counter = collections.Counter()
    for event in text.split("jdk.ExecutionSample {")[1:]:
        if 'sampledThread = "main"' not in event:
            continue
        m = _TOP.search(event)
        if m:
            top[m[1]] += 1
    return top


def compare(ours: collections.Counter, theirs: collections.Counter) -> list:
    """Rows (method, ours %, theirs %, difference) of JFR's top 10."""
    n_ours, n_theirs = sum(ours.values()) or 1, sum(theirs.values()) or 1
    rows = []
    for key, n in theirs.most_common(10):
        a, b = 100 * ours.get(key, 0) / n_ours, 100 * n / n_theirs
        rows.append((key, a, b, a - b))
    return rows


def _started(proc: subprocess.Popen) -> None:
    if proc.stdout.readline() != "started\n":
        raise SystemExit("JavaMix did not start")


def scope_run(scope: str, classes: str, seconds: float, tmp: str) -> tuple:
    """(Java samples, whole, in stubs, ustack's shares, JFR's shares or None)."""
    recording = os.path.join(tmp, f"{scope.replace(' ', '_').replace(',', '')}.jfr")
    if scope == "-c":
        cmd = (f"java -XX:StartFlightRecording=filename={recording},settings=profile "
               f"-cp {classes} JavaMix {seconds}")
        counted = ustack_counts(cmdline=cmd)
    elif scope == "whole machine, started during":
        counted = machine_counts(None, lambda: subprocess.Popen(
            ["java", f"-XX:StartFlightRecording=filename={recording},settings=profile",
             "-cp", classes, "JavaMix", str(seconds)], stdout=subprocess.DEVNULL))
    elif scope == "whole machine":
        proc = subprocess.Popen(["java", "-cp", classes, "JavaMix", str(seconds)],
                                stdout=subprocess.PIPE, text=True)
        _started(proc)
        subprocess.run(["jcmd", str(proc.pid), "JFR.start", "name=bench", "settings=profile",
                        f"filename={recording}"], check=True, capture_output=True)
        counted = machine_counts(proc, None)
    else:
        proc = subprocess.Popen(["java", "-cp", classes, "JavaMix", str(seconds)],
                                stdout=subprocess.PIPE, text=True)
        _started(proc)
        if scope == "-p":
            subprocess.run(["jcmd", str(proc.pid), "JFR.start", "name=bench", "settings=profile",
                            f"filename={recording}"], check=True, capture_output=True)
        counted = ustack_counts(pid=proc.pid)       # until it exits
        proc.wait()
    java, whole, stub, ours = ustack_shares(counted)
    theirs = jfr_shares(recording) if os.path.exists(recording) else None
    return java, whole, stub, ours, theirs


def walk_cost(classes: str, seconds: float) -> tuple:
    """(µs per Java walk: median and samples, µs per DWARF walk of the same
    kind of copy with --no-java) of a -c run of JavaMix, timed in this
    process around the unwinder's calls."""
    from ustack.model import SymbolOptions
    from ustack.unwind import dwarf, hotspot_live
    out = {}
    for label, java in (("java", True), ("no-java", False)):
        times: list = []
        frames: list = []
        target = (hotspot_live.HotSpotLive, "unwind") if java else (dwarf.DwarfUnwinder, "unwind")
        original = getattr(*target)

        def timed(*a, _original=original, **kw):
            t = time.perf_counter_ns()
            got = _original(*a, **kw)
            times.append(time.perf_counter_ns() - t)
            frames.append(len(got[0]) if got else 0)
            return got
        setattr(*target, timed)
        try:
            ustack_counts(cmdline=f"java -cp {classes} JavaMix {seconds}",
                          symbols=SymbolOptions(java=java))
        finally:
            setattr(*target, original)
        out[label] = (statistics.median(times) / 1000 if times else float("nan"), len(times),
                      statistics.median(frames) if frames else 0)
    return out


def kernel_cost(classes: str, reps: int) -> list:
    """Rows (process, ns per run of the in-kernel walking program: medians
    of `reps` runs): a JVM (its stacks through the JIT go to user space
    with their copy) beside JIT code of a process running no JVM and a
    process without JIT code (both walked in the kernel)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from python_pass_cost import one_cost
    jit = os.path.join(classes, "jit")
    subprocess.run(["gcc", "-O2", "-g", "-fomit-frame-pointer", "-o", jit,
                    str(REPO / "tests" / "programs" / "jit.c")], check=True)
    # ~2 s of CPU through its JIT code; the perf map it writes removed after
    through_jit = (f"sh -c '\"$0\" 200000000 & p=$!; wait $p; rm -f /tmp/perf-$p.map' {jit}")
    rows = []
    for label, command in (("java JavaMix (deferred: stack copied)",
                            f"java -cp {classes} JavaMix 2"),
                           ("tests/programs/jit.c, its JIT code, no JVM (walked in the kernel)",
                            through_jit),
                           ("sh busy loop (no JIT)", "timeout 2 sh -c 'while :; do :; done'")):
        rows.append((label, statistics.median(one_cost(None, command) for _ in range(reps))))
    return rows


def main() -> None:
    tmp = tempfile.mkdtemp(prefix="ustack-java-")
    try:
        run(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)      # the classes and JFR's recordings


def run(tmp: str) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--cost-only", action="store_true", help="the cost table alone")
    ap.add_argument("--scopes", default="-p;-c;-p, no JFR;whole machine;"
                    "whole machine, started during", help="which, ';' between them")
    ap.add_argument("--jdk", help="the JDK's home (its bin/ first on the PATH)")
    args = ap.parse_args()
    if args.jdk:
        os.environ["PATH"] = f"{Path(args.jdk) / 'bin'}:{os.environ.get('PATH', '')}"
    subprocess.run(["javac", "-d", tmp, str(MIX)], check=True)
    version = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr
    print(f"{version.splitlines()[0]}, bench/programs/JavaMix.java for {args.seconds:g} s "
          f"of CPU, profile:hz:199, backend bpf, load average {os.getloadavg()[0]:.1f}\n")
    print("| scope | Java samples (main) | whole (named, to clone3) | in stubs | "
          "top-10 max difference (points) |")
    print("|---|---:|---:|---:|---:|")
    tables = []
    for _rep in range(0 if args.cost_only else args.reps):
        for scope in args.scopes.split(";"):
            java, whole, stub, ours, theirs = scope_run(scope, tmp, args.seconds, tmp)
            rows = compare(ours, theirs) if theirs else []
            worst = f"{max(abs(r[3]) for r in rows):.1f}" if rows else "-"
            print(f"| {scope} | {java} | {100 * whole / max(java, 1):.1f} % | "
                  f"{100 * stub / max(java, 1):.1f} % | {worst} |")
            shared = sum(ours.values()) or 1
            tables.append((scope, rows or [(k, 100 * n / shared, float("nan"), float("nan"))
                                           for k, n in ours.most_common(10)]))
    for scope, rows in tables:
        print(f"\n{scope}: {'JFR' if rows and rows[0][2] == rows[0][2] else 'ustack'}'s "
              "top 10, share of main's Java samples\n")
        print("| method | ustack % | JFR % | difference |")
        print("|---|---:|---:|---:|")
        for name, a, b, d in rows:
            print(f"| {name} | {a:.1f} | {b:.1f} | {d:+.1f} |" if b == b
                  else f"| {name} | {a:.1f} | - | - |")
    cost = walk_cost(tmp, args.seconds)
    print("\nuser-space walk per copied sample of the JVM (µs, median; -c run each)\n")
    print("| walk | µs per sample | frames per sample | samples |")
    print("|---|---:|---:|---:|")
    for label, (us, n, depth) in cost.items():
        what = ("Java frames (hotspot_live) + native CFI" if label == "java"
                else "DWARF/frame pointer only (--no-java)")
        print(f"| {what} | {us:.0f} | {depth:g} | {n} |")
    print(f"\nthe in-kernel walking program's ns per sample (BPF statistics, median of "
          f"{max(args.reps, 3)})\n")
    print("| process | ns per sample |")
    print("|---|---:|")
    for label, ns in kernel_cost(tmp, max(args.reps, 3)):
        print(f"| {label} | {ns:.0f} |")


if __name__ == "__main__":
    main()
