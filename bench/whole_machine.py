#!/usr/bin/env python3
"""A whole-machine profile while big programs run: wall time, peak RSS and
own CPU of `ustack profile -d 2` with a cold cache (a fresh
USTACK_CACHE_DIR) and a warm one, side by side with `perf record -a -g
-F 99 -- sleep 2` and bpftrace `profile:hz:99 { @[ustack] = count(); }`
for 2 s.

    sudo python3 bench/whole_machine.py [--reps N]

A busy CPython loop and a busy node loop run the whole time (the objects
a cold run must build rows for: python3.11, libc, node). Tools alternate,
each in a fresh process, N times (default 3); medians. Peak RSS and CPU
come from wait4() of the tool's process (its reaped children included).
A run still going after TIMEOUT_S is ended and marked ">" (bpftrace
symbolizing node's stacks took minutes here). Writes
bench/results/whole_machine.md."""
from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PY_LOOP = "s = 0\nwhile True:\n    for i in range(100000):\n        s += i * i\n"
JS_LOOP = "let s = 0; for (;;) { for (let i = 0; i < 1e6; i++) s += i * i; }"


TIMEOUT_S = 180                 # a run still going then is ended, its wall given as ">"


def measured(argv: list, env: dict | None = None) -> tuple:
    """(wall s, peak RSS MB, CPU s, ended early) of one run of argv."""
    t = time.monotonic()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    timer = threading.Timer(TIMEOUT_S, proc.kill)
    timer.start()
    _pid, status, usage = os.wait4(proc.pid, 0)
    timer.cancel()
    wall = time.monotonic() - t
    ended = wall >= TIMEOUT_S
    if os.waitstatus_to_exitcode(status) != 0 and not ended:
        raise SystemExit(f"{argv[0]} failed: {' '.join(argv)}")
    return wall, usage.ru_maxrss / 1024, usage.ru_utime + usage.ru_stime, ended


def ustack(cache: str) -> tuple:
    env = dict(os.environ, USTACK_CACHE_DIR=cache,
               PYTHONPATH=str(REPO / "src"))
    with tempfile.TemporaryDirectory() as out:
        return measured([sys.executable, "-m", "ustack", "profile", "-F", "99", "-d", "2",
                         "-o", f"{out}/x.folded"], env)


def start_busy() -> list:
    """The busy CPython loop, and node's where node is installed."""
    python = shutil.which("python3.11") or sys.executable
    busy = [subprocess.Popen([python, "-c", PY_LOOP])]
    if shutil.which("node"):
        busy.append(subprocess.Popen(["node", "-e", JS_LOOP]))
    return busy


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--bpftrace-reps", type=int, default=None,
                    help="runs of bpftrace (default: --reps; each takes minutes)")
    args = ap.parse_args()
    busy = start_busy()
    warm = tempfile.mkdtemp(prefix="ustack-warm-")
    tools: dict = {
        "ustack cold": lambda: ustack(tempfile.mkdtemp(prefix="ustack-cold-")),
        "ustack warm": lambda: ustack(warm),
    }
    if shutil.which("perf"):
        def perf():
            with tempfile.TemporaryDirectory() as d:
                return measured(["perf", "record", "-B", "-q", "-a", "-g", "-F", "99",
                                 "-o", f"{d}/perf.data", "--", "sleep", "2"])
        tools["perf record -a -g"] = perf
    if shutil.which("bpftrace"):
        tools["bpftrace ustack"] = lambda: measured(
            ["bpftrace", "-e", "profile:hz:99 { @[ustack] = count(); } "
             "interval:s:2 { exit(); }"])
    results: dict = {name: [] for name in tools}
    try:
        time.sleep(1)                   # the busy loops past their start-up
        ustack(warm)                    # the warm cache, not timed
        bpftrace_reps = args.reps if args.bpftrace_reps is None else args.bpftrace_reps
        for rep in range(args.reps):
            for name, run in tools.items():
                if name.startswith("bpftrace") and rep >= bpftrace_reps:
                    continue
                results[name].append(run())
                print(f"rep {rep + 1} {name}: {results[name][-1]}", file=sys.stderr)
    finally:
        for p in busy:
            p.kill()
            p.wait()
    lines = [
        "# Whole-machine profile, 2 s at 99 Hz, busy CPython and node running",
        "",
        f"{platform.node()}, {os.cpu_count()} CPUs, kernel {platform.release()}, "
        f"{len(os.listdir('/proc'))} /proc entries; medians of {args.reps} "
        f"(bpftrace: {len(results.get('bpftrace ustack', []))}) "
        f"(`python3 bench/whole_machine.py --reps {args.reps}"
        + (f" --bpftrace-reps {args.bpftrace_reps}`)" if args.bpftrace_reps is not None
           else "`)"),
        "",
        "| tool | wall s | peak RSS MB | own CPU s |",
        "|---|---:|---:|---:|",
    ]
    for name, runs in results.items():
        wall, rss, cpu = (statistics.median(r[i] for r in runs) for i in range(3))
        over = ">" if any(r[3] for r in runs) else ""
        lines.append(f"| {name} | {over}{wall:.2f} | {over}{rss:.0f} | {over}{cpu:.2f} |")
    text = "\n".join(lines) + "\n"
    out = REPO / "bench" / "results" / "whole_machine.md"
    out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
