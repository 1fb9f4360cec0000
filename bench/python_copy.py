#!/usr/bin/env python3
"""What reading Python frames costs the copy path (`--backend perf`): the
samples per second it keeps up with, with the frames read after each
sample and with --no-python, interleaved.

    sudo python3 bench/python_copy.py [--reps R] [--seconds S] [--pythons 3.8,3.12]

A Python program that writes in a loop (tests/programs/python/frames.py
write: <module> -> main -> outer -> middle -> leaf -> print -> libc's
write) runs until its stdin closes; `ustack count --backend perf
uprobe:libc:write -d S -p PID` counts its writes' stacks. Per run: the
events kept and lost, ustack's CPU time, and so kept events per second and
ustack's CPU µs per kept event; the difference between the two modes is
what the reads cost. Prints Markdown; medians of R runs."""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FRAMES = REPO / "tests" / "programs" / "python" / "frames.py"


def python_of(version: str) -> str:
    found = sorted(glob.glob(f"/root/.pyenv/versions/{version}.*/bin/python3"))
    if not found:
        sys.exit(f"no CPython {version} under /root/.pyenv/versions")
    return found[-1]


def one_run(pid: int, seconds: float, python: bool) -> tuple:
    """(kept, lost, ustack CPU seconds) of one count run."""
    before = os.times()
    run = subprocess.run([sys.executable, "-m", "ustack", "count", "--backend", "perf",
                          "-d", str(seconds), "-f", "json", "-p", str(pid),
                          "uprobe:libc:write"] + ([] if python else ["--no-python"]),
                         capture_output=True, text=True, timeout=seconds + 120,
                         env=dict(os.environ, PYTHONPATH=str(REPO / "src")))
    after = os.times()
    if run.returncode:
        sys.exit(run.stderr)
    kept = sum(s["count"] for s in json.loads(run.stdout)["stacks"])
    lost = re.search(r"Lost ([\d,]+) events", run.stderr)
    cpu = (after.children_user - before.children_user
           + after.children_system - before.children_system)
    return kept, int(lost.group(1).replace(",", "")) if lost else 0, cpu


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=3)
    ap.add_argument("--pythons", default="3.8,3.12")
    args = ap.parse_args()
    print("| CPython | Python frames | kept events/s | lost | ustack CPU µs / kept event |")
    print("|---|---|---:|---:|---:|")
    for version in args.pythons.split(","):
        prog = subprocess.Popen([python_of(version), str(FRAMES), "write", "stdin"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            pid = json.loads(prog.stdout.readline())["pid"]
            runs: dict = {True: [], False: []}
            for _ in range(args.reps):
                for python in (True, False):
                    runs[python].append(one_run(pid, args.seconds, python))
        finally:
            prog.stdin.close()
            prog.wait(timeout=30)
        for python in (True, False):
            kept = statistics.median(k for k, _l, _c in runs[python])
            lost = statistics.median(l for _k, l, _c in runs[python])
            per = statistics.median(c / max(k, 1) * 1e6 for k, _l, c in runs[python])
            print(f"| {version} | {'read' if python else '--no-python'} | "
                  f"{kept / args.seconds:,.0f} | {lost:,.0f} | {per:.1f} |")


if __name__ == "__main__":
    main()
