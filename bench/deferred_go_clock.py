#!/usr/bin/env python3
"""Deferred Go samples inside time.now, which runs the vDSO on the
thread's g0 stack: `ustack profile -F 499 --unwind-memory 0.001 -c
'gonow 3000000'` (tests/programs/gonow: time.Now in a loop; the Go rows
do not fit so small a table, so every Go sample is deferred and unwound
by ustack), an empty cache each run, for this tree and another
(--before DIR/src), alternated. Whole: the stack goes from time.now down
through main.clock to runtime.goexit with no note.

    sudo python3 bench/deferred_go_clock.py [--runs N] [--before DIR/src]

Prints Markdown and writes bench/results/deferred_go_clock.md."""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from helpers import build_go, parse_folded  # noqa: E402

WHOLE = ["runtime.goexit.abi0", "runtime.main", "main.main", "main.clock", "time.Now"]


def one_run(src: Path, program: Path, work: Path) -> tuple:
    """(whole samples in time.now, samples in time.now)."""
    subprocess.run(["rm", "-rf", str(work / "cache")], check=True)
    env = dict(os.environ, PYTHONPATH=str(src), USTACK_CACHE_DIR=str(work / "cache"))
    out = subprocess.run([sys.executable, "-m", "ustack", "profile", "-F", "499",
                          "--unwind-memory", "0.001", "-f", "folded", "-c",
                          f"{program} 3000000"], env=env, capture_output=True, text=True,
                         check=True).stdout
    whole = total = 0
    for stack, n in parse_folded(out):
        if "time.now" in stack:
            total += n
            whole += n * (stack[1:6] == WHOLE)
    return whole, total


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--before", metavar="DIR/src")
    opts = ap.parse_args()
    trees = {"this tree": REPO / "src"}
    if opts.before:
        trees["before"] = Path(opts.before)
    program = build_go("gonow")
    results: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(opts.runs):
            for tree, src in trees.items():
                results.setdefault(tree, []).append(one_run(src, program, Path(tmp)))
    lines = ["# Deferred Go samples inside time.now (the vDSO on the g0 stack)", "",
             f"{time.strftime('%Y-%m-%d %H:%M')} UTC, kernel {os.uname().release}, 2 CPUs "
             f"shared (load average {os.getloadavg()[0]:.1f} at the end). `python3 "
             "bench/deferred_go_clock.py`: `ustack profile -F 499 --unwind-memory 0.001 -c "
             "'gonow 3000000'`, an empty cache each run, trees alternated.", "",
             "| tree | runs | whole samples in time.now, per run | total |",
             "| --- | --- | --- | --- |"]
    for tree, runs in results.items():
        lines.append(f"| {tree} | {len(runs)} | " + ", ".join(f"{w}/{n}" for w, n in runs)
                     + f" | {sum(w for w, _n in runs)} / {sum(n for _w, n in runs)} |")
    text = "\n".join(lines) + "\n"
    print(text)
    (REPO / "bench" / "results" / "deferred_go_clock.md").write_text(text)


if __name__ == "__main__":
    main()
