#!/usr/bin/env python3
"""Ruby frames (src/ustack/bpf/ruby.h): how many of a busy script's samples
carry its call chain, and what the Ruby pass costs per sample.

tests/programs/ruby/calls.rb (<main> -> a -> block in a -> b -> c, c
spinning for SECONDS of CPU) is profiled at 199 Hz by -c and by -p; a
sample carries the chain when calls.rb's frames, outermost first, are
exactly those five. The cost: the stack-walking program's ns per run
from the kernel's BPF statistics (BPF_ENABLE_STATS, on while this runs),
read just before the run closes it, for
  - calls.rb with Ruby frames, and with --no-ruby (the native walk only);
  - tests/programs/python/frames.py busy with Python frames, and with
    --no-python (the Python walk's cost beside Ruby's);
  - tests/programs busy.c (no interpreter) with Ruby frames on and with
    --no-ruby: a process that runs no Ruby pays one test.
Runs are interleaved (the machine is shared: ratios, medians).

    sudo python3 bench/ruby_frames.py [--reps R] [--seconds S] [--cost-only]

Prints Markdown."""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CALLS = REPO / "tests" / "programs" / "ruby" / "calls.rb"
FRAMES = REPO / "tests" / "programs" / "python" / "frames.py"
BUSY_C = REPO / "tests" / "programs" / "busy.c"
CHAIN = ["<main>", "Object#a", "block in Object#a", "Object#b", "Worker#c"]


from python_pass_cost import ONE_RUN  # noqa: E402 (bench/ is this script's path: one stats run for every pass)


def ustack(*args: str, cost: bool = False) -> str:
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    cmd = [sys.executable, "-c", ONE_RUN, "ustack_uw0", *args] if cost \
        else [sys.executable, "-m", "ustack", *args]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    if run.returncode:
        raise SystemExit(f"ustack {' '.join(args)} failed:\n{run.stderr}")
    return run.stdout


def chain_share(folded: str) -> tuple:
    """(samples carrying calls.rb's chain, samples)."""
    whole = total = 0
    for line in folded.splitlines():
        stack, _, n = line.rpartition(" ")
        if not n.isdigit():
            continue
        total += int(n)
        names = [f.split(" (calls.rb:")[0] for f in stack.split(";") if " (calls.rb:" in f]
        whole += int(n) if names == CHAIN else 0
    return whole, total


def by_pid(ruby: str, seconds: float) -> tuple:
    proc = subprocess.Popen([ruby, str(CALLS), "600"], stdout=subprocess.PIPE, text=True)
    try:
        proc.stdout.readline()
        return chain_share(ustack("profile", "-F", "199", "-d", str(seconds), "-f", "folded",
                                  "-p", str(proc.pid)))
    finally:
        proc.kill()
        proc.wait()


def whole_machine(ruby: str, seconds: float) -> tuple:
    """calls.rb's samples in a whole-machine profile (other processes' ignored)."""
    proc = subprocess.Popen([ruby, str(CALLS), "600"], stdout=subprocess.PIPE, text=True)
    try:
        proc.stdout.readline()
        out = ustack("profile", "-F", "199", "-d", str(seconds), "-f", "folded")
    finally:
        proc.kill()
        proc.wait()
    mine = "\n".join(l for l in out.splitlines() if l.startswith("ruby;"))
    return chain_share(mine)


def started_during(ruby: str, seconds: float) -> tuple:
    """calls.rb started once a whole-machine run samples: (samples carrying
    the chain to _start, samples in calls.rb)."""
    from started_during import stacks_of_program_started_during
    whole = in_script = 0
    for s in stacks_of_program_started_during([ruby, CALLS, seconds]):
        chain = [f["function"] for f in reversed(s["frames"])
                 if f.get("kind") == "ruby" and f.get("file") == str(CALLS)]
        in_script += s["count"] if chain else 0
        whole += s["count"] if chain == CHAIN and s["frames"][-1]["function"] == "_start" else 0
    return whole, in_script


def cost(args: list) -> tuple:
    # the last line: the command's own output comes first
    runs, ns = ustack("profile", "-F", "199", *args, cost=True).strip().splitlines()[-1].split()
    return int(runs), float(ns)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--cost-only", action="store_true", help="no share runs")
    ap.add_argument("--shares-only", action="store_true", help="no cost runs")
    a = ap.parse_args()
    ruby = shutil.which("ruby")
    if ruby is None:
        raise SystemExit("ruby is not installed")
    tmp = tempfile.mkdtemp(prefix="ustack-bench-")
    busy = os.path.join(tmp, "busy")
    subprocess.run(["cc", "-O1", "-fno-omit-frame-pointer", "-I", str(BUSY_C.parent), "-o", busy,
                    str(BUSY_C)], check=True)
    s = str(a.seconds)
    cases = {
        "ruby calls.rb, Ruby frames": ["-c", f"{ruby} {CALLS} {s}"],
        "ruby calls.rb, --no-ruby": ["--no-ruby", "-c", f"{ruby} {CALLS} {s}"],
        "python frames.py busy, Python frames": ["-c", f"{sys.executable} {FRAMES} busy {s}"],
        "python frames.py busy, --no-python": ["--no-python", "-c",
                                               f"{sys.executable} {FRAMES} busy {s}"],
        "busy (C), Ruby frames on": ["-c", f"{busy} {s}"],
        "busy (C), --no-ruby": ["--no-ruby", "-c", f"{busy} {s}"],
    }
    got: dict = {k: [] for k in cases}
    shares = {"-c": [], "-p": [], "whole machine": [],
              "whole machine, started during the run (samples in calls.rb)": []}
    for _ in range(a.reps):
        for name, args in cases.items():
            if not a.shares_only:
                got[name].append(cost(args))
        if a.cost_only:
            continue
        shares["-c"].append(chain_share(ustack("profile", "-F", "199", "-f", "folded",
                                               "-c", f"{ruby} {CALLS} {s}")))
        shares["-p"].append(by_pid(ruby, a.seconds))
        shares["whole machine"].append(whole_machine(ruby, a.seconds))
        shares["whole machine, started during the run (samples in calls.rb)"].append(
            started_during(ruby, a.seconds))
    if not a.cost_only:
        print("| how | samples carrying the chain (each run) |")
        print("|---|---|")
        for how, runs in shares.items():
            cells = ", ".join(f"{w}/{t} ({100 * w / max(t, 1):.1f} %)" for w, t in runs)
            print(f"| {how} | {cells} |")
        print()
    if a.shares_only:
        return
    print("| run | samples (median) | ns per sample, median (min-max) |")
    print("|---|---|---|")
    for name, runs in got.items():
        ns = [r[1] for r in runs]
        print(f"| {name} | {statistics.median(r[0] for r in runs):.0f} | "
              f"{statistics.median(ns):.0f} ({min(ns):.0f}-{max(ns):.0f}) |")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
