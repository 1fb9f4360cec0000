#!/usr/bin/env python3
"""Perl frames in stacks: how many of a busy Perl script's samples carry
its call chain, in order and named, down to _start, and what the Perl pass
costs the in-kernel walk per sample (the kernel's BPF statistics), beside
the Python pass on a Python program and on a process that runs neither.

    sudo python3 bench/perl_frames.py [--seconds S] [--reps R]

The script: tests/programs/perl/calls.pl, <main> -> main::a -> main::b ->
Work::c spinning. A sample is in c when a frame names Work::c; it is whole
when its Perl frames are exactly that chain with calls.pl's lines and it
ends at _start. Scopes: -c, -p (a perl already running), whole machine
with a perl running before it starts and with one started once the run
samples (its pid's stacks).
Prints Markdown."""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))
CALLS = REPO / "tests" / "programs" / "perl" / "calls.pl"
FRAMES_PY = REPO / "tests" / "programs" / "python" / "frames.py"
CHAIN = [("<main>", 37), ("main::a", 32), ("main::b", 30)]


def counts(**scope) -> list:
    import ustack
    opts = ustack.Options(command="profile", events=["profile:hz:199"], backend="bpf", **scope)
    with ustack.Session(opts) as run:
        return run.counts()


def shares(counted: list, pid: int | None = None) -> tuple:
    """(samples in Work::c, whole ones)."""
    in_c = whole = 0
    for c in counted:
        if pid is not None and c.pid != pid:
            continue
        perl = [(f.function, f.line) for f in reversed(c.stack.frames) if f.kind == "perl"]
        if "Work::c" not in [f.function for f in c.stack.frames]:
            continue
        in_c += c.count
        if perl[:3] == CHAIN and len(perl) == 4 and perl[3][0] == "Work::c" \
                and perl[3][1] in (10, 11, 12) and c.stack.frames[-1].function == "_start":
            whole += c.count
    return in_c, whole


def by_command(seconds: float) -> tuple:
    return shares(counts(cmdline=f"perl {CALLS} {int(seconds * 1000)}"))


def by_pid(seconds: float) -> tuple:
    proc = subprocess.Popen(["perl", str(CALLS)], stdout=subprocess.PIPE, text=True)
    try:
        proc.stdout.readline()
        return shares(counts(pid=proc.pid, duration=seconds))
    finally:
        proc.kill()
        proc.wait()


def running_before(seconds: float) -> tuple:
    """A perl running before a whole-machine run starts: its pid's stacks
    (its first samples come before perl's rows are loaded: ustack unwinds
    those from their copies, unwind/perl_live.py)."""
    proc = subprocess.Popen(["perl", str(CALLS)], stdout=subprocess.PIPE, text=True)
    try:
        proc.stdout.readline()
        return shares(counts(pids=(proc.pid,), duration=seconds), proc.pid)
    finally:
        proc.kill()
        proc.wait()


def whole_machine(seconds: float) -> tuple:
    """The perl started once a whole-machine run samples (started_during.py)."""
    from started_during import stacks_of_program_started_during
    stacks = stacks_of_program_started_during(["perl", CALLS, int(seconds * 1000)])
    in_c = whole = 0
    for s in stacks:
        frames = s["frames"]
        names = [f.get("function") for f in frames]
        if "Work::c" not in names:
            continue
        in_c += s["count"]
        perl = [(f["function"], f.get("line")) for f in reversed(frames)
                if f.get("kind") == "perl"]
        if perl[:3] == CHAIN and len(perl) == 4 and names[-1] == "_start":
            whole += s["count"]
    return in_c, whole


from script_pass_cost import one_run  # noqa: E402 (bench/ is this script's path: one stats run for every pass)


# target: (command line, the flag that turns its pass off)
TARGETS = {
    "perl calls.pl (Perl pass)": (f"perl {CALLS} 2000", "--no-perl"),
    "python3 frames.py busy (Python pass)": (f"python3 {FRAMES_PY} busy 2", "--no-python"),
    "sh loop: neither (Perl pass on/off)": ("sh -c 'i=0; while [ $i -lt 1500000 ]; do "
                                            "i=$((i+1)); done'", "--no-perl"),
}


def one_cost(cmd: str, flag: str | None) -> tuple:
    """(runs, ns per run) of the unwinder program over a profile of cmd."""
    return one_run("ustack_uw0", ["profile", "-F", "499", *([flag] if flag else []), "-c", cmd])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--cost-only", action="store_true")
    ap.add_argument("--shares-only", action="store_true")
    a = ap.parse_args()
    print(f"perl {subprocess.run(['perl', '-e', 'print $^V'], capture_output=True, text=True).stdout}"
          f"; profile at 199 Hz, {a.seconds:g} s of work a run")
    print()
    print("| scope | samples in Work::c | whole chain to _start | share |")
    print("|---|---:|---:|---:|")
    scopes = () if a.cost_only else (
        ("-c", by_command), ("-p", by_pid),
        ("whole machine, perl running before the run", running_before),
        ("whole machine, perl started during the run", whole_machine))
    for scope, run in scopes:
        for _ in range(a.reps):
            in_c, whole = run(a.seconds)
            print(f"| {scope} | {in_c} | {whole} | {100 * whole / max(in_c, 1):.1f} % |")
            time.sleep(0.2)
    if a.shares_only:
        return
    print()
    print(f"Per-sample cost of the unwinder's program (ustack_uw0, BPF_ENABLE_STATS), "
          f"median of {a.reps}, pass off and on interleaved:")
    print()
    print("| target | samples | ns/sample, pass off | ns/sample, pass on | added |")
    print("|---|---:|---:|---:|---:|")
    for target, (cmd, flag) in TARGETS.items():
        off, on, runs = [], [], []
        for _ in range(a.reps):
            off.append(one_cost(cmd, flag)[1])
            n, ns = one_cost(cmd, None)
            on.append(ns)
            runs.append(n)
        m_off, m_on = statistics.median(off), statistics.median(on)
        print(f"| {target} | {int(statistics.median(runs))} | {m_off:.0f} | {m_on:.0f} "
              f"| {m_on - m_off:+.0f} ({m_on / m_off:.2f}x) |")


if __name__ == "__main__":
    main()
