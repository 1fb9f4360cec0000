#!/usr/bin/env python3
"""node with default flags: how many of its JS samples ustack names and
walks to _start, and how its top JS functions compare with V8's own
profiler (`node --cpu-prof`) on the same run of bench/programs/v8_mix.js;
then what naming JS frames costs the in-kernel walk per sample (the
kernel's BPF statistics), on node and on a process that runs no V8.

    sudo python3 bench/v8_frames.py [--seconds S] [--runs N] [--reps R] [--cost-only]

Scopes: -c (the profiled command is node --cpu-prof itself), -p (a node
--cpu-prof already running), whole machine (kept to that node's pid),
whole machine with node started once the run samples (the `ustack`
command's JSON, that node's stacks).
A sample is a JS sample when it holds a JS frame; it is whole when it
ends at _start with every JS frame named. A function's share is the
samples whose innermost JS frame of a script it is (ustack names V8's
builtins written in JS too, sort or Map's set, which have no script:
cpu-prof gives their time to their caller), over the JS samples;
cpu-prof's: the samples of its node, (program), (idle) and (garbage
collector) left out.
Like with like: cpu-prof's samples are kept to the time ustack sampled
(V8 stamps them on CLOCK_MONOTONIC, as time.monotonic), ustack's samples
in V8's garbage collector are left out as cpu-prof's (garbage collector)
is, and a cpu-prof node of code without a script (`RegExp: <pattern>`, the
regexp's compiled code) is its scripted caller's, as ustack counts a
builtin's time. ustack samples at 997 Hz (--hz), about as often as
cpu-prof does (one a millisecond): five times the samples of 199 Hz, so
a share's own sampling noise is well inside the bound it is held to.
Prints Markdown: one row a scope and run, the top-10 tables of the first
run and of any run more than 5 points off."""
from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
MIX = REPO / "bench" / "programs" / "v8_mix.js"
CPU_PROF_LEFT_OUT = {"(program)", "(idle)", "(garbage collector)", "(root)"}
# V8 runs its collector on the JS thread under these (VMState GC): cpu-prof
# gives such a sample to "(garbage collector)", not to the JS function below
V8_GC = ("v8::internal::Heap::CollectGarbage", "v8::internal::IncrementalMarking::")


HZ = [997]                      # ustack's sampling frequency (--hz)
UNWIND_MEMORY: list = []        # --unwind-memory MIB given to every run (its rows not fitting)


def ustack_counts(**scope) -> tuple:
    """(counted stacks, (first, last) CLOCK_MONOTONIC second ustack sampled)."""
    import ustack
    if UNWIND_MEMORY:
        scope["unwind_memory"] = UNWIND_MEMORY[0] << 20
    opts = ustack.Options(command="profile", events=[f"profile:hz:{HZ[0]}"], backend="bpf", **scope)
    run = ustack.Session(opts)
    with run:                   # the probes are live once open
        first = time.monotonic()
        counted = run.counts()
        return counted, (first, time.monotonic())


def ustack_shares(counted: list, pid: int | None = None) -> tuple:
    """(JS samples, whole ones, Counter of innermost JS function -> samples)."""
    js = whole = 0
    top: collections.Counter = collections.Counter()
    for c in counted:
        if pid is not None and c.pid != pid:
            continue
        frames = c.stack.frames
        mine = [f for f in frames if f.kind == "js"]
        if not mine:
            continue
        js += c.count
        named = all(not f.function.startswith("[js ") for f in mine)
        whole += c.count * (named and frames[-1].function == "_start")
        if any(f.function and f.function.startswith(V8_GC) for f in frames):
            continue
        # V8's profiler shows no builtin (Array.prototype.sort, Map.prototype.set:
        # JS functions without a script): their time is their JS caller's
        scripted = [f for f in mine if f.module] or mine
        top[(scripted[0].function, scripted[0].module)] += c.count
    return js, whole, top


