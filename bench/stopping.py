#!/usr/bin/env python3
"""How long a run takes to end after Ctrl-C or SIGTERM, in each phase of a
set-up of thousands of uprobes (every function of libc: 3,673 probes here).

    sudo python3 bench/stopping.py [--tries N]

Commands: `count 'uprobe:LIBC:*' -c 'sleep 100'` (bpf backend, uprobe_multi
links) and `funccount 'LIBC:*' -c 'sleep 100'`. Phases, and how the signal
is put there (strace delivers it at a chosen system call, so no sleep
decides the phase):

  resolving   the 300th open of libc (each function's start is proven from
              the file: `strace -P LIBC -e inject=openat:signal=…:when=300`)
  loading     the main thread's first bpf(BPF_PROG_LOAD)
  attaching   the main thread's second bpf(BPF_LINK_CREATE) (a link: 256 uprobes)
  running     after the run printed its header (no strace)
  closing     as the run forks its closer (`-c true`: the run ends by itself,
              strace signals at that fork)

The bpf(2) and clone(2) call numbers come from one reference run of each
command under strace (the sequence is the same from run to run). Time =
strace's timestamp of the signal to its timestamp of the run's exit (its
own clock, -tt); `running` is timed from the kill to the exit. SIGINT and
SIGTERM alternate. Writes bench/results/stopping.md.
"""
from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTHON = os.environ.get("USTACK_PYTHON", sys.executable)
USTACK = [PYTHON, "-m", "ustack"]
LIBC = os.path.realpath("/lib/x86_64-linux-gnu/libc.so.6")
BOUND_S = 1.0
COMMANDS = {
    "count 'uprobe:libc:*'": ["count", f"uprobe:{LIBC}:*"],
    "funccount 'libc:*'": ["funccount", f"{LIBC}:*"],
}
PHASES = ["resolving", "loading", "attaching", "running", "closing"]
STAMP = re.compile(r"^(?:\d+\s+)?(\d+):(\d+):(\d+\.\d+) ")


def env() -> dict:
    return dict(os.environ, PYTHONPATH=os.path.join(REPO, "src"))


def seconds(line: str) -> float:
    h, m, s = STAMP.match(line).groups()
    return int(h) * 3600 + int(m) * 60 + float(s)


def reference(args: list, log: str) -> dict:
    """bpf(2) and clone(2) call numbers of the main thread in a whole run."""
    subprocess.run(["strace", "-o", log, "-e", "trace=bpf,clone", *USTACK, *args,
                    "-c", "true"], env=env(), stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, timeout=300, check=True)
    bpf = [l for l in open(log) if l.startswith("bpf(")]
    clones = [l for l in open(log) if l.startswith("clone(")]
    links = [n for n, l in enumerate(bpf, 1) if l.startswith("bpf(BPF_LINK_CREATE")]
    loads = [n for n, l in enumerate(bpf, 1) if l.startswith("bpf(BPF_PROG_LOAD")]
    return {"loading": loads[0], "attaching": links[1], "closing": len(clones)}


def injected(args: list, phase: str, when: int, sig: signal.Signals, log: str) -> tuple:
    """(seconds from the signal to the exit, exit status, phase reached)."""
    name = sig.name[3:]
    if phase == "resolving":
        trace = ["-P", LIBC, "-e", "trace=openat",
                 "-e", f"inject=openat:signal={name}:when={when}"]
    elif phase == "closing":
        trace = ["-e", "trace=clone", "-e",
                 f"inject=clone:signal={name}:when={when}"]
    else:
        trace = ["-e", "trace=bpf", "-e",
                 f"inject=bpf:signal={name}:when={when}"]
    command = "true" if phase == "closing" else "sleep 100"
    subprocess.run(["strace", "-tt", "-o", log, *trace, *USTACK, *args, "-c", command],
                   env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   timeout=300)
    lines = open(log).read().splitlines()
    sent = next((l for l in lines if f"--- {sig.name} " in l), None)
    ended = next((l for l in lines if "+++ exited with" in l or "+++ killed by" in l), None)
    if sent is None or ended is None:
        return None, None, "no signal"
    status = int(ended.split("exited with ")[1].split()[0]) if "exited" in ended else -1
    return seconds(ended) - seconds(sent), status, phase


def running(args: list, sig: signal.Signals) -> tuple:
    us = subprocess.Popen([*USTACK, *args, "-c", "sleep 100"], env=env(),
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    header = us.stderr.readline()           # printed once the probes are live
    if not header.startswith("Tracing"):
        us.kill()
        us.wait()
        return None, None, "no header"
    sent = time.monotonic()
    us.send_signal(sig)
    us.communicate(timeout=300)
    return time.monotonic() - sent, us.returncode, "running"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tries", type=int, default=20)
    opts = ap.parse_args()
    if shutil.which("strace") is None:
        sys.exit("strace is needed")
    rows = []
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "log")
        for title, args in COMMANDS.items():
            calls = reference(args, log)
            calls["resolving"] = 300
            for phase in PHASES:
                times, statuses = [], set()
                for n in range(opts.tries):
                    sig = (signal.SIGINT, signal.SIGTERM)[n % 2]
                    if phase == "running":
                        took, status, _ = running(args, sig)
                    else:
                        took, status, _ = injected(args, phase, calls[phase], sig, log)
                    if took is not None:
                        times.append(took)
                        statuses.add(status)
                    print(f"{title} {phase} {sig.name}: {took} (exit {status})", flush=True)
                rows.append((title, phase, times, statuses))
    write(rows, opts.tries, load_before)
    return 0


def load(averages) -> str:
    return " ".join(f"{x:.1f}" for x in averages)


def write(rows: list, tries: int, load_before) -> None:
    out = [
        "# Ending a run in each phase of a 3,673-uprobe set-up",
        "",
        f"{datetime.now():%Y-%m-%d %H:%M}, {platform.node()}, kernel "
        f"{platform.release()}, {os.cpu_count()} CPUs (shared, loaded: load "
        f"average {load(load_before)} at the start, {load(os.getloadavg())} at the end). "
        f"`python3 bench/stopping.py --tries {tries}`: SIGINT and SIGTERM "
        "alternate; strace puts the signal at a chosen system call of the "
        "phase and times it to the exit (see the script's docstring).",
        "",
        f"| command | phase | tries | within {BOUND_S:g} s | median s | max s | exit |",
        "|---|---|---|---|---|---|---|",
    ]
    for title, phase, times, statuses in rows:
        within = sum(t <= BOUND_S for t in times)
        med = f"{statistics.median(times):.3f}" if times else "-"
        top = f"{max(times):.3f}" if times else "-"
        out.append(f"| {title} | {phase} | {len(times)} | {within} | {med} | {top} | "
                   f"{', '.join(map(str, sorted(statuses)))} |")
    path = os.path.join(REPO, "bench", "results", "stopping.md")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")
    print("\n".join(out))


if __name__ == "__main__":
    sys.exit(main())
