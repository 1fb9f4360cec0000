#!/usr/bin/env python3
"""Off-CPU's first blocks, N runs each (default 20), this tree against
another (USTACK_BEFORE=DIR: its src/, e.g. `git archive main src`), the
trees alternating: `ustack offcpu --state S -f json -p PID` of a fresh
tests/programs/naps.c (5 naps of 20 ms under nap_fn, released once
ustack traces, its own time measured around the naps). Per tree:

  first block whole   runs whose every block (the first nap included,
                      the process's first switch under the run) is
                      whole to _start, no note, and whose time under
                      nap_fn is at least 5 x 20 ms and at most what the
                      program measured
  cut, noted          blocks' stacks the run said were cut (its summary)
  cut, unmarked       stacks of the target ending short of _start with
                      no note (must be 0)
  counted / measured  the time under nap_fn over the program's own

Then `offcpu -d 2` of the whole machine, --machine runs a tree (default
3, alternating): blocks cut because the walk could not finish at the
switch (the memory map locked, no unwind table loaded yet, the table
full), and for any other reason, as the run's summary counts them.

    sudo python3 bench/offcpu_first_block.py [--runs N] [--machine M]

Prints Markdown and writes bench/results/offcpu_first_block.md."""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
import helpers  # noqa: E402
from helpers import O2_NOFP, build, finish, release, stop, wait_tracing  # noqa: E402

NAPS, NAP_MS = 5, 20


def one_run(src: Path, prog: Path) -> dict:
    """The judged facts of one run of `naps` under the tree at `src`."""
    target = subprocess.Popen([str(prog), "-", str(NAPS), str(NAP_MS)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    env = dict(os.environ, PYTHONPATH=str(src))
    us = subprocess.Popen([sys.executable, "-m", "ustack", "offcpu", "--state", "S",
                           "-f", "json", "-p", str(target.pid)], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_tracing(us, timeout=60)
        release(target)
        out, err = finish(us, timeout=120)
        _pid, _n, measured = target.stdout.read().split()
        target.wait(timeout=10)
    finally:
        stop(us)
        stop(target)
    stacks = [s for s in json.loads(out)["stacks"] if s["pid"] == target.pid]
    names = [[f["function"] for f in s["frames"]] for s in stacks]
    napped = sum(s["value"] for s, n in zip(stacks, names) if "nap_fn" in n) / 1e6
    m = re.search(r"(\d+) events' stacks were cut short", err)
    unmarked = sum(1 for s, n in zip(stacks, names) if not s["notes"] and n[-1:] != ["_start"])
    whole = (all(not s["notes"] and n[-1:] == ["_start"] for s, n in zip(stacks, names))
             and 0.99 * NAPS * NAP_MS <= napped <= float(measured) + 1)
    return {"whole": whole, "cut": int(m.group(1)) if m else 0, "unmarked": unmarked,
            "counted": napped, "measured": float(measured)}


# what a walk at the switch meets that user space can finish (deferred records)
DEFERRABLE = ("the process's memory map was locked", "no unwind table loaded yet",
              "the in-kernel unwind table was full")


def machine_cuts(src: Path) -> tuple:
    """(blocks cut for DEFERRABLE reasons, for others) of a 2 s
    whole-machine run."""
    env = dict(os.environ, PYTHONPATH=str(src))
    res = subprocess.run([sys.executable, "-m", "ustack", "offcpu", "-d", "2", "-f", "json",
                          "-o", os.devnull], env=env, capture_output=True, text=True,
                         timeout=300)
    m = re.search(r"stacks were cut short by the in-kernel unwinder \(([^)]*)\)", res.stderr)
    deferrable = other = 0
    for part in (m.group(1).split(", ") if m else ()):
        n, why = part.split(": ", 1)
        if why.startswith(DEFERRABLE):
            deferrable += int(n)
        else:
            other += int(n)
    return deferrable, other


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--machine", type=int, default=3)
    opts = ap.parse_args()
    trees = {"this tree": REPO / "src"}
    if os.environ.get("USTACK_BEFORE"):
        trees["before"] = Path(os.environ["USTACK_BEFORE"]) / "src"
    prog = build("naps", flags=O2_NOFP)
    totals = {name: {"whole": 0, "cut": 0, "unmarked": 0, "counted": 0.0, "measured": 0.0}
              for name in trees}
    for i in range(opts.runs):                  # the trees alternate
        for name, src in trees.items():
            helpers.USTACK_PIDS.clear()
            for key, v in one_run(src, prog).items():
                totals[name][key] += v
        print(i + 1, totals, file=sys.stderr)
    machine = {name: [0, 0] for name in trees}
    for _i in range(opts.machine):
        for name, src in trees.items():
            for j, n in enumerate(machine_cuts(src)):
                machine[name][j] += n
    load = os.getloadavg()[0]
    lines = [f"# Off-CPU first blocks, {opts.runs} runs", "",
             f"{time.strftime('%Y-%m-%d')}, kernel {os.uname().release}, 2 CPUs shared "
             f"(load average {load:.1f} at the end); `python3 bench/offcpu_first_block.py`, "
             f"the trees alternating; `offcpu --state S -p` of a fresh naps "
             f"({NAPS} x {NAP_MS} ms).", "",
             "| | " + " | ".join(trees) + " |", "| --- |" + " ---: |" * len(trees)]
    rows = (("runs whose first block (and every other) is whole",
             lambda t: f"{t['whole']} of {opts.runs}"),
            ("blocks' stacks cut, with a note", lambda t: str(t["cut"])),
            ("stacks cut without a note", lambda t: str(t["unmarked"])),
            ("time under nap_fn / the program's own",
             lambda t: f"{t['counted']:.1f} / {t['measured']:.1f} ms"))
    for label, cell in rows:
        lines.append(f"| {label} | " + " | ".join(cell(totals[n]) for n in trees) + " |")
    lines += ["", f"Whole machine, `offcpu -d 2`, {opts.machine} runs a tree (the machine's "
              "own workload, so the blocks differ run to run):", "",
              "| | " + " | ".join(trees) + " |", "| --- |" + " ---: |" * len(trees),
              "| blocks cut: memory map locked, no table yet, table full | "
              + " | ".join(str(machine[n][0]) for n in trees) + " |",
              "| blocks cut for another reason | "
              + " | ".join(str(machine[n][1]) for n in trees) + " |"]
    text = "\n".join(lines) + "\n"
    print(text)
    (REPO / "bench" / "results" / "offcpu_first_block.md").write_text(text)


if __name__ == "__main__":
    main()
