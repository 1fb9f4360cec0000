#!/usr/bin/env python3
"""Ruby, PHP and Perl frames in the stacks ustack unwinds itself from their
copies (unwind/script_live.py): how many of a busy script's samples carry
its whole chain when every stack is copied, and what reading the frames
from the live process costs per stack.

Two ways every stack is a copy: the BPF backend with an in-kernel rows
table too small for the interpreter's rows (--unwind-memory 1: the kernel
hands each stack over unwalked, as it does a process's first samples
before its rows are in), and --backend perf --unwind dwarf. The scripts
are the tests' (tests/programs/ruby/calls.rb, php/chain.php,
perl/calls.pl), run by -c for 1 s of CPU at 199 Hz; the kernel-walked
run (the defaults) beside them. A sample carries the chain when its
script frames, outermost first, are exactly the tests' chain (PHP: the
chain, with cpu_seconds or getrusage above it or not); the denominator is
every sample of the script while it ran (Ruby: every sample; PHP: those
under php_execute_script; Perl: those in Work::c).

    sudo python3 bench/script_frames_copied.py [--reps R]

Prints Markdown."""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))
PROGRAMS = REPO / "tests" / "programs"
RUNTIMES = {
    "ruby": (f"ruby {PROGRAMS / 'ruby' / 'calls.rb'} 1", "ruby",
             ["<main>", "Object#a", "block in Object#a", "Object#b", "Worker#c"]),
    "php": (f"php {PROGRAMS / 'php' / 'chain.php'} 1", "php",
            ["{main}", "a", "b", "Spinner::spin"]),
    "perl": (f"perl {PROGRAMS / 'perl' / 'calls.pl'} 1500", "perl",
             ["<main>", "main::a", "main::b", "Work::c"]),
}
WAYS = {"kernel-walked (defaults)": {},
        "rows did not fit (--unwind-memory 1)": {"unwind_memory": 1 << 20},
        "--backend perf --unwind dwarf": {"backend": "perf", "unwind": "dwarf"}}


def run(runtime: str, way: dict) -> tuple:
    """(samples carrying the chain, samples judged, merge calls, their
    median us) of one -c profile."""
    import ustack
    from ustack.unwind import script_live
    cmdline, kind, chain = RUNTIMES[runtime]
    took: list = []
    merge = script_live.ScriptLive.merge

    def timed(self, *args, **kwargs):
        t = time.perf_counter_ns()
        try:
            return merge(self, *args, **kwargs)
        finally:
            took.append(time.perf_counter_ns() - t)
    script_live.ScriptLive.merge = timed
    try:
        opts = ustack.Options(command="profile", events=["profile:hz:199"],
                              cmdline=cmdline, **dict({"backend": "bpf"}, **way))
        with ustack.Session(opts) as session:
            counted = session.counts()
    finally:
        script_live.ScriptLive.merge = merge
    whole = judged = 0
    for c in counted:
        names = [f.function for f in c.stack.frames]
        script = [f.function for f in reversed(c.stack.frames) if f.kind == kind]
        if runtime == "php" and "php_execute_script" not in names:
            continue
        if runtime == "perl" and "Work::c" not in names:
            continue
        judged += c.count
        if script == chain or (runtime == "php" and script[:len(chain)] == chain):
            whole += c.count
    return whole, judged, len(took), statistics.median(took) / 1000 if took else 0.0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f} at the start\n")
    print("| script | stacks | chain carried (each run) | merge, median us a stack |")
    print("|---|---|---|---:|")
    for runtime in RUNTIMES:
        for label, way in WAYS.items():
            cells, costs = [], []
            for _ in range(a.reps):
                whole, judged, calls, us = run(runtime, way)
                cells.append(f"{whole}/{judged} ({100 * whole / max(judged, 1):.1f} %)")
                if calls:
                    costs.append(us)
            cost = f"{statistics.median(costs):.0f}" if costs else "-"
            print(f"| {runtime} | {label} | {', '.join(cells)} | {cost} |")
    print(f"\nload average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