def cpu_prof_shares(path: str, window: tuple) -> collections.Counter:
    """Counter of innermost scripted function -> samples taken in window."""
    prof = json.load(open(path))
    by_id = {n["id"]: n for n in prof["nodes"]}
    parent = {child: n["id"] for n in prof["nodes"] for child in n.get("children", ())}
    top: collections.Counter = collections.Counter()
    stamp = prof["startTime"]           # microseconds; each delta is from the last sample
    for sample, delta in zip(prof["samples"], prof["timeDeltas"]):
        stamp += delta
        if not window[0] <= stamp / 1e6 <= window[1]:
            continue
        node = sample
        while not by_id[node]["callFrame"]["url"] and node in parent \
                and by_id[node]["callFrame"]["functionName"] not in CPU_PROF_LEFT_OUT:
            node = parent[node]         # code without a script: its caller's time
        frame = by_id[node]["callFrame"]
        name = frame["functionName"] or "(anonymous)"
        if name in CPU_PROF_LEFT_OUT:
            continue
        top[(name, os.path.basename(frame["url"]))] += 1
    return top


def compare(ours: collections.Counter, theirs: collections.Counter) -> list:
    """Rows (function, ours %, theirs %, difference) of cpu-prof's top 10."""
    n_ours, n_theirs = sum(ours.values()) or 1, sum(theirs.values()) or 1
    rows = []
    for key, n in theirs.most_common(10):
        a, b = 100 * ours.get(key, 0) / n_ours, 100 * n / n_theirs
        rows.append((f"{key[0]} ({key[1]})", a, b, a - b))
    return rows


def scope_run(scope: str, seconds: float, tmp: str) -> tuple:
    """(JS samples, whole, ustack's shares, cpu-prof's shares) of one scope."""
    prof_dir = tempfile.mkdtemp(dir=tmp)
    node = f"node --cpu-prof --cpu-prof-dir={prof_dir} {MIX} {int(seconds * 1000)}"
    if scope == "-c":
        counted, window = ustack_counts(cmdline=node)
        pid = None
    elif scope == STARTED_DURING:
        counted, pid = started_during(node.split(), seconds)
        window = (0, float("inf"))      # ustack sampled before node started, until it ended
    else:
        # node outlives a slow ustack start on a loaded machine (a -p run of
        # a node left 2 s more once had no sample): only the moments ustack
        # sampled are compared
        proc = subprocess.Popen(node.split()[:-1] + [str(int((seconds + 8) * 1000))],
                                stdout=subprocess.DEVNULL)
        time.sleep(0.5)         # past node's start-up: its steady loop is what is compared
        pid = proc.pid
        kw = {"pid": pid} if scope == "-p" else {"pids": (pid,)}
        counted, window = ustack_counts(duration=seconds, **kw)
        proc.wait()
    js, whole, ours = ustack_shares(counted, pid)
    theirs = cpu_prof_shares(glob.glob(os.path.join(prof_dir, "*.cpuprofile"))[0], window)
    return js, whole, ours, theirs


STARTED_DURING = "whole machine, node started during the run"
NOTES: list = []                # what the last started_during run said of its rows table
SCOPES = ("-c", "-p", "whole machine", STARTED_DURING)


