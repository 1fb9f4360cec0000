#!/usr/bin/env python3
"""A short run's CPU, this tree's src/ against another tree's, alternated
pair by pair (the machine's speed drifts between runs; pairing keeps a
ratio meaningful):

    git archive main src | tar -x -C /tmp/before
    sudo .venv/bin/python bench/tree_ab.py /tmp/before/src [--pairs 21] [--profile]

Each run is the venv's `ustack` console script with the tree's src/ on
PYTHONPATH and a cache directory of the tree's own (both warmed by a first
unmeasured run; .pyc written beforehand: PYTHONDONTWRITEBYTECODE is
dropped and both trees compiled). CPU = user + system of ustack and what
it waited for (os.wait4), page faults likewise. Runs: the one-hit trace
`trace syscall:write -c 'echo hello'`; with --profile, `profile -F 99 -p
PID -d 2` of a busy CPython (not ustack's child: its CPU is not counted).
Prints the medians of each tree's CPU and faults, the median of the pair
ratios (this / other) and the load average."""
from __future__ import annotations

import argparse
import compileall
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
USTACK = Path(sys.executable).with_name("ustack")
BUSY_PY = ("def f(n):\n    return n if n < 2 else f(n - 1) + f(n - 2)\n"
           "while True:\n    f(20)\n")


def measured(argv: list, src: str, cache: str) -> tuple:
    """(CPU ms, page faults) of one run, children it waited for included."""
    env = dict(os.environ, PYTHONPATH=src, USTACK_CACHE_DIR=cache)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    with open(os.devnull, "wb") as null:
        proc = subprocess.Popen([str(USTACK), *argv], env=env, stdout=null, stderr=null)
    _pid, _status, usage = os.wait4(proc.pid, 0)
    proc.returncode = 0                 # reaped here, by wait4
    return (usage.ru_utime + usage.ru_stime) * 1000, usage.ru_minflt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("other", help="the other tree's src/ directory")
    ap.add_argument("--pairs", type=int, default=21)
    ap.add_argument("--profile", action="store_true",
                    help="a 2 s profile of a busy CPython, not the one-hit trace")
    args = ap.parse_args()
    trees = [("this", str(REPO / "src")), ("other", os.path.abspath(args.other))]
    for _name, src in trees:
        compileall.compile_dir(src, quiet=1)
    busy = None
    if args.profile:
        busy = subprocess.Popen([sys.executable, "-c", BUSY_PY])
        time.sleep(0.5)
        argv = ["profile", "-F", "99", "-p", str(busy.pid), "-d", "2", "-o", "/dev/null"]
    else:
        argv = ["trace", "syscall:write", "-c", "echo hello"]
    runs: dict = {name: [] for name, _src in trees}
    ratios = []
    try:
        with tempfile.TemporaryDirectory(prefix="ustack-ab-") as tmp:
            caches = {name: os.path.join(tmp, name) for name, _src in trees}
            for name, src in trees:                   # warm: caches and .pyc
                measured(argv, src, caches[name])
            for _ in range(args.pairs):
                pair = [measured(argv, src, caches[name]) for name, src in trees]
                for (name, _src), run in zip(trees, pair):
                    runs[name].append(run)
                ratios.append(pair[0][0] / pair[1][0])
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()
    print(f"ustack {' '.join(argv)}: {args.pairs} pairs, load average "
          f"{os.getloadavg()[0]:.1f} at the end")
    for name, src in trees:
        cpu = statistics.median(c for c, _f in runs[name])
        faults = statistics.median(f for _c, f in runs[name])
        print(f"  {name:5} {src}: CPU {cpu:.1f} ms, page faults {faults:.0f} (medians)")
    print(f"  CPU ratio this / other, pair by pair: median {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
