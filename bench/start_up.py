#!/usr/bin/env python3
"""What a short run costs, as a user types it, against the tool people
would use instead on the same work, pair by pair:

  one-hit trace   ustack trace syscall:write -c 'echo hello'
                  bpftrace -e 'tracepoint:syscalls:sys_enter_write
                           /pid == cpid/ { print(ustack); }' -c '/bin/echo hello'
  2 s profile     ustack profile -F 99 -p PID -d 2     (a busy CPython)
                  py-spy record -r 99 -d 2 -p PID      (same process)
                  perf record -F 99 -g -p PID -- sleep 2
  list of libc    ustack list LIBC
                  bpftrace -l 'uprobe:LIBC:*'
                  perf probe -x LIBC -F

    sudo .venv/bin/python bench/start_up.py [--pairs N]

(the venv's python: its `ustack` console script runs, with the repository's
src/ first on the path, and its py-spy.)

Each pair runs ustack, then the other tool (A B A B ...), each in a fresh
process; wall seconds from fork to reaping, CPU = user + system of the
tool and what it waited for (os.wait4; the profiled CPython is not the
tool's child, so its CPU is not counted), peak RSS of the largest one.
Ratios (ustack / other) are taken pair by pair, then the median: pairing
keeps a ratio meaningful while the shared machine's speed drifts. One
unmeasured run of each first (caches and .pyc written). Writes
bench/results/start_up.md.

Then what a 2 s profile of a Python program costs before it samples at
all, each in a fresh process, alternated: the interpreter alone (`-c
pass`), the interpreter importing the modules a profile imports (listed
by a profile run itself), the whole profile, and py-spy's whole run: is
py-spy's CPU within reach of a Python program?
"""
from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
LIBC = os.path.realpath("/lib/x86_64-linux-gnu/libc.so.6")
PY_SPY = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
# a CPython busy in Python code (recursion: a deep, changing stack)
BUSY_PY = ("def f(n):\n    return n if n < 2 else f(n - 1) + f(n - 2)\n"
           "while True:\n    f(20)\n")


def ustack_env() -> dict:
    """The repository's src/ first; .pyc written as an installed package
    has them (PYTHONDONTWRITEBYTECODE would compile ~200 modules a run)."""
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def timed(argv: list, env=None) -> dict:
    """One run: wall s, cpu s (user + system), peak MB."""
    start = time.monotonic()
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=env)
    _pid, status, usage = os.wait4(proc.pid, 0)
    wall = time.monotonic() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{argv[0]} ... exited {proc.returncode}: {' '.join(argv)}")
    return {"wall": wall, "cpu": usage.ru_utime + usage.ru_stime,
            "peak": usage.ru_maxrss / 1024}


def cases(pid: int) -> list:
    """(title, ustack argv, [(other tool's name, argv)])."""
    # the console script, as a user runs it (`python -m` adds runpy's ~4 ms)
    script = Path(sys.executable).with_name("ustack")
    ustack = [str(script)] if script.exists() else [sys.executable, "-m", "ustack"]
    return [
        ("one-hit trace: syscall:write of `echo hello`",
         ustack + ["trace", "syscall:write", "-c", "echo hello"],
         [("bpftrace print(ustack)",
           ["bpftrace", "-e", "tracepoint:syscalls:sys_enter_write /pid == cpid/ "
            "{ print(ustack); }", "-c", "/bin/echo hello"])]),
        ("2 s profile of a busy CPython at 99 Hz",
         ustack + ["profile", "-F", "99", "-p", str(pid), "-d", "2"],
         [("py-spy record", [PY_SPY, "record", "-r", "99", "-d", "2", "-p", str(pid),
                             "-f", "raw", "-o", "/dev/null"]),
          ("perf record -g", ["perf", "record", "-q", "-F", "99", "-g", "-p", str(pid),
                              "-o", "/dev/null", "--", "sleep", "2"])]),
        ("list of libc's functions",
         ustack + ["list", LIBC],
         [("bpftrace -l", ["bpftrace", "-l", f"uprobe:{LIBC}:*"]),
          ("perf probe -F", ["perf", "probe", "-x", LIBC, "-F"])]),
    ]


def measure(pairs: int) -> list:
    busy = subprocess.Popen([sys.executable, "-c", BUSY_PY])
    env = ustack_env()
    rows = []
    try:
        time.sleep(0.3)             # the interpreter is in its loop
        for title, ours, others in cases(busy.pid):
            for name, theirs in others:
                if not shutil.which(theirs[0]) and not os.path.exists(theirs[0]):
                    print(f"{name}: {theirs[0]} not installed, skipped", file=sys.stderr)
                    continue
                timed(ours, env), timed(theirs)     # warm: caches, .pyc
                a, b = [], []
                for _ in range(pairs):
                    a.append(timed(ours, env))
                    b.append(timed(theirs))
                rows.append((title, name, a, b))
                print(f"{title} vs {name}: done", file=sys.stderr)
    finally:
        busy.kill()
        busy.wait()
    return rows


