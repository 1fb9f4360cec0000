#!/usr/bin/env python3
"""A count over every function of libc of a short command, launch to exit:
what attaching and detaching thousands of uprobes costs.

    sudo python3 bench/glob_count.py [--reps N] [--timeout S]

The traced command is bench/programs/oneshot.c (-O2, no frame pointers):
it prints the wall-clock time it started (the tools start it only once
their probes are live), then calls d once and writes once. Two rows:

  ustack     ustack count 'uprobe:LIBC:*' -c ONESHOT
  bpftrace   bpftrace FILE -c ONESHOT, FILE holding
             uprobe:LIBC:F1, uprobe:LIBC:F2, … { @[ustack] = count(); }
             over libc's dynamic function symbols

bpftrace 0.17 stops at the first function whose uprobe the kernel refuses
(`uprobe:LIBC:*` fails at pthread_spin_lock's `lock` prefix), so it is
given the dynamic symbols (nm -D: functions, no IFUNC) less those ustack
says the kernel cannot probe; ustack's glob also takes the local symbols
of libc's debug file. BPFTRACE_MAX_PROBES is raised (bpftrace refuses
more than 512 by default). LIBC is libc.so.6's real path. `launch → live` = the time the command printed minus the
time the tool was started; `whole` = the tool's wall time from fork to
exit. Tools alternate, each in a fresh process, REPS times (default 3;
bpftrace --peer-reps times, default 1: its uprobes are in every process,
which slows the whole machine for as long as it runs, and its exit takes
minutes more); medians. A run longer than --timeout (default 300 s) is
killed and shown as more than that. ustack runs once first, untimed, with its caches warm
and .pyc written. Writes bench/results/glob_count.md.
"""
from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(BENCH))
from helpers import ustack_env  # noqa: E402
from uprobe_rate import write_report  # noqa: E402


LIBC = os.path.realpath("/lib/x86_64-linux-gnu/libc.so.6")


def commands(traced: str, refused: set) -> dict:
    names = sorted({line.split()[2].split("@")[0] for line in subprocess.run(
        ["nm", "-D", "--defined-only", LIBC], capture_output=True, text=True,
        check=True).stdout.splitlines() if line.split()[1] in "TW"} - refused)
    script = Path(traced).with_name("glob.bt")     # too long for one argument
    script.write_text(",\n".join(f"uprobe:{LIBC}:{name}" for name in names)
                      + "\n{ @[ustack] = count(); }\n")
    return {
        "ustack": [sys.executable, "-m", "ustack", "count", f"uprobe:{LIBC}:*",
                   "-c", traced],
        "bpftrace": ["bpftrace", str(script), "-c", traced],
    }


def refused_by_ustack(traced: str) -> tuple:
    """(ustack's stderr of one run, the names it said no uprobe can go on)."""
    res = subprocess.run(commands(traced, set())["ustack"], capture_output=True,
                         text=True, env=ustack_env())
    return res.stderr, set(re.findall(r"skipped: (?:the kernel cannot place a uprobe at )?"
                                      r"(\S+) in ", res.stderr))


def one(cmd: list, timeout: float) -> tuple:
    """(ms from launch to the command's start or None, ms of the whole run
    or None past the timeout, how many uprobes the tool said it placed)."""
    start = time.time()
    t0 = time.monotonic()
    try:
        # bpftrace refuses more than 512 probes unless told
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                             env={**ustack_env(), "BPFTRACE_MAX_PROBES": "100000"})
    except subprocess.TimeoutExpired:
        return None, None, None
    whole = (time.monotonic() - t0) * 1000
    if res.returncode != 0:
        raise RuntimeError(f"{cmd[:3]} exited {res.returncode}: {res.stderr[-300:]}")
    m = re.search(r"^(\d{9,}\.\d+)$", res.stdout + res.stderr, re.M)
    live = (float(m.group(1)) - start) * 1000 if m else None
    n = re.search(r"… \((\d+) events\)|Attaching (\d+) probes", res.stderr + res.stdout)
    return live, whole, n and int(n.group(1) or n.group(2))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--peer-reps", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=300)
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("glob_count: run as root")
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)     # a user's Python writes .pyc
    traced = str(Path(tempfile.mkdtemp(prefix="globcount.")) / "oneshot")
    subprocess.run(["gcc", "-O2", "-fomit-frame-pointer", "-o", traced,
                    str(BENCH / "programs" / "oneshot.c")], check=True)
    try:
        _err, refused = refused_by_ustack(traced)        # also warms caches, .pyc
        cmds = {name: cmd for name, cmd in commands(traced, refused).items()
                if name == "ustack" or shutil.which(name)}
        times: dict = {name: [] for name in cmds}
        for rep in range(args.reps):
            for name, cmd in cmds.items():
                if name != "ustack" and rep >= args.peer_reps:
                    continue
                print(f"[{rep + 1}/{args.reps}] {name}", file=sys.stderr)
                times[name].append(one(cmd, args.timeout))
                print(f"  {times[name][-1]}", file=sys.stderr)
    finally:
        shutil.rmtree(os.path.dirname(traced))
    limit = f"> {args.timeout:.0f} s"

    def ms(values: list) -> str:
        done = [v for v in values if v is not None]
        if len(done) * 2 <= len(values):
            return limit
        return f"{statistics.median(done) / 1000:.2f} s"

    rows = ["| tool | uprobes placed | launch → live | whole run (launch → exit) |",
            "|---|---:|---:|---:|"]
    for name, ts in times.items():
        placed = max((t[2] for t in ts if t[2] is not None), default=None)
        rows.append(f"| {name} | {placed if placed is not None else '?'} | "
                    f"{ms([t[0] for t in ts])} | {ms([t[1] for t in ts])} |")
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    md = "\n".join([
        "## count over every function of libc of a -c command", "",
        f"bench/programs/oneshot.c traced; medians of {args.reps} (bpftrace: "
        f"{args.peer_reps}), tools alternated; "
        f"{time.strftime('%Y-%m-%d')}, kernel {platform.release()}, {os.cpu_count()} "
        f"CPUs, loadavg at the end {load}.", "", *rows, ""])
    write_report(md, REPO / "bench" / "results" / "glob_count.md")


if __name__ == "__main__":
    main()
