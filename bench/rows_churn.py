#!/usr/bin/env python3
"""A run whose objects come and go, with an in-kernel row table too small
for all of them: `ustack profile -p DRIVER --backend bpf -F 199` of a
driver (tests/programs/rows_churn.c) that works in six libraries in turn
(tests/programs/rows_lib.c, ~12,000 unwind rows each, dlopen'd as their
turn comes), PHASE_S seconds each, for ROUNDS rounds. Three runs,
interleaved per round:

- small: this tree, --unwind-memory for the process's start objects and
  two of the libraries (rows evicted and reloaded as the driver moves on);
- big: this tree, the default table (16 MiB: every library fits);
- before: the tree given (--before DIR/src), the same small table.

Per run: the driver's samples, those reaching _start through main with no
cut note, ustack's CPU seconds (user + sys: copies unwound in user space
cost there), the largest memlock of its BPF maps seen while it ran, and
its closing notes (evicted/reloaded, did not fit).

    sudo python3 bench/rows_churn.py [--rounds N] [--phase S] [--before DIR/src]

Prints Markdown."""
from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PROGRAMS = REPO / "tests" / "programs"
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "src"))
from big_objects import map_memory  # noqa: E402

LIBS = "abcdef"
LIBC = "/lib/x86_64-linux-gnu/libc.so.6"
LD_SO = "/lib64/ld-linux-x86-64.so.2"
CUT = re.compile(r"^\[.*(cut|stopped|full|unknown).*\]$|stack cut")
SLACK_ROWS = 1000


def build(work: Path) -> tuple:
    """(driver, {letter: library}) built from tests/programs."""
    libs = {}
    for letter in LIBS:
        out = work / f"rows_lib_{letter}.so"
        subprocess.run(["gcc", "-O0", "-g", "-fno-omit-frame-pointer", f"-DLIB={letter}",
                        "-fPIC", "-shared", "-o", str(out), str(PROGRAMS / "rows_lib.c")],
                       check=True)
        libs[letter] = out
    driver = work / "rows_churn"
    subprocess.run(["gcc", "-O2", "-g", "-fomit-frame-pointer", "-fPIE", "-pie",
                    f"-I{PROGRAMS}", "-o", str(driver), str(PROGRAMS / "rows_churn.c")],
                   check=True)
    return driver, libs


def small_table(driver: Path, libs: dict) -> str:
    """--unwind-memory for what the driver maps at its start and two
    libraries (MiB)."""
    from ustack.objfile.elf import ElfImage
    from ustack.objfile.vdso import vdso_file
    from ustack.unwind import tables

    def rows(p) -> int:
        return len(tables.for_image(ElfImage.open(str(p))))
    start = [driver, LIBC, LD_SO, libs[LIBS[0]], libs[LIBS[1]]] + [
        p for p in [vdso_file()] if p]
    return f"{(sum(map(rows, start)) + SLACK_ROWS) * tables.ROW.size / (1 << 20):.4f}"


def one_run(src: Path, driver: Path, libs: dict, phase: float, rounds: int,
            memory: str | None) -> dict:
    phases = [f"{libs[c]}:work_{c}" for _ in range(rounds) for c in LIBS]
    target = subprocess.Popen([str(driver), str(phase), "-", *phases], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    args = [sys.executable, "-m", "ustack", "profile", "-F", "199", "--backend", "bpf",
            "-f", "folded", "-p", str(target.pid)]
    if memory is not None:
        args += ["--unwind-memory", memory]
    us = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=dict(os.environ, PYTHONPATH=str(src)))
    header = us.stderr.readline()
    if not header.startswith("Tracing "):
        raise SystemExit(f"ustack did not start: {header}{us.stderr.read()}")
    peak = [0]
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.2):
            peak[0] = max(peak[0], map_memory(us.pid))
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    target.stdin.write("go\n")
    target.stdin.close()
    out, err = us.communicate(timeout=phase * len(phases) + 120)
    done.set()
    watcher.join()
    _pid, _status, driver_use = os.wait4(target.pid, 0)     # the driver's own CPU apart
    target.returncode = 0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = ((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
           - driver_use.ru_utime - driver_use.ru_stime)
    total = whole = 0
    for line in out.splitlines():
        stack, _, n = line.rpartition(" ")
        frames = stack.split(";")
        if frames[0] != "rows_churn":
            continue
        total += int(n)
        if frames[1:2] == ["_start"] and "main" in frames and not any(
                CUT.search(f) for f in frames):
            whole += int(n)
    notes = [line for line in (header + err).splitlines()
             if "evicted" in line or "did not fit" in line]
    return {"samples": total, "whole": whole, "cpu": cpu, "maps": peak[0],
            "notes": notes, "calls": target.stdout.read().strip()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2, help="runs of each kind")
    ap.add_argument("--phase", type=float, default=2.0, help="seconds per library")
    ap.add_argument("--cycles", type=int, default=2, help="times through the six")
    ap.add_argument("--before", type=Path, help="another tree's src/")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("rows_churn: run as root")
    with tempfile.TemporaryDirectory(prefix="rows_churn.") as tmp:
        driver, libs = build(Path(tmp))
        memory = small_table(driver, libs)
        kinds = [("small", REPO / "src", memory), ("big", REPO / "src", None)]
        if args.before:
            kinds.append(("before", args.before.resolve(), memory))
        rows = []
        for rnd in range(1, args.rounds + 1):
            for name, src, mem in kinds:
                r = one_run(src, driver, libs, args.phase, args.cycles, mem)
                rows.append((rnd, name, mem, r))
                print(f"round {rnd} {name}: {r}", file=sys.stderr, flush=True)
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, kernel {os.uname().release}, "
          f"{os.cpu_count()} CPUs shared (load average at the end "
          f"{os.getloadavg()[0]:.1f}). `profile -p` of the driver, six libraries of "
          f"~12,000 rows in turn, {args.phase:g} s each, {args.cycles} times through; "
          f"small table: --unwind-memory {memory} (the start's objects and two "
          "libraries).\n")
    print("| round | tree | row table | all maps (MiB, peak) | driver samples reaching _start "
          "| ustack CPU s | closing notes |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for rnd, name, mem, r in rows:
        share = 100 * r["whole"] / max(1, r["samples"])
        notes = "; ".join(re.sub(r"\s+", " ", n) for n in r["notes"]) or "-"
        print(f"| {rnd} | {name} | {mem + ' MiB' if mem else '16 MiB (default)'} "
              f"| {r['maps'] / (1 << 20):.1f} | {r['whole']} / {r['samples']} ({share:.1f} %) "
              f"| {r['cpu']:.2f} | {notes} |")
    for name in dict.fromkeys(n for _r, n, _m, _x in rows):
        cpus = [r["cpu"] for _rnd, n, _m, r in rows if n == name]
        print(f"\n{name}: ustack CPU s median {statistics.median(cpus):.2f}", end="")
    print()


if __name__ == "__main__":
    main()
