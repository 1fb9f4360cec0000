#!/usr/bin/env python3
"""A stack and an argument per uprobe hit on a binary without frame
pointers: `ustack trace 'uprobe:chain:d i'` unwinding in the kernel (its BPF
program fetches `i`) vs the copy path (perf backend: the kernel's uprobe
fetches `i`, 8 KiB of stack copied per event and unwound by ustack) vs
bpftrace (`printf` of arg0 and `print(ustack)`, frame pointers only), one run.

    sudo python3 bench/trace_args.py [--quick] [-n N] [--reps R]

Builds tests/programs/chain.c -O2 -fomit-frame-pointer and runs `chain N`
(d is hit N times) under each tool, output to /dev/null. Tools alternate
round by round, medians of REPS runs:

  wall        seconds for the whole command, start-up and exit included
  µs/event    (wall - uninstrumented wall) / N
  events      N - lost (what the program did less what the tool says it lost)
  lost        what the tool says it lost
  frames      frames of the first event: d c b a main … is the whole stack

Prints a Markdown table and writes it to bench/results/trace_args.md.
"""
from __future__ import annotations

import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from uprobe_rate import (Failed, Run, baseline, fmt, lost_count, run_options,  # noqa: E402
                         run_rounds, timed, write_report)
from helpers import O2_NOFP, build, ustack_env  # noqa: E402


def ustack(backend: str, args: str = " i"):
    def run(prog, n, tmp, timeout):
        wall, _, err = timed([sys.executable, "-m", "ustack", "trace", "--backend", backend,
                              f"uprobe:{prog}:d{args}", "-c", f"{prog} {n}"], timeout,
                             stdout=subprocess.DEVNULL, env=ustack_env())
        lost = lost_count(err)
        return Run(wall, n - lost, lost)
    return run


CRASHES: list = []                    # bpftrace's runs that died, why


def bpftrace(prog, n, tmp, timeout):
    try:
        wall, out, err = timed(["bpftrace", "-e",
                                f'uprobe:{prog}:d {{ printf("%d\\n", arg0); print(ustack); }}',
                                "-c", f"{prog} {n}"], timeout, stdout=subprocess.DEVNULL)
    except Failed as e:
        # bpftrace 0.17 may abort while symbolizing after the program
        # exited (read_symlink /proc/PID/exe): counted, not timed
        CRASHES.append(str(e))
        return None
    lost = lost_count(out + err)
    return Run(wall, n - lost, lost)


def first_frames(cmd: list) -> str:
    """The functions of the first event's stack, as the tool prints them
    (asked up to 3 times: bpftrace may exit before its output is read)."""
    for _ in range(3):
        out = subprocess.run(cmd, capture_output=True, text=True, env=ustack_env(),
                             timeout=60).stdout
        for block in re.split(r"\n\s*\n", out):        # one stack per block
            names = re.findall(r"^\s+(?:0x[0-9a-f]+ : )?([A-Za-z_][\w.]*)", block, re.M)
            if names:
                return " ".join(names[:6])
    return "-"


def main():
    args, n, reps, out = run_options(__doc__, "trace_args")
    prog = str(build("chain", flags=O2_NOFP))
    tools = {"uninstrumented": baseline,
             "ustack trace --backend bpf (in-kernel DWARF, BPF fetches i)": ustack("bpf"),
             "ustack trace --backend bpf, no argument": ustack("bpf", ""),
             "ustack trace --backend perf (8 KiB copied per event)": ustack("perf"),
             "bpftrace printf(arg0) + print(ustack)": bpftrace}
    results: dict = {name: [] for name in tools}
    if not shutil.which("bpftrace"):
        results["bpftrace printf(arg0) + print(ustack)"] = "absent (bpftrace not installed)"
    with tempfile.TemporaryDirectory(prefix="trace_args.") as tmp:
        def measure(name, tool):
            run = tool(prog, n, Path(tmp), args.timeout)
            if run is not None:
                results[name].append(run)
        run_rounds(tools, results, reps, measure)
    shapes = {
        "ustack trace --backend bpf (in-kernel DWARF, BPF fetches i)": first_frames(
            [sys.executable, "-m", "ustack", "trace", "--backend", "bpf",
             f"uprobe:{prog}:d i", "-c", f"{prog} 1"]),
        "ustack trace --backend perf (8 KiB copied per event)": first_frames(
            [sys.executable, "-m", "ustack", "trace", "--backend", "perf",
             f"uprobe:{prog}:d i", "-c", f"{prog} 1"]),
    }
    if shutil.which("bpftrace"):
        # 100 calls: with one, bpftrace may exit before it prints the stack
        shapes["bpftrace printf(arg0) + print(ustack)"] = first_frames(
            ["bpftrace", "-e", f"uprobe:{prog}:d {{ print(ustack); }}", "-c", f"{prog} 100"])
    base = statistics.median(r.wall for r in results["uninstrumented"])
    rows = ["| tool | wall s | µs/event | events | lost | frames of an event |",
            "|---|---:|---:|---:|---:|---|"]
    for name, runs in results.items():
        if isinstance(runs, str) or not runs:
            rows.append(f"| {name} | {runs or 'every run failed'} | | | | |")
            continue
        wall = statistics.median(r.wall for r in runs)
        if name == "uninstrumented":
            rows.append(f"| {name} | {wall:.3f} | | | | |")
            continue
        events = int(statistics.median(r.events for r in runs))
        lost = int(statistics.median(r.lost for r in runs))
        rows.append(f"| {name} | {wall:.3f} | {(wall - base) / n * 1e6:.2f} "
                    f"| {fmt(events)} | {fmt(lost)} | {shapes.get(name, '')} |")
    load = os.getloadavg()[0]
    md = (f"## trace with an argument: `trace 'uprobe:chain:d i'`\n\n"
          f"`chain {n}` built -O2 -fomit-frame-pointer (d's entry is single-stepped); "
          f"output to /dev/null; medians of {reps} run(s); {time.strftime('%Y-%m-%d')}, "
          f"kernel {platform.release()}, {os.cpu_count()} CPUs shared with other work "
          f"(load average {load:.1f} at the end). µs/event includes tool start-up and "
          "exit; events = N - lost.\n\n" + "\n".join(rows) + "\n"
          + (f"\nbpftrace died in {len(CRASHES)} of {reps} runs ({CRASHES[0][:110]}); "
             "its row is the median of the others.\n" if CRASHES else ""))
    write_report(md, out)


if __name__ == "__main__":
    main()