def started_during(node: list, seconds: float) -> tuple:
    """(counted stacks as Counted-like rows, node's pid) of a whole-machine
    profile (the command, as a user runs it) that node starts under once
    its Tracing line says it samples."""
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    us = subprocess.Popen([sys.executable, "-m", "ustack", "profile", "-F", str(HZ[0]),
                           *(("--unwind-memory", str(UNWIND_MEMORY[0])) if UNWIND_MEMORY else ()),
                           "-f", "json"], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
    if not us.stderr.readline().startswith("Tracing"):
        raise SystemExit("ustack did not start")
    proc = subprocess.Popen(node, stdout=subprocess.DEVNULL)
    proc.wait()
    us.send_signal(signal.SIGINT)
    out, err = us.communicate(timeout=300)
    NOTES[:] = [line for line in err.splitlines() if "did not fit" in line]
    return [_Counted(s) for s in json.loads(out)["stacks"]], proc.pid


class _Counted:
    """A JSON stack as ustack_shares reads a Counted: pid, count, frames."""

    class _Frame:
        def __init__(self, f: dict):
            self.function, self.kind = f["function"], f.get("kind") or ""
            self.module = f.get("module") or ""

    class _Stack:
        def __init__(self, frames: list):
            self.frames = frames

    def __init__(self, s: dict):
        self.pid, self.count = s["pid"], s["count"]
        self.stack = self._Stack([self._Frame(f) for f in s["frames"]])


from python_pass_cost import cost  # noqa: E402 (bench/ is this script's path: one cost runner for every pass)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--reps", type=int, default=3, help="runs per cost median (0: no cost table)")
    ap.add_argument("--runs", type=int, default=1, help="runs of every scope, one row each")
    ap.add_argument("--hz", type=int, default=HZ[0], help="ustack's samples per second "
                    "(cpu-prof takes about 1000)")
    ap.add_argument("--cost-only", action="store_true", help="the cost table alone")
    ap.add_argument("--unwind-memory", type=int, help="MiB of in-kernel rows for every "
                    "run (1: node's do not fit, its stacks unwound from copies)")
    ap.add_argument("--scopes", default=";".join(SCOPES), help="which, ';' between them")
    args = ap.parse_args()
    HZ[0] = args.hz
    if args.unwind_memory:
        UNWIND_MEMORY.append(args.unwind_memory)
    tmp = tempfile.mkdtemp(prefix="ustack-v8-")
    print(f"node {subprocess.run(['node', '--version'], capture_output=True, text=True).stdout.strip()}"
          f", bench/programs/v8_mix.js for {args.seconds:g} s, profile:hz:{HZ[0]}, "
          f"load average {os.getloadavg()[0]:.1f}\n")
    print("| run | scope | JS samples | whole (named, to _start) | top-10 max difference (points) |")
    print("|---:|---|---:|---:|---|")
    tables = []
    for run in range(0 if args.cost_only else args.runs):
        for scope in args.scopes.split(";"):
            js, whole, ours, theirs = scope_run(scope, args.seconds, tmp)
            rows = compare(ours, theirs)
            worst = max(rows, key=lambda r: abs(r[3]), default=("-", 0, 0, float("nan")))
            print(f"| {run + 1} | {scope} | {js} | {100 * whole / max(js, 1):.1f} % | "
                  f"{abs(worst[3]):.1f} ({worst[0]}) |", flush=True)
            if run == 0 or abs(worst[3]) > 5:
                tables.append((f"{scope}, run {run + 1}", rows))
    if NOTES:           # its JS frames then come from ustack's unwinding of copies
        print(f"\n{STARTED_DURING}: {NOTES[0]}")
    for scope, rows in tables:
        print(f"\n{scope}: cpu-prof's top 10, share of JS samples\n")
        print("| function | ustack % | cpu-prof % | difference |")
        print("|---|---:|---:|---:|")
        for name, a, b, d in rows:
            print(f"| {name} | {a:.1f} | {b:.1f} | {d:+.1f} |")
    if args.reps:
        cost_table(args.reps)


def cost_table(reps: int) -> None:
    print("\nthe walking program's ns per sample (kernel BPF statistics, medians of "
          f"{reps}, interleaved)\n")
    print("| process | pass | on | off | ratio |")
    print("|---|---|---:|---:|---:|")
    python = ("import time\ndef f(n): return n if n < 2 else f(n - 1) + f(n - 2)\n"
              "end = time.time() + 2\nwhile time.time() < end: f(18)")
    for label, command, flag in (
            ("node v8_mix.js", f"node {MIX} 2000", "--no-js"),
            ("sh busy loop (no V8)", "timeout 2 sh -c 'while :; do :; done'", "--no-js"),
            ("python3, recursive fib (the Python walk)", f"python3 -c '{python}'",
             "--no-python")):
        on, off = cost(command, reps, flag)
        print(f"| {label} | {flag[5:]} | {on:.0f} | {off:.0f} | {on / off:.2f} |")


if __name__ == "__main__":
    main()
