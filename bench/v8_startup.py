#!/usr/bin/env python3
"""How long a whole-machine `ustack profile` takes to start (to its
`Tracing` line, the probes live), with JS frames on, for two source trees:
this one and another (`--other DIR`, e.g. an older commit's src/ from
`git archive OLD src | tar -x -C DIR`). The older code looked at every
process's maps at the start for a node to follow; this one knows V8 by
its object as its rows load, and reads nothing per process.

    sudo python3 bench/v8_startup.py --other DIR [--reps N] [--idle N]

--idle N starts N idle processes (sleep) for the measurement, as a busy
server has them, and ends them after.

Runs alternate (this, other, this, other...) in fresh processes; each
ends by Ctrl-C once its line is printed. The ratio is taken pair by pair,
then the median. Prints Markdown."""
from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def to_tracing(src: str) -> float:
    """Seconds from fork to the `Tracing` line of a whole-machine profile."""
    env = dict(os.environ, PYTHONPATH=src)
    start = time.monotonic()
    us = subprocess.Popen([sys.executable, "-m", "ustack", "profile", "-F", "99",
                           "-o", "/dev/null"], env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    line = us.stderr.readline()
    took = time.monotonic() - start
    us.send_signal(signal.SIGINT)
    us.communicate(timeout=120)
    if not line.startswith("Tracing"):
        raise SystemExit(f"no Tracing line: {line!r}")
    return took


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--other", required=True, help="the src/ folder of the code to compare")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--idle", type=int, default=0, help="idle processes to start first")
    args = ap.parse_args()
    this, other = str(REPO / "src"), args.other
    idle = [subprocess.Popen(["sleep", "3600"]) for _ in range(args.idle)]
    try:
        measure(this, other, args.reps)
    finally:
        for p in idle:
            p.kill()
        for p in idle:
            p.wait()


def measure(this: str, other: str, reps: int) -> None:
    processes = sum(1 for d in os.listdir("/proc") if d.isdigit())
    to_tracing(this)            # .pyc and caches written, once each
    to_tracing(other)
    ours, theirs = [], []
    for _ in range(reps):
        ours.append(to_tracing(this))
        theirs.append(to_tracing(other))
    ratios = [a / b for a, b in zip(ours, theirs)]
    print(f"whole-machine `profile -F 99` to its Tracing line, {processes} processes, "
          f"{reps} pairs, load average {os.getloadavg()[0]:.1f}\n")
    print("| code | median s | min s | max s |")
    print("|---|---:|---:|---:|")
    for name, xs in (("this", ours), ("other", theirs)):
        print(f"| {name} | {statistics.median(xs):.3f} | {min(xs):.3f} | {max(xs):.3f} |")
    print(f"\nratio this / other, pair by pair: median {statistics.median(ratios):.2f} "
          f"(min {min(ratios):.2f}, max {max(ratios):.2f})")


if __name__ == "__main__":
    main()
