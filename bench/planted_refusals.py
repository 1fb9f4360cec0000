#!/usr/bin/env python3
"""How fast a name planted by another user is refused: every -o, recording,
archive, --every directory and cache directory, with a FIFO, a hard link to
the planter's file, a link to root's directory in place of a parent
directory, or a device of theirs at the name (planted by nobody through
setpriv in a sticky world-writable directory, as
tests/test_planted_outputs.py plants them).

    sudo python3 bench/planted_refusals.py [--tries N]

Each try plants afresh and times `python -m ustack …` from its start to
its exit (wall clock, interpreter start-up included; also its CPU time,
which the machine's load does not inflate). Counted per case:
refusals in one `ustack: ` line with exit 1 and nothing on stdout, runs
that left what was planted untouched, and runs within 1 s. A cache
directory is not refused but left unused: there the run (a report of a
recording) must succeed with the planted name untouched.
Writes bench/results/planted_refusals.md.
"""
from __future__ import annotations

import argparse
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(BENCH))
from helpers import FP, build, ustack_env  # noqa: E402
from test_planted_outputs import (COMMANDS, FIXTURES, RECORDING, plant,  # noqa: E402
                                  writers)
from uprobe_rate import write_report  # noqa: E402

KINDS = ("fifo", "hard link", "parent link", "device")
BOUND_S = 1.0
CPU_SPENT: list = []     # CPU seconds (user + system) of each timed run


def cpu_of_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(argv: list, env: dict | None = None) -> tuple:
    """(result, wall seconds); the run's CPU seconds go to CPU_SPENT."""
    cpu, started = cpu_of_children(), time.monotonic()
    res = subprocess.run([sys.executable, "-m", "ustack", *map(str, argv)],
                         env=env or ustack_env(), capture_output=True, text=True,
                         timeout=60)
    took = time.monotonic() - started
    CPU_SPENT.append(cpu_of_children() - cpu)
    return res, took


def one_try(case: str, how: str, chain: Path) -> tuple:
    """(refused in one line, planted untouched, seconds) of one fresh try."""
    shared = Path(tempfile.mkdtemp(prefix="ustack-shared-", dir="/tmp"))
    shared.chmod(0o1777)
    roots_dir = Path(tempfile.mkdtemp(prefix="ustack-root-", dir="/tmp"))
    (roots_dir / "out").write_bytes(b"root's file, not to be touched\n")
    try:
        planted = plant(how, shared, roots_dir)
        path = planted.path
        if case == "--every":
            res, took = timed(["profile", "-F", "99", "--every", "1", "-d", "1",
                               "-o", f"{path}/", "-c", "sleep 1"])
        elif case == "cache directory":
            env = dict(ustack_env(), USTACK_CACHE_DIR=str(path))
            res, took = timed(["report", RECORDING, "--objects", FIXTURES,
                               "-f", "folded"], env)
            return res.returncode == 0 and bool(res.stdout), planted.untouched(), took
        else:
            if case == "archive -o" and how == "parent link":
                path = path.with_name("archived")   # an archive is a new directory
            res, took = timed(writers(chain)[case](path))
        lines = res.stderr.splitlines()
        one_line = (res.returncode == 1 and res.stdout == "" and len(lines) == 1
                    and lines[0].startswith("ustack: "))
        if not one_line:
            print(f"{case} / {how}: exit {res.returncode}: {res.stderr.strip()[-300:]}",
                  file=sys.stderr)
        return one_line, planted.untouched(), took
    finally:
        shutil.rmtree(shared)
        shutil.rmtree(roots_dir)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tries", type=int, default=3)
    opts = ap.parse_args()
    chain = build("chain", flags=FP)
    rows, worst, cpu_worst = [], 0.0, 0.0
    cases = COMMANDS + ["--every", "cache directory"]
    for case in cases:
        for how in KINDS:
            CPU_SPENT.clear()
            results = [one_try(case, how, chain) for _ in range(opts.tries)]
            times = [t for _, _, t in results]
            cpu_worst = max(cpu_worst, *CPU_SPENT)
            worst = max(worst, *times)
            rows.append((case, how, opts.tries, sum(ok for ok, _, _ in results),
                         sum(u for _, u, _ in results),
                         sum(t <= BOUND_S for t in times),
                         f"{statistics.median(times):.2f}", f"{max(times):.2f}",
                         f"{max(CPU_SPENT):.2f}"))
            print(rows[-1], file=sys.stderr)
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    lines = ["# Planted names at every output: refused at once, in one line\n",
             f"{datetime.now():%Y-%m-%d %H:%M}, {platform.node()}, kernel "
             f"{platform.release()}, {os.cpu_count()} CPUs (shared), load average at "
             f"the end {load}. `python3 bench/planted_refusals.py --tries {opts.tries}` "
             "(see its docstring): wall time from the start of `python -m ustack` to its "
             "exit; CPU s: the run's user and system time. For the cache directory, "
             "`refused` counts runs that succeeded without it.\n",
             "| output | planted | tries | refused, one line | untouched | within 1 s "
             "| median s | max s | max CPU s |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {' | '.join(map(str, r))} |" for r in rows]
    total = sum(r[2] for r in rows)
    lines.append(f"\n{sum(r[3] for r in rows)} of {total} refused (or run without "
                 f"the cache) as above, {sum(r[4] for r in rows)} of {total} left "
                 f"untouched, {sum(r[5] for r in rows)} of {total} within 1 s "
                 f"(slowest {worst:.2f} s; CPU time of a run, user and system, at most "
                 f"{cpu_worst:.2f} s).")
    write_report("\n".join(lines) + "\n", BENCH / "results" / "planted_refusals.md")


if __name__ == "__main__":
    main()
