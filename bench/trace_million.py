#!/usr/bin/env python3
"""A stack per event to a file, 1,000,000 events: ustack trace vs bpftrace
`printf("%s", ustack)` vs perf record --call-graph dwarf + perf script.

    sudo python3 bench/trace_million.py [--quick] [-n N] [--reps R]

`chain N` (tests/programs/chain.c, -O2 -fno-omit-frame-pointer) calls d
exactly N times; each tool puts a uprobe on d, runs the command under -c
and writes a stack per hit to a file, with its default options. Tools
alternate, REPS rounds; medians:

  wall      seconds from launch to the file written (perf: record + script)
  events    stacks in the file;  lost: what the tool says it lost
  peak RSS  the tool's largest resident set (perf: the larger of its two runs)
  events/s  events in the file / wall
"""
from __future__ import annotations

import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from uprobe_rate import (PERF_EVENT, REPO, Failed, build, lost_count, perf_probe,  # noqa: E402
                         run_options, run_rounds, ustack_env, write_report)
from helpers import O2_FP  # noqa: E402


@dataclass
class Run:
    wall: float
    events: int
    lost: int
    rss_mb: float
    note: str = ""


def measured(cmd: list[str], timeout: float, stdout=subprocess.DEVNULL, env=None,
             check: bool = True):
    """(wall s, stderr, peak RSS MB) of cmd, run under GNU time's %M; with
    check=False a failed exit is said in stderr's last line, not raised."""
    start = time.monotonic()
    proc = subprocess.run(["/usr/bin/time", "-f", "RSS_KB %M", *cmd], stdout=stdout,
                          stderr=subprocess.PIPE, text=True, env=env, timeout=timeout)
    wall = time.monotonic() - start
    rss = re.findall(r"^RSS_KB (\d+)$", proc.stderr, re.M)
    if (check and proc.returncode != 0) or not rss:
        last = (proc.stderr.strip().splitlines() or ["?"])[-1]
        raise Failed(f"exit {proc.returncode}: {last[:120]}")
    return wall, proc.stderr, int(rss[-1]) / 1024


def count_lines(path: Path, pattern: bytes) -> int:
    """Lines of `path` starting with `pattern` (read in blocks: files of GBs)."""
    n, tail = 0, b""
    with open(path, "rb") as f:
        while block := f.read(1 << 24):
            block = tail + block
            cut = block.rfind(b"\n") + 1
            n += block.count(b"\n" + pattern, 0, cut) + (block.startswith(pattern) and not tail)
            tail = block[cut - 1:] if cut else block
    return n


def ustack_trace(prog, n, tmp, timeout):
    out = tmp / "ustack.txt"
    wall, err, rss = measured([sys.executable, "-m", "ustack", "trace", f"uprobe:{prog}:d",
                               "-c", f"{prog} {n}", "-o", str(out)], timeout, env=ustack_env())
    dropped = re.findall(r"^(\d+) events were dropped unread", err, re.M)
    run = Run(wall, count_lines(out, b"chain "), lost_count(err) + sum(map(int, dropped)), rss)
    out.unlink()
    return run


def bpftrace_printf(prog, n, tmp, timeout):
    out = tmp / "bpftrace.txt"
    wall, err, rss = measured(["bpftrace", "-o", str(out), "-e",
                               f'uprobe:{prog}:d {{ printf("%s", ustack); }}',
                               "-c", f"{prog} {n}"], timeout, check=False)
    text = out.read_text(errors="replace")      # small: bpftrace loses most
    # bpftrace names a stack when it prints it: once the command has exited
    # its stacks come out as bare addresses (0.17 may abort instead)
    stacks = text.count("\n\n        ")
    unnamed = stacks - text.count("\n        d+")
    notes = [f"{unnamed:,} printed unnamed" if unnamed else "",
             "aborted" if "terminated by signal" in err else ""]
    run = Run(wall, stacks, lost_count(text + err), rss, "; ".join(n for n in notes if n))
    out.unlink()
    return run


