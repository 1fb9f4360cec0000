#!/usr/bin/env python3
"""Where a cold run's time goes, stage by stage: `profile -p -d 2` of
clang++, node and a chromium renderer, and `profile -d 2` of the whole
machine (with the three running), each with ustack's cache emptied and
the page cache dropped, under bench/stage_clock.py: seconds from the
launch to each stage's first entry and last exit, and its total time.

    sudo python3 bench/cold_stages.py [--runs clang node chromium machine]
        [--warm] [--src DIR/src]

Prints one Markdown table per run."""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
from cold_start import HZ, Targets, cold, cpu_seconds, reap_leftovers, subreaper  # noqa: E402


def staged_run(src: str, cache: Path, args: list, work: Path) -> dict:
    out = work / "stages.json"
    env = dict(os.environ, PYTHONPATH=src, USTACK_CACHE_DIR=str(cache))
    launch = time.monotonic_ns()
    run = subprocess.Popen([sys.executable, str(REPO / "bench" / "stage_clock.py"), str(launch),
                            str(out), "profile", "-F", HZ, "-d", "2",
                            "-o", str(work / "out.folded"), *args],
                           env=env, stderr=subprocess.PIPE, text=True)
    # STAGE_SPY=FILE: py-spy samples the run's process (the threads holding
    # its GIL, folded) to FILE; --nonblocking, since stopping the process
    # to sample it interrupts the kernel's verifier (bpf(2): EAGAIN)
    spy = os.environ.get("STAGE_SPY") and subprocess.Popen(
        ["py-spy", "record", "--gil", "--nonblocking", "-r", "250", "-f", "raw",
         "-o", os.environ["STAGE_SPY"], "--pid", str(run.pid)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _out, err = run.communicate()
    done = subprocess.CompletedProcess(run.args, run.returncode, stderr=err)
    if spy:
        spy.wait()
    if done.returncode != 0:
        raise SystemExit(f"ustack failed: {done.stderr}")
    stages = json.loads(out.read_text())
    stages["_header"] = done.stderr.splitlines()[0] if done.stderr else ""
    return stages


def table(name: str, stages: dict) -> str:
    header = stages.pop("_header")
    cpu_line = stages.pop("_cpu", "")
    calls = stages.pop("_calls", [])
    rows = sorted(stages.items(), key=lambda kv: kv[1]["first"])
    lines = [f"### {name}", "", f"`{header[:160]}`", "",
             "| stage | from (s) | to (s) | calls | total (s) | CPU at its start (s) |",
             "| --- | --- | --- | --- | --- | --- |"]
    for label, r in rows:
        cpu = f"{r['cpu']:.2f}" if r.get("cpu") is not None else ""
        lines.append(f"| {label} | {r['first']:.3f} | "
                     f"{r['last_end']:.3f} | {r['calls']} | {r['total']:.3f} | {cpu} |"
                     if "calls" in r else f"| {label} | {r['first']:.3f} | | | | {cpu} |")
    lines += ["", cpu_line]
    if calls:
        lines += ["", "| call | from (s) | to (s) | of |", "| --- | --- | --- | --- |"]
        lines += [f"| {label} | {t0:.3f} | {t1:.3f} | {what} |" for label, t0, t1, what in calls]
    return "\n".join(lines) + "\n"


def startup_table(runs: dict) -> str:
    """Per run and tree: seconds and CPU seconds from the launch to the
    attach (the probes live), median (min-max)."""
    import statistics
    lines = ["| run | tree | to the attach (s) | CPU to the attach (s) |",
             "| --- | --- | --- | --- |"]
    for (name, tree), stamps in runs.items():
        at = [s["attach"]["first"] for s in stamps]
        cpu = [s["attach"]["cpu"] for s in stamps]
        lines.append(f"| {name} | {tree} | {statistics.median(at):.2f} "
                     f"({min(at):.2f}-{max(at):.2f}) | {statistics.median(cpu):.2f} "
                     f"({min(cpu):.2f}-{max(cpu):.2f}) |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", nargs="*", default=["clang", "node", "chromium", "machine"])
    ap.add_argument("--warm", action="store_true", help="keep one cache, page cache as is")
    ap.add_argument("--src", default=str(REPO / "src"))
    ap.add_argument("--before", help="another tree's src/: start-up only, alternating")
    ap.add_argument("--reps", type=int, default=1)
    a = ap.parse_args()
    subreaper()                 # the builders a run leaves are reparented here, waited for
    if a.before:
        return compare(a)
    work = Path(tempfile.mkdtemp(prefix="cold_stages"))
    caches = work / "caches"
    caches.mkdir()
    warm = caches / "warm"
    try:
        for name in a.runs:
            targets = Targets(work)
            try:
                if name == "machine":
                    for n in ("clang", "node", "chromium"):
                        getattr(targets, n)()
                    args = []
                else:
                    args = ["-p", str(getattr(targets, name)())]
                cache = warm if a.warm else cold(caches)
                cpu = cpu_seconds()
                stages = staged_run(a.src, cache, args, work)
                reap_leftovers(targets)     # its builders end before their cache is removed
                main_cpu = stages["end"]["cpu"]
                stages["_cpu"] = (f"CPU: {cpu_seconds() - cpu:.2f} s, the main process "
                                  f"{main_cpu:.2f} s, its builder children the rest")
            finally:
                targets.close()
            print(table(name, stages), flush=True)
            print(f"load average {os.getloadavg()[0]:.1f}\n", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def compare(a) -> None:
    """--before: each run cold, the trees alternating, --reps times; the
    start-up table only."""
    work = Path(tempfile.mkdtemp(prefix="cold_stages"))
    caches = work / "caches"
    caches.mkdir()
    trees = [("this tree", a.src), ("before", a.before)]
    runs: dict = {}
    loads = []
    try:
        for rep in range(a.reps):
            for name in a.runs:
                for tree, src in (trees if rep % 2 == 0 else trees[::-1]):
                    targets = Targets(work)
                    try:
                        args = ["-p", str(getattr(targets, name)())]
                        loads.append(os.getloadavg()[0])
                        stamps = staged_run(src, cold(caches), args, work)
                        reap_leftovers(targets)
                    finally:
                        targets.close()
                    runs.setdefault((name, tree), []).append(stamps)
                    print(name, tree, f"{stamps['attach']['first']:.2f} "
                          f"cpu {stamps['attach']['cpu']:.2f}", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"load average at the runs: {min(loads):.1f}-{max(loads):.1f}\n")
    print(startup_table(dict(sorted(runs.items()))))


if __name__ == "__main__":
    main()
