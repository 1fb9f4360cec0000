#!/usr/bin/env python3
"""Samples in a library loaded during the run: `profile -F 999 --backend
bpf -p` of dlopen_main (tests/programs), released once ustack traces, which
dlopens plugin.so and loops in it (main's 8 KiB of locals put the root
more than 8 KiB above the plugin's frames). Samples before the library's
rows are loaded are deferred: their stack copy is as deep as --stack-size
in this tree, 8 KiB before. Counts samples through the plugin, those cut
with a note and those short of main without one; this tree against
another (USTACK_BEFORE=DIR: its src/), alternating.

    sudo python3 bench/late_library_profile.py [--runs N] [--stack-size BYTES]

Prints Markdown and writes bench/results/late_library_profile.md."""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from helpers import (O2_NOFP, build, finish, parse_folded, release, spawn,  # noqa: E402
                     stop, wait_tracing)


def one_run(src: Path, stack_size: str) -> tuple:
    """(samples through the plugin, cut with a note, short without one)."""
    prog = build("dlopen_main", flags=O2_NOFP)
    plugin = build("plugin", kind="shared", flags=O2_NOFP)
    target = spawn(prog, "-", plugin, 200000000, stdin=subprocess.PIPE)
    us = subprocess.Popen([sys.executable, "-m", "ustack", "profile", "-F", "999", "--backend",
                           "bpf", "-f", "folded", "--stack-size", stack_size,
                           "-p", str(target.pid)], env=dict(os.environ, PYTHONPATH=str(src)),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_tracing(us, 60)
        release(target)
        out, _err = finish(us, 120)
    finally:
        stop(us)
        stop(target)
    total = cut = bare = 0
    for stack, n in parse_folded(out):
        frames = stack[1:]
        if not any("plugin" in f for f in frames):
            continue
        total += n
        if frames and frames[0] == "_start":
            continue
        if any(f.startswith("[") for f in frames):
            cut += n
        else:
            bare += n
    return total, cut, bare


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--stack-size", default="16384")
    opts = ap.parse_args()
    trees = {"this tree": REPO / "src"}
    if os.environ.get("USTACK_BEFORE"):
        trees["before"] = Path(os.environ["USTACK_BEFORE"]) / "src"
    sums = {name: [0, 0, 0] for name in trees}
    for _ in range(opts.runs):
        for name, src in trees.items():
            for i, v in enumerate(one_run(src, opts.stack_size)):
                sums[name][i] += v
    lines = [f"# Samples in a library loaded during the run, --stack-size {opts.stack_size}, "
             f"{opts.runs} runs", "",
             f"{time.strftime('%Y-%m-%d')}, kernel {os.uname().release}; "
             "`python3 bench/late_library_profile.py`.", "",
             "| tree | samples through the plugin | cut, with a note | short, no note |",
             "| --- | --- | --- | --- |"]
    lines += [f"| {name} | {t} | {c} | {b} |" for name, (t, c, b) in sums.items()]
    text = "\n".join(lines) + "\n"
    print(text)
    (REPO / "bench" / "results" / "late_library_profile.md").write_text(text)


if __name__ == "__main__":
    main()
