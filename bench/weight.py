#!/usr/bin/env python3
"""Weighted stacks in the kernel: `ustack count --weight arg0` vs plain
`count` on the bpf backend (DWARF and frame-pointer counters) and
bpftrace's `@[ustack] = sum(arg0)` vs its `count()`, one run.

    sudo python3 bench/weight.py [--quick]

Builds tests/programs/chain.c (-O2 -fno-omit-frame-pointer), puts a uprobe on
`d` and runs `chain N`: d(i) is called for i = 0…N-1, so the sum of arg0
is N(N-1)/2, which every weighted run must report. Tools alternate, REPS
rounds; medians. µs/event without start-up: (wall(N) - wall(1 hit)) / (N - 1);
target CPU µs/event: the same from the CPU time (user + system, where the
uprobe's trap and the BPF program are charged) of `chain` itself, run
under /usr/bin/time: less swayed than wall time by the machine's other load;
BPF ns/run: the kernel's own count of the tools' programs
(kernel.bpf_stats_enabled, on for the run; ustack's weighted program counts
the counting program it tail-calls too).

Prints Markdown and writes it to bench/results/.
"""
from __future__ import annotations

import os
import platform
import re
import shutil
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from uprobe_rate import (PERF_EVENT, Failed, Run, lost_count,  # noqa: E402
                         run_options, run_rounds, timed, write_report)
from helpers import O2_FP, build, ustack_env  # noqa: E402  (path set by uprobe_rate)
from offcpu import BPF_STATS, timed_bpf  # noqa: E402


TIME = "/usr/bin/time -f cpu=%S+%U"       # the target's CPU seconds, on stderr
                                          # (no spaces: bpftrace -c splits on them)


def cpu_seconds(err: str) -> float | None:
    m = re.search(r"^cpu=([0-9.]+)\+([0-9.]+)$", err, re.M)
    return float(m.group(1)) + float(m.group(2)) if m else None


def _ustack(*extra: str):
    def tool(prog, n, timeout):
        wall, out, err, ns = timed_bpf(
            [sys.executable, "-m", "ustack", "count", f"uprobe:{prog}:d", "--backend", "bpf",
             *extra, "-c", f"{TIME} {prog} {n}"], timeout, env=ustack_env())
        if "[backend bpf," not in err:
            raise Failed(f"not the bpf backend: {err.splitlines()[:1]}")
        values = re.findall(r"^\s{4}(-?\d+)(?: \(sum of .*\))?$", out, re.M)
        dropped = sum(int(x) for x in re.findall(r"(\d+) events were not counted", err))
        return Run(wall, sum(map(int, values)) if values else None,
                   lost_count(err) + dropped), cpu_seconds(err), ns
    return tool


def _bpftrace(action: str):
    def tool(prog, n, timeout):
        # bpftrace prints "ERROR: ... RLIMIT_MEMLOCK" here yet works: judge by exit status
        wall, out, err, ns = timed_bpf(
            ["bpftrace", "-e", f"uprobe:{prog}:d {{ @[ustack] = {action}; }}",
             "-c", f"{TIME} {prog} {n}"], timeout)
        values = re.findall(r"\]:\s*(-?\d+)", out)
        return (Run(wall, sum(map(int, values)) if values else None, lost_count(out + err)),
                cpu_seconds(err), ns)
    return tool


def bare_uprobe(prog, n, timeout):
    wall, _, err = timed(["perf", "stat", "-x,", "-e", PERF_EVENT, "--", *TIME.split(), prog,
                          str(n)], timeout)
    hits = re.search(r"^(\d+),", err, re.M)
    return Run(wall, int(hits.group(1)) if hits else None, 0), cpu_seconds(err), None


def uninstrumented(prog, n, timeout):
    wall, _, err = timed([*TIME.split(), prog, str(n)], timeout)
    return Run(wall), cpu_seconds(err), None


