#!/usr/bin/env python3
"""Debian's php-cli (8.2): how many of a busy script's samples show its
call chain in order, and what merging PHP frames costs the in-kernel walk
per sample (the kernel's BPF statistics), beside the Python walk's and on
a process that runs no PHP.

    sudo python3 bench/php_frames.py [--seconds S] [--reps R] [--cost-only]

The script is tests/programs/php/chain.php: {main} -> a() -> b() ->
Spinner::spin(), spinning for S seconds of CPU. A sample counts when it was
taken while the script ran (php_execute_script in its native stack); it
is whole when its PHP frames of chain.php begin {main}, a, b,
Spinner::spin (outermost first, each with chain.php as its file) and it
ends at _start. Scopes: -c, -p (a php already spinning), whole machine
(kept to that php's pid). Prints Markdown."""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
CHAIN_PHP = REPO / "tests" / "programs" / "php" / "chain.php"
FIB_PHP = REPO / "bench" / "programs" / "php_fib.php"
CHAIN = ["{main}", "a", "b", "Spinner::spin"]


def ustack_counts(**scope) -> list:
    import ustack
    opts = ustack.Options(command="profile", events=["profile:hz:199"], backend="bpf", **scope)
    with ustack.Session(opts) as run:
        return run.counts()


def shares(counted: list, pid: int | None = None) -> tuple:
    """(samples while the script ran, whole ones)."""
    running = whole = 0
    for c in counted:
        if pid is not None and c.pid != pid:
            continue
        frames = c.stack.frames
        if not any(f.function == "php_execute_script" for f in frames):
            continue
        running += c.count
        chain = [f.function for f in reversed(frames)
                 if f.kind == "php" and f.file == str(CHAIN_PHP)]
        whole += c.count * (chain[:4] == CHAIN and frames[-1].function == "_start")
    return running, whole


def started_during(seconds: float) -> tuple:
    """chain.php started once a whole-machine run samples: (samples while
    the script ran, whole ones)."""
    from started_during import stacks_of_program_started_during
    running = whole = 0
    for s in stacks_of_program_started_during(["php", CHAIN_PHP, f"{seconds:g}"]):
        frames = s["frames"]
        if not any(f["function"] == "php_execute_script" for f in frames):
            continue
        running += s["count"]
        chain = [f["function"] for f in reversed(frames)
                 if f.get("kind") == "php" and f.get("file") == str(CHAIN_PHP)]
        whole += s["count"] * (chain[:4] == CHAIN and frames[-1]["function"] == "_start")
    return running, whole


def scope_run(scope: str, seconds: float, tmp: str) -> tuple:
    if scope == "started during":
        return started_during(seconds)
    if scope == "-c":
        return shares(ustack_counts(cmdline=f"php {CHAIN_PHP} {seconds:g}"))
    ready = os.path.join(tmp, f"ready-{time.monotonic_ns()}")
    proc = subprocess.Popen(["php", str(CHAIN_PHP), "0", ready], stdout=subprocess.DEVNULL)
    try:
        while not os.path.exists(ready):
            time.sleep(0.01)
        kw = {"pid": proc.pid} if scope == "-p" else {"pids": (proc.pid,)}
        return shares(ustack_counts(duration=seconds, **kw), proc.pid)
    finally:
        proc.kill()
        proc.wait()


from python_pass_cost import cost  # noqa: E402 (bench/ is this script's path: one cost runner for every pass)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--cost-only", action="store_true", help="the cost table alone")
    ap.add_argument("--shares-only", action="store_true", help="the share table alone")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="ustack-php-")
    version = subprocess.run(["php", "-v"], capture_output=True, text=True).stdout.split("\n")[0]
    print(f"{version}; tests/programs/php/chain.php for {args.seconds:g} s, profile:hz:199, "
          f"load average {os.getloadavg()[0]:.1f}\n")
    if not args.cost_only:
        print("| scope | samples while the script ran | whole (chain in order, to _start) |")
        print("|---|---:|---:|")
        for scope in ("-c", "-p", "whole machine", "started during"):
            running, whole = scope_run(scope, args.seconds, tmp)
            print(f"| {scope} | {running} | {whole} ({100 * whole / max(running, 1):.1f} %) |")
    if args.shares_only:
        return
    print("\nthe walking program's ns per sample (kernel BPF statistics, medians of "
          f"{args.reps}, interleaved)\n")
    print("| process | pass | on | off | ratio |")
    print("|---|---|---:|---:|---:|")
    python = ("import time\ndef f(n): return n if n < 2 else f(n - 1) + f(n - 2)\n"
              "end = time.time() + 2\nwhile time.time() < end: f(18)")
    for label, command, flag in (
            ("php chain.php (the PHP walk: 4-6 PHP frames)", f"php {CHAIN_PHP} 2", "--no-php"),
            ("php, recursive fib (the PHP walk: ~20 PHP frames)", f"php {FIB_PHP} 2", "--no-php"),
            ("sh busy loop (no PHP)", "timeout 2 sh -c 'while :; do :; done'", "--no-php"),
            ("python3, recursive fib (the Python walk)", f"python3 -c '{python}'",
             "--no-python")):
        on, off = cost(command, args.reps, flag)
        print(f"| {label} | {flag[5:]} | {on:.0f} | {off:.0f} | {on / off:.2f} |")


if __name__ == "__main__":
    main()
