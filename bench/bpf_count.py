#!/usr/bin/env python3
"""Stacks counted in the kernel: ustack's bpf backend vs its perf backend,
bpftrace, perf record -g and a bare uprobe, one run.

    sudo python3 bench/bpf_count.py [--quick]

Builds tests/programs/chain.c (-O2 -fno-omit-frame-pointer), puts a uprobe on
`d` and runs `chain N` (d is hit N times) under each tool, round-robin, REPS
times; medians are reported (columns as in bench/uprobe_rate.py):

  wall / µs/event / events / lost / ÷ perf
  bare uprobe      `perf stat -e` on the probe: the kernel counts hits, no stack
  start-up         ms from launching the tool to the first instruction of the
                   traced command (`date +%s.%N` run with -c): probes attached
  without start-up (wall(N) - wall(1 hit)) / (N - 1): the cost of one event
                   alone, without the tool's fixed start-up and exit costs

Prints Markdown and writes it to bench/results/.
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
from uprobe_rate import (PERF_EVENT, Failed, Run, baseline, bpftrace,  # noqa: E402
                         lost_count, perf_probe, perf_record, run_options, run_rounds,
                         table, timed,
                         write_report)
from helpers import O2_FP, build, ustack_env  # noqa: E402  (path set by uprobe_rate)

BPFTRACE = "bpftrace @[ustack]=count()"


def _ustack(backend: str):
    def tool(prog, n, tmp, timeout):
        wall, out, err = timed([sys.executable, "-m", "ustack", "count", f"uprobe:{prog}:d",
                                "--backend", backend, "-c", f"{prog} {n}"],
                               timeout, env=ustack_env())
        if f"[backend {backend}," not in err:
            raise Failed(f"not the {backend} backend: {err.splitlines()[:1]}")
        counts = re.findall(r"^\s{4}(\d+)\s*$", out, re.M)
        dropped = sum(int(x) for x in re.findall(r"(\d+) events were not counted", err))
        return Run(wall, sum(map(int, counts)) if counts else None,
                   lost_count(err) + dropped)
    return tool


def bare_uprobe(prog, n, tmp, timeout):
    wall, _, err = timed(["perf", "stat", "-x,", "-e", PERF_EVENT, "--", prog, str(n)],
                         timeout)
    hits = re.search(r"^(\d+),", err, re.M)
    return Run(wall, int(hits.group(1)) if hits else None, 0)


# --- start-up: launch → the traced command's first instruction -----------------

def _startup_cmd(name: str, prog: str) -> list[str] | None:
    date = "/usr/bin/date +%s.%N"
    if name.startswith("ustack count --backend"):
        backend = name.split()[-1]
        return [sys.executable, "-m", "ustack", "count", f"uprobe:{prog}:d",
                "--backend", backend, "-c", date]
    if name == BPFTRACE:
        return ["bpftrace", "-e", f"uprobe:{prog}:d {{ @[ustack] = count(); }}", "-c", date]
    if name == "perf record -g":
        return ["perf", "record", "-q", "-e", PERF_EVENT, "-g", "-o", "/dev/null",
                "--", "/usr/bin/date", "+%s.%N"]
    return None


def startup_ms(cmd: list[str], timeout: float) -> float:
    start = time.time()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                         env=ustack_env()).stdout
    m = re.search(r"^(\d+\.\d+)$", out, re.M)
    if not m:
        raise Failed("no time printed by the traced command")
    return (float(m.group(1)) - start) * 1000


def main():
    args, n, reps, out = run_options(__doc__, "bpf_count")

    prog = str(build("chain", flags=O2_FP))
    tools = {"uninstrumented": baseline,
             "bare uprobe (perf stat, no stack)": bare_uprobe,
             "ustack count --backend bpf": _ustack("bpf"),
             "ustack count --backend perf": _ustack("perf"),
             BPFTRACE: bpftrace,
             "perf record -g": perf_record}
    results: dict = {name: [] for name in tools}
    startup: dict = {name: [] for name in tools if _startup_cmd(name, prog)}
    fixed: dict = {name: [] for name in tools}
    for name, exe in [("perf record -g", "perf"), ("bare uprobe (perf stat, no stack)", "perf"),
                      (BPFTRACE, "bpftrace")]:
        if not shutil.which(exe):
            results[name] = f"absent ({exe} not installed)"
            startup.pop(name, None)

    with tempfile.TemporaryDirectory(prefix="bpf_count.") as tmp:
        try:
            if shutil.which("perf"):
                perf_probe(prog, add=True)
            def measure(name, tool):
                results[name].append(tool(prog, n, Path(tmp), args.timeout))
                # the same tool on one hit: its fixed cost, to subtract
                fixed[name].append(tool(prog, 1, Path(tmp), args.timeout).wall)
                if name in startup:
                    startup[name].append(startup_ms(_startup_cmd(name, prog), args.timeout))
            run_rounds(tools, results, reps, measure)
        finally:
            if shutil.which("perf"):
                perf_probe(prog, add=False)

    rows = ["| tool | start-up ms (launch → command runs) | wall s, 1 hit "
            "| µs/event without start-up/exit |", "|---|---:|---:|---:|"]
    for name, runs in results.items():
        if name == "uninstrumented" or isinstance(runs, str) or not runs:
            continue
        one = statistics.median(fixed[name])
        net = (statistics.median(r.wall for r in runs) - one) / (n - 1) * 1e6
        ms = f"{statistics.median(startup[name]):.0f}" if startup.get(name) else "-"
        rows.append(f"| {name} | {ms} | {one:.3f} | {net:.2f} |")
    load = " ".join(open("/proc/loadavg").read().split()[:3])
    md = (f"## In-kernel stack counting: a uprobe on `d` hit {n:,} times\n\n"
          f"`chain {n}` built -O2 -fno-omit-frame-pointer; medians of {reps} run(s); "
          f"{time.strftime('%Y-%m-%d')}, kernel {platform.release()}, "
          f"{os.cpu_count()} CPUs, loadavg at the end {load}. µs/event includes "
          "tool start-up and exit.\n\n"
          + table(results, n) + "\n\n" + "\n".join(rows) + "\n")
    write_report(md, out)


if __name__ == "__main__":
    main()