def main():
    args, n, reps, out = run_options(__doc__, "weight")
    prog = str(build("chain", flags=O2_FP))
    tools = {"uninstrumented": uninstrumented,
             "bare uprobe (perf stat, no stack)": bare_uprobe,
             "ustack count --backend bpf": _ustack(),
             "ustack count --backend bpf --weight arg0": _ustack("--weight", "arg0"),
             "ustack count --backend bpf --unwind fp": _ustack("--unwind", "fp"),
             "ustack count --backend bpf --unwind fp --weight arg0":
                 _ustack("--unwind", "fp", "--weight", "arg0"),
             "bpftrace @[ustack] = count()": _bpftrace("count()"),
             "bpftrace @[ustack] = sum(arg0)": _bpftrace("sum(arg0)")}
    results: dict = {name: [] for name in tools}
    fixed: dict = {name: [] for name in tools}
    cpu: dict = {name: [] for name in tools}         # CPU s of N hits - of 1 hit
    bpf_ns: dict = {name: [] for name in tools}      # ns per run of its BPF programs
    for name, exe in (("bare uprobe (perf stat, no stack)", "perf"),
                      ("bpftrace @[ustack] = count()", "bpftrace"),
                      ("bpftrace @[ustack] = sum(arg0)", "bpftrace")):
        if not shutil.which(exe):
            results[name] = f"absent ({exe} not installed)"
    if shutil.which("perf"):
        from uprobe_rate import perf_probe
        perf_probe(prog, add=True)
    stats_was = Path(BPF_STATS).read_text()
    Path(BPF_STATS).write_text("1")
    try:
        def measure(name, tool):
            run, cpu_n, ns = tool(prog, n, args.timeout)
            one, cpu_1, _ns = tool(prog, 1, args.timeout)
            results[name].append(run)
            fixed[name].append(one.wall)
            if cpu_n is not None and cpu_1 is not None:
                cpu[name].append(cpu_n - cpu_1)
            if ns is not None:
                bpf_ns[name].append(ns)
        run_rounds(tools, results, reps, measure)
    finally:
        Path(BPF_STATS).write_text(stats_was)
        if shutil.which("perf"):
            perf_probe(prog, add=False)

    want = {"count": n, "sum": n * (n - 1) // 2}
    rows = ["| tool | BPF ns/run | target CPU µs/event | µs/event without start-up/exit "
            "| wall s, N hits | wall s, 1 hit | hits or sum reported | right | lost |",
            "|---|---:|---:|---:|---:|---:|---:|---|---:|"]
    base_cpu = statistics.median(cpu["uninstrumented"]) if cpu["uninstrumented"] else 0
    for name, runs in results.items():
        if isinstance(runs, str):
            rows.append(f"| {name} | {runs.replace('|', '/')} | | | | | | | |")
            continue
        wall, one = statistics.median(r.wall for r in runs), statistics.median(fixed[name])
        if name == "uninstrumented":
            rows.append(f"| {name} | | | | {wall:.3f} | {one:.3f} | | | |")
            continue
        net = (wall - one) / (n - 1) * 1e6
        cpu_us = ((statistics.median(cpu[name]) - base_cpu) / (n - 1) * 1e6
                  if cpu[name] else None)
        values = {r.events for r in runs}
        wanted = want["sum" if "sum" in name or "weight" in name else "count"]
        right = "yes" if values == {wanted} else f"no (want {wanted:,})"
        shown = ", ".join(f"{v:,}" for v in sorted(v for v in values if v is not None))
        lost = statistics.median(r.lost or 0 for r in runs)
        ns = f"{statistics.median(bpf_ns[name]):.0f}" if bpf_ns[name] else "-"
        rows.append(f"| {name} | {ns} | {'-' if cpu_us is None else f'{cpu_us:.2f}'} "
                    f"| {net:.2f} | {wall:.3f} | {one:.3f} | {shown} | {right} | {lost:,.0f} |")
    load = " ".join(open("/proc/loadavg").read().split()[:3])
    md = (f"## Weighted stacks: a uprobe on `d(i)` hit {n:,} times, summing arg0\n\n"
          f"`chain {n}` built -O2 -fno-omit-frame-pointer; medians of {reps} run(s); "
          f"{time.strftime('%Y-%m-%d')}, kernel {platform.release()}, "
          f"{os.cpu_count()} CPUs, loadavg at the end {load}. The sum of arg0 is "
          f"N(N-1)/2 = {want['sum']:,}.\n\n" + "\n".join(rows) + "\n")
    write_report(md, out)


if __name__ == "__main__":
    main()