# run by the venv's python as the console script runs ustack, printing
# (last, after the report) the modules a profile imported: the interpreter's
# own at start excluded, a package's submodules left to it but ustack's
_LIST_MODULES = """import os, sys
first = set(sys.modules)
from ustack.cli import main
sys.argv = ["ustack"] + sys.argv[1:]
try:
    main()
finally:
    print(" ".join(sorted(m for m in set(sys.modules) - first if "." not in m
                          or m.startswith("ustack"))), file=sys.__stdout__, flush=True)
    os._exit(0)
"""


def floor(pairs: int) -> list:
    """[(what, [runs])] for a 2 s profile of a busy CPython: the parts
    ustack pays before it samples, and py-spy's whole run, alternated."""
    busy = subprocess.Popen([sys.executable, "-c", BUSY_PY])
    env = ustack_env()
    try:
        time.sleep(0.3)
        profile = ["profile", "-F", "99", "-p", str(busy.pid), "-d", "2"]
        listed = subprocess.run([sys.executable, "-c", _LIST_MODULES] + profile, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                text=True, check=True).stdout.splitlines()[-1].split()
        script = Path(sys.executable).with_name("ustack")
        ustack = [str(script)] if script.exists() else [sys.executable, "-m", "ustack"]
        parts = [
            ("the interpreter alone (`python -c pass`)", [sys.executable, "-c", "pass"]),
            (f"the interpreter importing what a profile imports ({len(listed)} modules)",
             [sys.executable, "-c", "import " + ", ".join(listed)]),
            ("ustack profile -F 99 -p PID -d 2", ustack + profile),
            ("py-spy record -r 99 -d 2 -p PID", [PY_SPY, "record", "-r", "99", "-d", "2",
                                                 "-p", str(busy.pid), "-f", "raw",
                                                 "-o", "/dev/null"]),
        ]
        for _what, argv in parts:
            timed(argv, env)                        # warm
        runs = {what: [] for what, _argv in parts}
        for _ in range(pairs):
            for what, argv in parts:
                runs[what].append(timed(argv, env))
    finally:
        busy.kill()
        busy.wait()
    return list(runs.items())


def floor_report(rows: list, pairs: int) -> str:
    lines = [f"### What a 2 s profile of a Python program costs before it samples "
             f"({pairs} rounds, medians, load {os.getloadavg()[0]:.1f})", "",
             "| process | CPU s | wall s | peak MB |", "|---|---:|---:|---:|"]
    for what, runs in rows:
        lines.append(f"| {what} | {median(runs, 'cpu'):.3f} | {median(runs, 'wall'):.3f} "
                     f"| {median(runs, 'peak'):.0f} |")
    return "\n".join(lines) + "\n"


def median(runs: list, key: str) -> float:
    return statistics.median(r[key] for r in runs)


def ratio(a: list, b: list, key: str) -> float:
    return statistics.median(x[key] / y[key] for x, y in zip(a, b))


def report(rows: list, pairs: int) -> str:
    load = os.getloadavg()[0]
    lines = [f"## Start-up: short runs against the tools people use instead "
             f"({pairs} pairs, medians)", "",
             f"{platform.node()}, {platform.release()}, {os.cpu_count()} CPUs, "
             f"{time.strftime('%Y-%m-%d %H:%M')}, load {load:.1f} at the end; "
             "`.venv/bin/python bench/start_up.py`. Each pair runs ustack then the other "
             "tool, fresh processes; ratio = ustack / other, pair by pair, then "
             "the median.", "",
             "| work | other tool | ustack wall s | other wall s | wall ratio "
             "| ustack CPU s | other CPU s | CPU ratio | ustack peak MB | other peak MB |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for title, name, a, b in rows:
        lines.append(
            f"| {title} | {name} | {median(a, 'wall'):.3f} | {median(b, 'wall'):.3f} "
            f"| {ratio(a, b, 'wall'):.2f} | {median(a, 'cpu'):.3f} | {median(b, 'cpu'):.3f} "
            f"| {ratio(a, b, 'cpu'):.2f} | {median(a, 'peak'):.0f} | {median(b, 'peak'):.0f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=7)
    parser.add_argument("--out", default=str(BENCH / "results" / "start_up.md"))
    args = parser.parse_args()
    text = report(measure(args.pairs), args.pairs) + "\n" + floor_report(floor(args.pairs),
                                                                          args.pairs)
    print(text)
    Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
