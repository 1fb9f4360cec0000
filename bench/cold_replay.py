#!/usr/bin/env python3
"""The main process's work of a cold whole-machine run, measured on one
recording so that every run does the same work: one `record --raw-stacks
-d 2` of the whole machine while clang++, node and chromium run (its
stacks are kept as copies), then `report` of it with ustack's cache
emptied and the page cache dropped, this tree and another (--before DIR)
alternating. Each report unwinds the copies in user space and names the
stacks, as a live run's main process does for its deferred stacks; it
names its objects as a whole-machine run does (apart, where the tree
does so: objfile/function_builder.build_named_apart). Prints, per
report, the report process's CPU (its own, wait4) and its builders'
(reaped here), and whether the folded outputs are identical.

    sudo python3 bench/cold_replay.py --before DIR/src [--reps 3]
"""
from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
from cold_start import HZ, Targets, children, cold, cpu_seconds, reap, reap_leftovers, subreaper  # noqa: E402

# a report named as a whole-machine run names (the switch, where the tree has it)
AS_WHOLE_MACHINE = """import os, sys
from ustack.objfile import function_builder
getattr(function_builder, "build_named_apart", lambda: None)()
import ustack.cli
sys.argv = ["ustack", *sys.argv[1:]]
status = ustack.cli.main()
sys.stdout.flush(); sys.stderr.flush()
os._exit(status or 0)
"""


def record(src: str, caches: Path, work: Path) -> Path:
    rec = work / "machine.data"
    targets = Targets(work)
    try:
        for name in ("clang", "node", "chromium"):
            getattr(targets, name)()
        env = dict(os.environ, PYTHONPATH=src, USTACK_CACHE_DIR=str(cold(caches)))
        subprocess.run([sys.executable, "-m", "ustack", "record", "--raw-stacks", "-F", HZ,
                        "-d", "2", "-o", str(rec)], env=env, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        reap_leftovers(targets)
    finally:
        targets.close()
    return rec


def report(src: str, rec: Path, caches: Path, out: Path) -> tuple:
    """(main process CPU s, builders' CPU s, seconds, sha256 of the sorted
    folded lines) of one cold report."""
    env = dict(os.environ, PYTHONPATH=src, USTACK_CACHE_DIR=str(cold(caches)))
    before = cpu_seconds()
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-c", AS_WHOLE_MACHINE, "report", str(rec),
                             "-f", "folded", "-o", str(out)], env=env,
                            stderr=subprocess.DEVNULL)
    _pid, status, usage = os.wait4(proc.pid, 0)
    took = time.monotonic() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"report failed ({status})")
    for pid in children():          # its builders, finishing for the cache
        reap(pid)
    own = usage.ru_utime + usage.ru_stime
    folded = "\n".join(sorted(out.read_text().splitlines())).encode()
    return own, cpu_seconds() - before - own, took, hashlib.sha256(folded).hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", required=True, help="another tree's src/")
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    subreaper()
    work = Path(tempfile.mkdtemp(prefix="cold_replay"))
    caches = work / "caches"
    caches.mkdir()
    trees = [("this tree", str(REPO / "src")), ("before", a.before)]
    runs: dict = {tree: [] for tree, _ in trees}
    try:
        rec = record(a.before, caches, work)
        for rep in range(a.reps):
            for tree, src in (trees if rep % 2 == 0 else trees[::-1]):
                load = os.getloadavg()[0]
                own, builders, took, digest = report(src, rec, caches, work / "out.folded")
                runs[tree].append((own, builders, took, digest))
                print(f"{tree}: main process {own:.2f} s CPU, builders {builders:.2f} s, "
                      f"{took:.2f} s, load {load:.1f}, output {digest[:12]}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    mine, theirs = runs["this tree"], runs["before"]
    ratios = [m[0] / t[0] for m, t in zip(mine, theirs)]
    print(f"main process CPU, this tree / before, pair by pair: "
          f"{', '.join(f'{r:.2f}' for r in ratios)} (median {statistics.median(ratios):.2f})")
    print("outputs identical" if len({r[3] for r in mine + theirs}) == 1
          else "OUTPUTS DIFFER")


if __name__ == "__main__":
    main()
