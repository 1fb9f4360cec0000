#!/usr/bin/env python3
"""The cost of a live view of the whole machine: `ustack top -F 99` vs
`perf top -e cpu-clock -F 99` (with and without -g), one run.

    sudo python3 bench/top.py [--seconds S] [--reps R]

Each tool runs on a pseudo-terminal of its own (40 x 140), as a person
would run it, for S seconds (default 20), then q is typed; tools run R
times round-robin (default 3), medians reported:

  CPU %        the tool's own user + system time (wait4) ÷ S
  set-up s     launch → its first screen
  CPU % after  the CPU it used from its first screen to q, ÷ that time
               (set-up left out: what watching costs)
  q → exit s   q typed → the process reaped (terminal restored)
  maxrss MB    the kernel's peak resident size of the process

perf top samples cpu-clock (this kind of machine has no hardware PMU)
and unwinds with frame pointers in the kernel (-g); ustack top unwinds
with DWARF in the kernel (--backend bpf). Results: bench/results/top.md.
"""
from __future__ import annotations

import argparse
import fcntl
import os
import platform
import pty
import select
import shutil
import statistics
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results" / "top.md"
ROWS, COLUMNS = 40, 140
DRAWN = 400                     # bytes on the screen that make a first screen

TOOLS = {
    "ustack top -F 99": [sys.executable, "-m", "ustack", "top", "-F", "99"],
    "perf top -e cpu-clock -F 99 -g": ["perf", "top", "-e", "cpu-clock", "-F", "99", "-g"],
    "perf top -e cpu-clock -F 99": ["perf", "top", "-e", "cpu-clock", "-F", "99"],
}


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one_run(argv: list, seconds: float) -> dict:
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLUMNS, 0, 0))

    def controlling_terminal():
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    env = dict(os.environ, TERM="xterm", PYTHONPATH=str(REPO / "src"))
    start = time.monotonic()
    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave,
                            preexec_fn=controlling_terminal, env=env)
    drawn, first = 0, None
    while time.monotonic() < start + seconds:
        if select.select([master], [], [], 0.2)[0]:
            drawn += len(os.read(master, 65536))
            if first is None and drawn > DRAWN:
                first = (time.monotonic(), _cpu_seconds(proc.pid))
    typed = time.monotonic()
    os.write(master, b"q")
    while True:
        if select.select([master], [], [], 0.05)[0]:
            try:
                os.read(master, 65536)
            except OSError:
                pass
        pid, _status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
    reaped = time.monotonic()
    os.close(slave)
    os.close(master)
    cpu = usage.ru_utime + usage.ru_stime
    return {"cpu": 100 * cpu / seconds,
            "setup": first[0] - start if first else float("nan"),
            "after": 100 * (cpu - first[1]) / (typed - first[0]) if first else float("nan"),
            "exit": reaped - typed, "rss": usage.ru_maxrss / 1024}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench/top.py needs root")
    tools = {name: argv for name, argv in TOOLS.items()
             if shutil.which(argv[0]) or argv[0] == sys.executable}
    runs: dict = {name: [] for name in tools}
    for _ in range(args.reps):
        for name, argv in tools.items():
            runs[name].append(one_run(argv, args.seconds))
            print(name, runs[name][-1], flush=True)
    load = os.getloadavg()[0]
    lines = [f"# ustack top vs perf top, the whole machine ({time.strftime('%Y-%m-%d')}, "
             f"kernel {platform.release()}, {os.cpu_count()} CPUs, load average "
             f"{load:.1f} at the end; {args.seconds:.0f} s each, medians of {args.reps})",
             "", "| tool | CPU % | set-up s | CPU % after | q → exit s | maxrss MB |",
             "|---|---:|---:|---:|---:|---:|"]
    for name, results in runs.items():
        med = {k: statistics.median(r[k] for r in results) for k in results[0]}
        lines.append(f"| {name} | {med['cpu']:.1f} | {med['setup']:.1f} | "
                     f"{med['after']:.1f} | {med['exit']:.2f} | {med['rss']:.0f} |")
    RESULTS.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
