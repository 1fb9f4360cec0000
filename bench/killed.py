#!/usr/bin/env python3
"""What a killed run leaves: its -c command when ustack and its guardian are
both SIGKILLed, and the probes of a closer SIGKILLed mid-work.

    sudo python3 bench/killed.py [--tries N]

double kill   `ustack count uprobe:LIBC:write -c "sh -c 'echo $$ > F; exec
              sleep 1000'"`: once F names the command, SIGKILL the guardian
              and ustack; then wait (up to 5 s) for the command's end.
              Counted: commands gone, and the time from the kills to the end.
closer        `ustack count --backend perf 'uprobe:LIBC:fputw*' -c true` (6
              uprobes; their closing goes to a closer) in a pid namespace of
              its own (no other run on the machine removes its probes): as
              the run exits, SIGKILL the closer, and time until no probe of
              the run is left (polled every 1 ms, up to 10 s). A try whose
              closer was done before the kill is run again.

Writes bench/results/killed.md.
"""
from __future__ import annotations

import argparse
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTHON = os.environ.get("USTACK_PYTHON", sys.executable)
LIBC = os.path.realpath("/lib/x86_64-linux-gnu/libc.so.6")
TAG = f"USTACK_BENCH_TAG={os.getpid()}"
UPROBE_EVENTS = "/sys/kernel/tracing/uprobe_events"


def env() -> dict:
    name, value = TAG.split("=")
    return dict(os.environ, PYTHONPATH=os.path.join(REPO, "src"), **{name: value})


def children(pid: int) -> list:
    kids = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            kids += [int(k) for k in open(f"/proc/{pid}/task/{task}/children").read().split()]
        except OSError:
            pass
    return kids


def gone(pidfd: int) -> bool:
    import select
    return bool(select.select([pidfd], [], [], 0)[0])


def double_kill(tmp: str) -> float | None:
    """Seconds from the kills to the command's end; None if it ran on."""
    alive = os.path.join(tmp, "alive")
    us = subprocess.Popen(
        [PYTHON, "-m", "ustack", "count", f"uprobe:{LIBC}:write", "-c",
         f"sh -c 'echo $$ > {alive}.new && mv {alive}.new {alive} && exec sleep 1000'"],
        env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while not os.path.exists(alive):
        time.sleep(0.005)
    command = os.pidfd_open(int(open(alive).read()))
    os.unlink(alive)
    me = open(f"/proc/{us.pid}/cmdline", "rb").read()
    for kid in children(us.pid):
        try:
            if open(f"/proc/{kid}/cmdline", "rb").read() == me:
                os.kill(kid, signal.SIGKILL)             # the guardian
        except OSError:
            pass
    killed = time.monotonic()
    us.kill()
    us.wait()
    while not gone(command) and time.monotonic() - killed < 5:
        time.sleep(0.001)
    took = time.monotonic() - killed if gone(command) else None
    if took is None:
        signal.pidfd_send_signal(command, signal.SIGKILL)
    os.close(command)
    # what the pair made is the next run's to remove
    subprocess.run([PYTHON, "-m", "ustack", "count", f"uprobe:{LIBC}:write", "-c", "true"],
                   env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return took


def group_lines(pattern: str) -> list:
    return [l for l in open(UPROBE_EVENTS).read().splitlines()
            if re.match(rf"^[pr]:{pattern}/", l)]


def closers() -> list:
    found = []
    for d in os.listdir("/proc"):
        try:
            if (d.isdigit() and open(f"/proc/{d}/comm").read().strip() == "ustack-closer"
                    and TAG.encode() in open(f"/proc/{d}/environ", "rb").read().split(b"\0")):
                found.append(int(d))
        except OSError:
            pass
    return found


def killed_closer() -> tuple:
    """(seconds from the kill to no probe left or None, probes at the kill)."""
    script = '"$0" -m ustack "$@" >/dev/null; echo ended $?; read line'
    us = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", "sh", "-c", script,
                           PYTHON, "count", "--backend", "perf", f"uprobe:{LIBC}:fputw*",
                           "-c", "true"], env=env(), stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        while not children(us.pid):
            time.sleep(0.001)
        shell = children(us.pid)[0]         # pid 1 of the namespace
        group = rf"ustack_\d+_{os.stat(f'/proc/{shell}/ns/pid').st_ino}"
        ended = us.stdout.readline()
        found = []
        while group_lines(group) and not found:     # it names itself as it starts
            found = closers()
        if ended != "ended 0\n" or not found:
            print("no closer to kill:", ended.strip(), flush=True)
            return None, 0
        for pid in found:
            os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        left = len(group_lines(group))
        while group_lines(group) and time.monotonic() - killed < 10:
            time.sleep(0.001)
        took = time.monotonic() - killed
        rest = group_lines(group)
        while group_lines(group):           # never left behind (nor in the next try's way)
            for line in group_lines(group):
                fd = os.open(UPROBE_EVENTS, os.O_WRONLY | os.O_APPEND)
                try:
                    os.write(fd, f"-:{line.split()[0][2:]}\n".encode())
                except OSError:
                    pass                    # still held: the kernel lets go soon
                finally:
                    os.close(fd)
            time.sleep(0.01)
        return (None if rest else took), left
    finally:
        us.stdin.write("\n")
        us.stdin.flush()
        us.communicate()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tries", type=int, default=20)
    opts = ap.parse_args()
    doubles, closes = [], []
    load_before = " ".join(f"{x:.1f}" for x in os.getloadavg())
    with tempfile.TemporaryDirectory() as tmp:
        for n in range(opts.tries):
            doubles.append(double_kill(tmp))
            while True:                     # a closer that was done first does not count
                took, left = killed_closer()
                if left or took is None:
                    break
            closes.append((took, left))
            print(n, doubles[-1], closes[-1], flush=True)
    ends = [t for t in doubles if t is not None]
    cleared = [t for t, _ in closes if t is not None]
    lefts = [n for _, n in closes]
    out = [
        "# What a killed run leaves",
        "",
        f"{datetime.now():%Y-%m-%d %H:%M}, {platform.node()}, kernel {platform.release()}, "
        f"{os.cpu_count()} CPUs (shared, loaded: load average {load_before} at the "
        f"start, {' '.join(f'{x:.1f}' for x in os.getloadavg())} at the end). "
        f"`python3 bench/killed.py --tries "
        f"{opts.tries}` (see its docstring).",
        "",
        "| case | tries | ended/cleared | median s | max s |",
        "|---|---|---|---|---|",
        f"| -c command after SIGKILL of ustack and its guardian | {len(doubles)} | "
        f"{len(ends)} | {statistics.median(ends) if ends else float('nan'):.3f} | "
        f"{max(ends) if ends else float('nan'):.3f} |",
        f"| probes of a closer SIGKILLed mid-work (6 uprobes, {min(lefts)}-{max(lefts)} "
        f"left at the kill) | {len(closes)} | {len(cleared)} | "
        f"{statistics.median(cleared) if cleared else float('nan'):.3f} | "
        f"{max(cleared) if cleared else float('nan'):.3f} |",
        "",
        f"Closer: cleared within 1 s in {sum(t <= 1.0 for t in cleared)} of {len(closes)}.",
    ]
    with open(os.path.join(REPO, "bench", "results", "killed.md"), "w") as f:
        f.write("\n".join(out) + "\n")
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
