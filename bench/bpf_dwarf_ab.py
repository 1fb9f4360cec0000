#!/usr/bin/env python3
"""Has the in-kernel DWARF unwinder's cost changed? bench/bpf_dwarf.py's
uprobe run (`ustack count --backend bpf --unwind dwarf`, N hits of an
emulated `push %rbp` site, every object loaded before the run) with this
checkout's src/ and another checkout's, interleaved A B A B … so both see
the same machine load; medians.

    sudo python3 bench/bpf_dwarf_ab.py OTHER_CHECKOUT [-n N] [--reps R]

e.g. OTHER_CHECKOUT = a `git archive` of the commit before a change."""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bpf_dwarf  # noqa: E402
from uprobe_rate import REPO  # noqa: E402


def run(src: Path, prog: str, n: int, tmp: Path, timeout: float):
    """One run of bench/bpf_dwarf.py's in-kernel DWARF tool on `src`."""
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(src)      # ustack_env() puts REPO/src after it
    try:
        return bpf_dwarf.ustack("bpf", "dwarf")(prog, n, tmp, timeout)
    finally:
        if old is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = old


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("other", type=Path, help="the checkout to compare with")
    ap.add_argument("-n", type=int, default=1_000_000)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--timeout", type=float, default=120)
    args = ap.parse_args()
    sides = {"this": REPO / "src", "other": args.other.resolve() / "src"}
    walls: dict = {k: [] for k in sides}
    with tempfile.TemporaryDirectory(prefix="bpf_dwarf_ab.") as tmp:
        prog = bpf_dwarf.build(Path(tmp))
        base = statistics.median(bpf_dwarf.baseline(prog, args.n, Path(tmp), args.timeout).wall
                                 for _ in range(3))
        for _ in range(args.reps):
            for side, src in sides.items():
                r = run(src, prog, args.n, Path(tmp), args.timeout)
                assert r.events == args.n and r.frames == 8, (side, r)
                walls[side].append(r.wall)
    print(f"{args.n:,} hits, {args.reps} runs each, interleaved; uninstrumented {base:.3f} s\n")
    print("| src | wall s (median) | µs/event | runs |")
    print("|---|---:|---:|---|")
    for side, w in walls.items():
        m = statistics.median(w)
        print(f"| {side} ({sides[side].parent.name}) | {m:.3f} | {(m - base) / args.n * 1e6:.2f} "
              f"| {' '.join(f'{x:.2f}' for x in w)} |")


if __name__ == "__main__":
    main()
