#!/usr/bin/env python3
"""What the verifier takes to load offcpu's, latency's and memleak's
programs: each program's load time (the bpf(2) PROG_LOAD call, timed
around it) and the instructions the verifier processed, for two source
trees (e.g. before and after a change to their .bpf.c), runs alternated.

    sudo python3 bench/verify_cost.py [--reps R] SRC_A SRC_B

Each run is the `ustack` command attached for 0.3 s to a `sleep` (with
every interpreter's frames on, the default): offcpu (--wakers), latency
--by-stack on libc's nanosleep, memleak. Prints Markdown."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

# in the child: every program load timed, its verified instructions read
CHILD = r"""
import json, sys, time
from ustack.kernel import bpf_syscall
from ustack import cli
loads = []
real = bpf_syscall.load_with_btf
def timed(prog_type, code, name, *a, **kw):
    t = time.perf_counter()
    fd = real(prog_type, code, name, *a, **kw)
    ms = (time.perf_counter() - t) * 1000
    loads.append((name, ms, bpf_syscall.verified_insns(fd)))
    return fd
bpf_syscall.load_with_btf = timed
cli.main(sys.argv[1:])
print(json.dumps(loads), file=sys.stderr)
"""

COMMANDS = {
    "offcpu --wakers": ["offcpu", "--wakers", "-d", "0.3", "-o", os.devnull],
    "latency --by-stack": ["latency", "--by-stack", "uprobe:libc:nanosleep", "-d", "0.3",
                           "-o", os.devnull],
    "memleak": ["memleak", "-d", "0.3", "-o", os.devnull],
}


def one(src: str, args: list, pid: int) -> list:
    run = subprocess.run([sys.executable, "-c", CHILD, *args, "-p", str(pid)],
                         env={**os.environ, "PYTHONPATH": src}, capture_output=True,
                         text=True, timeout=300)
    if run.returncode:
        raise SystemExit(f"{' '.join(args)} failed under {src}:\n{run.stderr}")
    return json.loads(run.stderr.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("src", nargs=2)
    a = ap.parse_args()
    sleeper = subprocess.Popen(["sleep", "3600"])
    got: dict = {}              # (command, tree, program) -> [(ms, insns)]
    try:
        for _ in range(a.reps):
            for command, args in COMMANDS.items():
                for tree in a.src:
                    for name, ms, insns in one(tree, args, sleeper.pid):
                        got.setdefault((command, tree, name), []).append((ms, insns))
    finally:
        sleeper.kill()
        sleeper.wait()
    print(f"load average {os.getloadavg()[0]:.1f}; medians of {a.reps}, A = {a.src[0]}, "
          f"B = {a.src[1]}\n")
    print("| command | program | A ms | B ms | A insns | B insns |")
    print("|---|---|---:|---:|---:|---:|")
    for command in COMMANDS:
        names = sorted({n for c, _t, n in got if c == command})
        for name in names:
            cells = []
            for tree in a.src:
                runs = got.get((command, tree, name), [])
                cells.append(runs)
            ms = [f"{statistics.median(r[0] for r in runs):.1f}" if runs else "-"
                  for runs in cells]
            insns = [f"{statistics.median(r[1] for r in runs):.0f}" if runs else "-"
                     for runs in cells]
            print(f"| {command} | {name} | {ms[0]} | {ms[1]} | {insns[0]} | {insns[1]} |")


if __name__ == "__main__":
    main()
