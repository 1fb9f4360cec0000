#!/usr/bin/env python3
"""Continuous whole-machine profiling: `ustack profile -F 99 --every 10
-d 60 -o DIR/` (six pprof files) while a busy CPython loop and a busy node
loop run, side by side with `perf record -a -g -F 99 -- sleep 60` (one
file, reported later): each tool's own CPU over the minute as a share of
the machine, and its peak RSS (wait4 of the tool's process), with a warm
cache (a first ustack run, not timed, builds it: what a continuous
profiler meets after its first interval). Also the comments ustack wrote
into its files (its own view of its cost, interval by interval).

    sudo python3 bench/continuous.py [--reps N] [--seconds S]

Writes bench/results/continuous.md."""
from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from whole_machine import REPO, measured, start_busy  # noqa: E402


def builders_done(cache: str) -> None:
    """Wait for the processes that still use `cache` (a run's builders
    finish their object after the run; a rows builder nothing waited for
    runs at niceness +10, so seconds more on this busy machine)."""
    mark = f"USTACK_CACHE_DIR={cache}".encode()
    while True:
        users = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                if mark in open(f"/proc/{pid}/environ", "rb").read().split(b"\0"):
                    users.append(pid)
            except OSError:
                pass
        if not users:
            return
        time.sleep(0.2)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--seconds", type=int, default=60)
    args = ap.parse_args()
    busy = start_busy()
    cache = tempfile.mkdtemp(prefix="ustack-cache-")
    env = dict(os.environ, USTACK_CACHE_DIR=cache, PYTHONPATH=str(REPO / "src"))
    comments: list = []

    def ustack(seconds: int):
        with tempfile.TemporaryDirectory() as out:
            result = measured([sys.executable, "-m", "ustack", "profile", "-F", "99",
                               "--every", str(max(1, seconds // 6)), "-d", str(seconds),
                               "-o", f"{out}/"], env)
            files = sorted(Path(out).iterdir())
            comments[:] = [line for f in files for line in subprocess.run(
                ["go", "tool", "pprof", "-raw", str(f)], capture_output=True,
                text=True).stdout.splitlines() if "ustack's own CPU" in line]
            return result + (len(files),)

    def perf(seconds: int):
        with tempfile.TemporaryDirectory() as d:
            return measured(["perf", "record", "-B", "-q", "-a", "-g", "-F", "99",
                             "-o", f"{d}/perf.data", "--", "sleep", str(seconds)]) + (1,)

    tools = {"ustack profile --every": ustack}
    if shutil.which("perf"):
        tools["perf record -a -g"] = perf
    results: dict = {name: [] for name in tools}
    try:
        time.sleep(1)
        ustack(2)                       # the warm cache, not timed ...
        builders_done(cache)            # ... with what its builders finish after it
        for rep in range(args.reps):
            for name, run in tools.items():
                results[name].append(run(args.seconds))
                print(f"rep {rep + 1} {name}: {results[name][-1]}", file=sys.stderr)
    finally:
        for p in busy:
            p.kill()
            p.wait()
        shutil.rmtree(cache, ignore_errors=True)
    cpus = os.cpu_count() or 1
    lines = [
        f"# Continuous whole-machine profile, {args.seconds} s at 99 Hz, "
        "busy CPython and node running",
        "",
        f"{platform.node()}, {cpus} CPUs, kernel {platform.release()}; medians of "
        f"{args.reps} (`python3 bench/continuous.py --reps {args.reps} "
        f"--seconds {args.seconds}`), warm cache",
        "",
        "| tool | files | wall s | own CPU s | own CPU, % of the machine | peak RSS MB |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, runs in results.items():
        wall, rss, cpu = (statistics.median(r[i] for r in runs) for i in range(3))
        files = runs[-1][4]
        share = 100 * cpu / (wall * cpus)
        lines.append(f"| {name} | {files} | {wall:.1f} | {cpu:.2f} | {share:.2f} % "
                     f"| {rss:.0f} |")
    lines += ["", "What ustack's last run wrote in its files' comments:", "", "```",
              *comments, "```"]
    text = "\n".join(lines) + "\n"
    (REPO / "bench" / "results" / "continuous.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
