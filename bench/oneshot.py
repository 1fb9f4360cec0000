#!/usr/bin/env python3
"""A short run, as a user types it: how long until the traced command runs
with the probes live, and how long the whole one-hit run takes, for a
uprobe, a syscall and a profile, against bpftrace and perf.

    sudo python3 bench/oneshot.py [--reps N]

The traced command is bench/programs/oneshot.c (-O2, no frame pointers):
it prints the wall-clock time it started (the tools start it only once
their probes are live), then calls d once and writes once. Per event kind:

  uprobe    ustack count uprobe:ONESHOT:d     bpftrace uprobe:ONESHOT:d
            perf record -e oneshot_probe:d -g (a perf probe made before)
  syscall   ustack count syscall:write         bpftrace tracepoint:syscalls:sys_enter_write
            perf record -e syscalls:sys_enter_write -g
  profile   ustack profile -F 99               bpftrace profile:hz:99 /pid == cpid/
            perf record -F 99 -g
  glob      ustack funccount 'libc:str*'       bpftrace uprobe:LIBC:str* {@[probe] = count()}
            (86 uprobes: what attaching and detaching many costs; no perf row)

Each tool's stacks are counted by it ({@[ustack] = count()} for bpftrace).
`launch → live` = the time `date` printed minus the time the tool was
started; `whole` = the tool's wall time from fork to exit. Tools alternate,
each in a fresh process, REPS times (default 7); medians, and the ratio to
bpftrace. ustack runs with its caches warm and its .pyc written (one run
of each first, not timed). Writes bench/results/oneshot.md.
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

PERF_PROBE = "oneshot_probe"


def commands(kind: str, traced: str) -> dict:
    chain = traced
    ustack = [sys.executable, "-m", "ustack"]
    if kind == "uprobe":
        return {
            "ustack": ustack + ["count", f"uprobe:{chain}:d", "-c", traced],
            "bpftrace": ["bpftrace", "-e", f"uprobe:{chain}:d {{ @[ustack] = count(); }}",
                         "-c", traced],
            "perf record -g": ["perf", "record", "-q", "-g", "-e", f"{PERF_PROBE}:oneshot_d",
                               "-o", "/dev/null", "--", traced],
        }
    if kind == "syscall":
        return {
            "ustack": ustack + ["count", "syscall:write", "-c", traced],
            "bpftrace": ["bpftrace", "-e", "tracepoint:syscalls:sys_enter_write "
                         "/pid == cpid/ { @[ustack] = count(); }", "-c", traced],
            "perf record -g": ["perf", "record", "-q", "-g", "-e",
                               "syscalls:sys_enter_write", "-o", "/dev/null", "--",
                               traced],
        }
    if kind == "glob":       # many uprobes: 86 str* functions of libc, counted
        libc = os.path.realpath("/lib/x86_64-linux-gnu/libc.so.6")
        return {
            "ustack": ustack + ["funccount", "libc:str*", "-c", traced],
            "bpftrace": ["bpftrace", "-e", f"uprobe:{libc}:str* {{ @[probe] = count(); }}",
                         "-c", traced],
        }
    return {
        "ustack": ustack + ["profile", "-F", "99", "-c", traced],
        "bpftrace": ["bpftrace", "-e", "profile:hz:99 /pid == cpid/ "
                     "{ @[ustack] = count(); }", "-c", traced],
        "perf record -g": ["perf", "record", "-q", "-g", "-F", "99", "-o", "/dev/null",
                           "--", traced],
    }


def one(cmd: list, timeout: float) -> tuple:
    """(ms from launch to the command's start, ms of the whole run)."""
    start = time.time()
    t0 = time.monotonic()
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                         env=ustack_env())
    whole = (time.monotonic() - t0) * 1000
    if res.returncode != 0:
        raise RuntimeError(f"{cmd[:3]} exited {res.returncode}: {res.stderr[-300:]}")
    m = re.search(r"^(\d{9,}\.\d+)$", res.stdout + res.stderr, re.M)
    if not m:
        raise RuntimeError(f"{cmd[:3]}: the command printed no start time")
    return (float(m.group(1)) - start) * 1000, whole


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--timeout", type=float, default=60)
    ap.add_argument("--kinds", default="uprobe,syscall,profile,glob",
                    help="which rows, comma-separated (default: all four)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("oneshot: run as root")
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)     # a user's Python writes .pyc
    traced = str(Path(tempfile.mkdtemp(prefix="oneshot.")) / "oneshot")
    subprocess.run(["gcc", "-O2", "-fomit-frame-pointer", "-o", traced,
                    str(BENCH / "programs" / "oneshot.c")], check=True)
    chain = traced
    have = {"bpftrace": shutil.which("bpftrace"), "perf record -g": shutil.which("perf")}
    if have["perf record -g"]:     # (one a killed run of this left goes first)
        subprocess.run(["perf", "probe", "-q", "-d", f"{PERF_PROBE}:oneshot_d"], capture_output=True)
        subprocess.run(["perf", "probe", "-q", "-x", chain, "-a", f"{PERF_PROBE}:oneshot_d=d"],
                       capture_output=True, check=True)
    rows = ["| event | tool | launch → live ms | whole run ms | ÷ bpftrace (live, whole) |",
            "|---|---|---:|---:|---:|"]
    try:
        for kind in args.kinds.split(","):
            cmds = {name: cmd for name, cmd in commands(kind, traced).items()
                    if name == "ustack" or have[name]}
            for cmd in cmds.values():                       # warm caches, .pyc
                one(cmd, args.timeout)
            times: dict = {name: [] for name in cmds}
            for rep in range(args.reps):
                for name, cmd in cmds.items():
                    print(f"[{kind} {rep + 1}/{args.reps}] {name}", file=sys.stderr)
                    times[name].append(one(cmd, args.timeout))
            med = {name: (statistics.median(t[0] for t in ts),
                          statistics.median(t[1] for t in ts)) for name, ts in times.items()}
            ref = med.get("bpftrace")
            for name, (live, whole) in med.items():
                ratio = (f"{live / ref[0]:.2f}, {whole / ref[1]:.2f}" if ref else "-")
                rows.append(f"| {kind} | {name} | {live:.0f} | {whole:.0f} | {ratio} |")
    finally:
        if have["perf record -g"]:
            subprocess.run(["perf", "probe", "-q", "-d", f"{PERF_PROBE}:oneshot_d"],
                           capture_output=True)
        shutil.rmtree(os.path.dirname(traced))
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    md = "\n".join([
        "## One short run: launch → probes live, and the whole run", "",
        f"bench/programs/oneshot.c traced; medians of {args.reps}, tools "
        f"alternated; {time.strftime('%Y-%m-%d')}, kernel {platform.release()}, "
        f"{os.cpu_count()} CPUs, loadavg at the end {load}.", "", *rows, ""])
    write_report(md, REPO / "bench" / "results" / "oneshot.md")


if __name__ == "__main__":
    main()
