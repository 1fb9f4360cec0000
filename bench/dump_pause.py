#!/usr/bin/env python3
"""How long `ustack dump` holds a process stopped on a busy machine: a
process of 2 and of 50 threads parked in read(2) (bench/programs/
parked_threads.c), two busy loops beside it (on 2 CPUs: every CPU taken),
dumped REPS times each way, the ways alternating:

  before      the capture of BASE (a git revision: seize, interrupt,
              read and resume thread by thread, stacks by pread)
  now         this tree's: names and seizing before the stop, every thread
              interrupted then resumed at once, the stacks in one
              process_vm_readv, ustack SCHED_FIFO during the pause
  now, no RT  the same without the real-time policy

The figure is the capture's own (dump's `stopped for`, JSON stopped_ns):
from the first interrupt to the last detach. Each dump is a fresh
process (as a user runs it); its start-up is not in the figure.

    sudo python3 bench/dump_pause.py [--reps N] [--base REV]

Writes bench/results/dump_pause.md."""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROGRAM = ROOT / "bench" / "programs" / "parked_threads.c"
RESULTS = ROOT / "bench" / "results" / "dump_pause.md"
BUSY = "while True: pass"

# one dump: prints the nanoseconds the capture held the process stopped
ONE = """
import sys
sys.path.insert(0, sys.argv[1])
from ustack.commands.dump import capture
pid, way = int(sys.argv[2]), sys.argv[3]
if way == "before":
    print(capture(pid, None)[1])
else:
    print(capture(pid, None, realtime=(way == "now"))[1])
"""
WAYS = ("before", "now", "now, no RT")


def build(tmp: str) -> str:
    exe = os.path.join(tmp, "parked_threads")
    subprocess.run(["gcc", "-O2", "-pthread", "-o", exe, str(PROGRAM)], check=True)
    return exe


def base_tree(tmp: str, rev: str) -> str:
    """src/ of revision `rev`, unpacked."""
    out = os.path.join(tmp, "base")
    os.mkdir(out)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "src"],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", out], input=archive, check=True)
    return os.path.join(out, "src")


def dump_ns(src: str, pid: int, way: str) -> int:
    res = subprocess.run([sys.executable, "-c", ONE, src, str(pid), way],
                         capture_output=True, text=True, timeout=60)
    if res.returncode:
        raise SystemExit(res.stderr)
    return int(res.stdout)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--base", default="5cc6a94")
    args = ap.parse_args()
    busy = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(2)]
    results: dict = {}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            exe, old = build(tmp), base_tree(tmp, args.base)
            now = str(ROOT / "src")
            for threads in (2, 50):
                target = subprocess.Popen([exe, str(threads)], stdin=subprocess.PIPE,
                                          stdout=subprocess.PIPE, text=True)
                try:
                    assert target.stdout.readline() == "ready\n"
                    for rep in range(args.reps):
                        ways = WAYS[rep % 3:] + WAYS[:rep % 3]      # alternate the order
                        for way in ways:
                            ns = dump_ns(old if way == "before" else now, target.pid, way)
                            results.setdefault((threads, way), []).append(ns / 1e6)
                finally:
                    target.stdin.close()
                    target.wait(timeout=30)
    finally:
        for p in busy:
            p.kill()
            p.wait()
    load = os.getloadavg()[0]
    lines = [f"# ustack dump: the pause on a busy machine ({os.uname().release}, "
             f"{os.cpu_count()} CPUs, two busy loops beside the target, load average "
             f"{load:.1f} at the end; {args.reps} dumps each way, alternating)", "",
             "Milliseconds the process was stopped (dump's `stopped for`), "
             f"`before` = {args.base}.", "",
             "| threads | way | median ms | p90 ms | min ms | max ms |",
             "|---:|---|---:|---:|---:|---:|"]
    for (threads, way), ms in results.items():
        ms.sort()
        p90 = ms[min(len(ms) - 1, int(0.9 * len(ms)))]
        lines.append(f"| {threads} | {way} | {statistics.median(ms):.2f} | {p90:.2f} | "
                     f"{ms[0]:.2f} | {ms[-1]:.2f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    RESULTS.write_text(text)


if __name__ == "__main__":
    main()
