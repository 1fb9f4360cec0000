#!/usr/bin/env python3
"""A -c command with an empty cache: how long after ustack's launch the
command starts, and whether its first events' stacks are whole, for this
tree and another (--before DIR/src), runs alternated. The command is
`sh -c 'date +%s.%N > FILE; exec PROGRAM 3 write'` (its start time is
what date writes), traced on syscall:write: tests/programs' gochain (Go)
and chain (C, -O2 without frame pointers), three writes each, the first
ones while the rows are still being built (after the start here).

    sudo python3 bench/empty_cache_command.py [--runs N] [--before DIR/src]

Prints Markdown and writes bench/results/empty_cache_command.md."""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from helpers import O2_NOFP, build, build_go, funcs, parse_trace  # noqa: E402

ROOTS = {"go": "runtime.goexit.abi0", "c": "_start"}


def one_run(src: Path, program: Path, work: Path) -> tuple:
    """(seconds from launch to the command's start, whole stacks, stacks)."""
    cache, started, out = work / "cache", work / "started", work / "trace.txt"
    subprocess.run(["rm", "-rf", str(cache), str(started), str(out)], check=True)
    env = dict(os.environ, PYTHONPATH=str(src), USTACK_CACHE_DIR=str(cache))
    command = f"sh -c 'date +%s.%N > {started}; exec {program} 3 write'"
    t0 = time.time()
    subprocess.run([sys.executable, "-m", "ustack", "trace", "syscall:write", "-o", str(out),
                    "-c", command], env=env, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, check=True)
    delay = float(started.read_text()) - t0
    records = [r for r in parse_trace(out.read_text()) if r["comm"] == program.name[:15]]
    root = ROOTS["go" if "gochain" in program.name else "c"]
    whole = sum(1 for r in records if not r["notes"] and funcs(r["frames"])[-1:] == [root])
    return delay, whole, len(records)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--before", metavar="DIR/src")
    opts = ap.parse_args()
    trees = {"this tree": REPO / "src"}
    if opts.before:
        trees["before"] = Path(opts.before)
    programs = {"Go (gochain)": build_go("gochain"), "C (chain)": build("chain", flags=O2_NOFP)}
    results: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(opts.runs):
            for language, program in programs.items():
                for tree, src in trees.items():          # alternated: the load drifts
                    results.setdefault((language, tree), []).append(
                        one_run(src, program, Path(tmp)))
    load = os.getloadavg()[0]
    lines = ["# A -c command with an empty cache: its start and its first events", "",
             f"{time.strftime('%Y-%m-%d %H:%M')} UTC, kernel {os.uname().release}, 2 CPUs "
             f"shared (load average {load:.1f} at the end). `python3 "
             "bench/empty_cache_command.py`: `ustack trace syscall:write -c \"sh -c 'date "
             "> FILE; exec PROGRAM 3 write'\"`, a new USTACK_CACHE_DIR each run, trees "
             "alternated. Start: from ustack's launch to the command's `date`.", "",
             "| program | tree | runs | start, median (s) | start, min-max (s) "
             "| whole stacks |", "| --- | --- | --- | --- | --- | --- |"]
    for (language, tree), runs in results.items():
        delays = [d for d, _w, _n in runs]
        lines.append(f"| {language} | {tree} | {len(runs)} | {statistics.median(delays):.2f} "
                     f"| {min(delays):.2f}-{max(delays):.2f} "
                     f"| {sum(w for _d, w, _n in runs)} / {sum(n for _d, _w, n in runs)} |")
    text = "\n".join(lines) + "\n"
    print(text)
    (REPO / "bench" / "results" / "empty_cache_command.md").write_text(text)


if __name__ == "__main__":
    main()
