#!/usr/bin/env python3
"""Function latency histograms: ustack latency vs bpftrace's uprobe +
uretprobe hist() one-liner (and bcc's funclatency where installed), one run.

    sudo python3 bench/latency.py [--quick] [-n N] [--reps R]

Builds tests/programs/chain.c (-O2 -fno-omit-frame-pointer) and times `d`,
which `chain N` calls N times in a tight loop, under each tool, round-robin,
REPS times (default 1); medians are reported:

  wall s           the whole run, start-up and exit included
  µs/call          (wall - uninstrumented) / N
  µs/call net      (wall(N) - wall(1 call)) / (N - 1): the cost of a call
                   without the tool's fixed start-up and exit
  calls            what the tool's histogram counted
  ÷ bpftrace       µs/call net over bpftrace's
The "bare uprobe" rows count hits of a uprobe at d's entry (`push %rbp`,
which the kernel emulates) and at its RET (which it single-steps) with
`perf stat`: what a return probe costs before any program runs.

Prints Markdown and writes it to bench/results/latency.md.
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
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))  # this ustack
from uprobe_rate import (Run, baseline, lost_count, run_options, run_rounds,  # noqa: E402
                         timed, write_report)
from helpers import O2_FP, build, ustack_env  # noqa: E402  (path set by uprobe_rate)

BPFTRACE = "bpftrace uprobe+uretprobe hist()"
FUNCLATENCY = "bcc funclatency"


def _ustack(*extra: str):
    def tool(prog, n, tmp, timeout):
        wall, out, err = timed([sys.executable, "-m", "ustack", "latency", *extra,
                                f"uprobe:{prog}:d", "-c", f"{prog} {n}"],
                               timeout, env=ustack_env())
        counts = re.findall(r": count (\d+),", out)
        return Run(wall, sum(map(int, counts)) if counts else None, lost_count(err))
    return tool


def bpftrace(prog, n, tmp, timeout):
    script = (f"uprobe:{prog}:d {{ @start[tid] = nsecs; }} "
              f"uretprobe:{prog}:d /@start[tid]/ {{ @ns = hist(nsecs - @start[tid]); "
              "delete(@start[tid]); }")
    wall, out, err = timed(["bpftrace", "-e", script, "-c", f"{prog} {n}"], timeout)
    counts = re.findall(r"^\[.*?\)\s+(\d+) \|", out, re.M)
    return Run(wall, sum(map(int, counts)) if counts else None, lost_count(out + err))


def _bare(where: str):
    """`perf stat` of a perf-probe uprobe at d+`where` (no program, no stack)."""
    def tool(prog, n, tmp, timeout):
        event = f"latbench_{where.replace('+', '_')}"
        subprocess.run(["perf", "probe", "-q", "-d", f"probe_chain:{event}"],
                       capture_output=True)
        subprocess.run(["perf", "probe", "-q", "-x", prog, "-a", f"{event}={where}"],
                       check=True, capture_output=True)
        try:
            wall, _, err = timed(["perf", "stat", "-x,", "-e", f"probe_chain:{event}",
                                  "--", prog, str(n)], timeout)
        finally:
            subprocess.run(["perf", "probe", "-q", "-d", f"probe_chain:{event}"],
                           capture_output=True)
        hits = re.search(r"^(\d+),", err, re.M)
        return Run(wall, int(hits.group(1)) if hits else None, 0)
    return tool


def _ret_offset(prog: str) -> str:
    """d+OFF of d's RET on the path chain takes (the first one)."""
    from ustack.objfile.elf import ElfImage
    from ustack.probes.return_sites import return_sites
    image = ElfImage.open(prog)
    (d,) = image.find("d")
    return f"d+{return_sites(image, d).rets[0] - d.address}"


def main():
    args, n, _reps, out = run_options(__doc__, "latency")
    reps = args.reps or 1
    prog = str(build("chain", flags=O2_FP))
    tools = {"uninstrumented": baseline,
             "bare uprobe at entry (perf stat, emulated push)": _bare("d"),
             "bare uprobe at RET (perf stat, single-stepped)": _bare(_ret_offset(prog)),
             "ustack latency (uretprobe)": _ustack(),
             "ustack latency --ret-sites (uprobe on each RET)": _ustack("--ret-sites"),
             "ustack latency --by-stack (entry stacks, DWARF in the kernel)":
                 _ustack("--by-stack"),
             BPFTRACE: bpftrace}
    results: dict = {name: [] for name in tools}
    fixed: dict = {name: [] for name in tools}
    if not shutil.which("perf"):
        for name in tools:
            if name.startswith("bare"):
                results[name] = "absent (perf not installed)"
    if not shutil.which("bpftrace"):
        results[BPFTRACE] = "absent (bpftrace not installed)"
    if not (shutil.which("funclatency-bpfcc") or shutil.which("funclatency")):
        results[FUNCLATENCY] = "absent (bcc's tools are not installed)"

    with tempfile.TemporaryDirectory(prefix="latency.") as tmp:
        def measure(name, tool):
            results[name].append(tool(prog, n, Path(tmp), args.timeout))
            fixed[name].append(tool(prog, 1, Path(tmp), args.timeout).wall)
        run_rounds(tools, results, reps, measure)

    base = statistics.median(r.wall for r in results["uninstrumented"])

    def net(name):
        runs = results[name]
        return (statistics.median(r.wall for r in runs)
                - statistics.median(fixed[name])) / (n - 1) * 1e6

    ref = net(BPFTRACE) if isinstance(results[BPFTRACE], list) else None
    rows = ["| tool | wall s | µs/call | µs/call net | calls | ÷ bpftrace |",
            "|---|---:|---:|---:|---:|---:|"]
    for name, runs in results.items():
        if isinstance(runs, str):
            rows.append(f"| {name} | {runs} | | | | |")
            continue
        wall = statistics.median(r.wall for r in runs)
        if name == "uninstrumented":
            rows.append(f"| {name} | {wall:.3f} | | | | |")
            continue
        calls = [r.events for r in runs if r.events is not None]
        counted = f"{int(statistics.median(calls)):,}" if calls else "-"
        us_net = net(name)
        ratio = f"{us_net / ref:.2f}" if ref else "-"
        rows.append(f"| {name} | {wall:.3f} | {(wall - base) / n * 1e6:.2f} "
                    f"| {us_net:.2f} | {counted} | {ratio} |")
    load = " ".join(open("/proc/loadavg").read().split()[:3])
    md = (f"## Function latency: `d` called {n:,} times in a loop\n\n"
          f"`chain {n}` built -O2 -fno-omit-frame-pointer; medians of {reps} run(s); "
          f"{time.strftime('%Y-%m-%d')}, kernel {platform.release()}, "
          f"{os.cpu_count()} CPUs, loadavg at the end {load}. Each call is two "
          "probe hits (entry and return), counted into a histogram in the kernel "
          "by every tool.\n\n" + "\n".join(rows) + "\n")
    write_report(md, out)


if __name__ == "__main__":
    main()
