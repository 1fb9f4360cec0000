#!/usr/bin/env python3
"""Events/s the tracefs backend keeps up with, beside the perf backend.

    sudo python3 bench/tracefs_rate.py [--quick]

`ustack trace` of a uprobe on chain's `d` (-O2, frame pointers) while
`chain N` calls d as fast as it can, then of syscall:write (`chain N
rawwrite`), per backend and unwinder, output to /dev/null. Reported:

  wall       seconds of the whole run (start-up and exit included)
  target/s   N / wall: the event rate offered
  printed    stacks written; lost: what ustack reported lost (tracefs: the
             instance's per_cpu/cpuN/stats overrun, in events)
  kept/s     printed / wall

Loss starts where the reader (one Python process) falls behind: a bigger
--buffer-pages only delays it. Prints a Markdown table with the load
average and writes it to bench/results/tracefs_rate.md.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "bench"))
from helpers import O2_FP, build, ustack_env  # noqa: E402
from uprobe_rate import write_report  # noqa: E402  (one report writer for all benchmarks)

CASES = [  # (backend, unwind, event kind)
    ("tracefs", "fp", "uprobe"), ("perf", "fp", "uprobe"),
    ("tracefs", "dwarf", "uprobe"), ("perf", "dwarf", "uprobe"),
    ("tracefs", "fp", "syscall"), ("perf", "fp", "syscall"),
]


def one(prog: Path, backend: str, unwind: str, kind: str, n: int) -> tuple:
    event, cmd = ((f"uprobe:{prog}:d", f"{prog} {n}") if kind == "uprobe" else
                  ("syscall:write", f"{prog} {n} rawwrite"))
    out = Path(f"/tmp/tracefs_rate.{os.getpid()}.txt")
    start = time.monotonic()
    with open(out, "w") as f:
        res = subprocess.run([sys.executable, "-m", "ustack", "trace", "--backend",
                              backend, "--unwind", unwind, event, "-c", cmd],
                             stdout=f, stderr=subprocess.PIPE, text=True,
                             env=ustack_env(), timeout=600)
    wall = time.monotonic() - start
    if res.returncode != 0:
        out.unlink()
        return wall, None, None, res.stderr.strip().splitlines()[-1][:80]
    with open(out) as f:
        printed = sum(1 for line in f if line and not line.startswith((" ", "\n")))
    out.unlink()
    m = re.search(r"^Lost (\d+) events", res.stderr, re.M)
    return wall, printed, int(m.group(1)) if m else 0, ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="N=50k, for a smoke test")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root")
    n = 50_000 if args.quick else 1_000_000
    prog = build("chain", flags=O2_FP)
    rows = ["| backend | unwind | event | N | wall s | target/s | printed | lost | kept/s |",
            "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for backend, unwind, kind in CASES:
        wall, printed, lost, why = one(prog, backend, unwind, kind, n)
        if printed is None:
            rows.append(f"| {backend} | {unwind} | {kind} | {n} | failed: {why} |||||")
            continue
        rows.append(f"| {backend} | {unwind} | {kind} | {n} | {wall:.2f} | "
                    f"{n / wall:,.0f} | {printed} | {lost} | {printed / wall:,.0f} |")
        print(rows[-1], file=sys.stderr)
    load = os.getloadavg()
    md = (f"# tracefs vs perf backend, `ustack trace` ({'quick' if args.quick else 'full'})\n\n"
          + "\n".join(rows) + f"\n\nloadavg {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, "
          f"{os.cpu_count()} CPUs, kernel {os.uname().release}\n")
    suffix = "_quick" if args.quick else ""
    write_report(md, REPO / "bench" / "results" / f"tracefs_rate{suffix}.md")


if __name__ == "__main__":
    main()