def perf_dwarf(prog, n, tmp, timeout):
    data, out = tmp / "perf.data", tmp / "perf.txt"
    # perf 6.1 sometimes aborts as it ends a record (build-id.c) with its
    # data written: perf script reads it all the same
    wall1, err1, rss1 = measured(["perf", "record", "-q", "-B", "-e", PERF_EVENT,
                                  "--call-graph", "dwarf", "-o", str(data), "--", prog,
                                  str(n)], timeout, check=False)
    aborted = "perf record aborted at its end" if "terminated by signal" in err1 else ""
    stats = subprocess.run(["perf", "report", "--stats", "-i", str(data)],
                           capture_output=True, text=True, timeout=timeout).stdout
    lost = re.search(r"LOST_SAMPLES events:\s+(\d+)", stats.split(f"{PERF_EVENT} stats:")[-1])
    with open(out, "w") as f:
        wall2, _err2, rss2 = measured(["perf", "script", "-i", str(data)], timeout, stdout=f)
    data.unlink()
    run = Run(wall1 + wall2, count_lines(out, b"chain "), int(lost.group(1)) if lost else 0,
              max(rss1, rss2), aborted)
    out.unlink()
    return run


def table(results: dict) -> str:
    rows = ["| tool | wall s | events | lost | peak RSS MB | events/s | note |",
            "|---|---:|---:|---:|---:|---:|---|"]
    for name, runs in results.items():
        if isinstance(runs, str):
            rows.append(f"| {name} | {runs.replace('|', '/')} | | | | | |")
            continue
        med = {f: statistics.median(getattr(r, f) for r in runs)
               for f in ("wall", "events", "lost", "rss_mb")}
        rate = statistics.median(r.events / r.wall for r in runs)
        notes = sorted({r.note for r in runs if r.note})
        rows.append(f"| {name} | {med['wall']:.2f} | {int(med['events']):,} | "
                    f"{int(med['lost']):,} | {med['rss_mb']:.0f} | {rate:,.0f} |"
                    + (f" {'; '.join(notes)} |" if notes else " |"))
    return "\n".join(rows)


def main():
    args, n, reps, out = run_options(__doc__, "trace_million")
    prog = str(build("chain", flags=O2_FP))
    tools = {"ustack trace -o FILE": ustack_trace,
             'bpftrace printf("%s", ustack) -o FILE': bpftrace_printf,
             "perf record --call-graph dwarf + perf script > FILE": perf_dwarf}
    results: dict = {name: [] for name in tools}
    for name, exe in zip(list(tools)[1:], ("bpftrace", "perf")):
        if not shutil.which(exe):
            results[name] = f"absent ({exe} not installed)"
    # on disk: perf.data reaches GBs
    with tempfile.TemporaryDirectory(prefix="trace_million.", dir="/var/tmp") as tmp:
        try:
            perf_probe(prog, add=True)
            run_rounds(tools, results, reps, lambda name, tool: results[name].append(
                tool(prog, n, Path(tmp), args.timeout)))
        finally:
            perf_probe(prog, add=False)
    load = open("/proc/loadavg").read().split()[:3]
    md = (f"## trace: {n:,} uprobe hits, a stack per event to a file\n\n"
          f"`chain {n}` (-O2 -fno-omit-frame-pointer; d's first instruction `push %rbp`, "
          f"emulated), each tool with its default options; medians of {reps} run(s); "
          f"{time.strftime('%Y-%m-%d')}, kernel {platform.release()}, {__import__('os').cpu_count()} "
          f"CPUs shared with other work (load average at the end {' '.join(load)}). Wall "
          "includes start-up and exit; events/s = events in the file / wall.\n\n"
          + table(results) + "\n")
    write_report(md, out)


if __name__ == "__main__":
    main()
