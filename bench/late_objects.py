#!/usr/bin/env python3
"""Objects that appear after a run starts, N runs each (default 20), this
tree against another (USTACK_BEFORE=DIR: its src/, e.g. `git archive
main src`):
1. memleak -p of a program that dlopens a library and allocates through
   it at once (tests/programs/dlopen_deep.c, 3 frames deep, 5 blocks):
   runs whose every block is under its whole stack;
2. count --stack-size 65528 of calls through a library dlopen'd during
   the run under ~30 KiB of stack (100 frames): events whole;
3. count --container-pid (whole machine) of 20,000 uprobe hits in a
   container running since before the run (its own libc): events cut;
4. trace --backend tracefs -p of a library dlopen'd after the attach by
   a process that exits at once: events with a bare frame and no note.

    sudo python3 bench/late_objects.py [--runs N]

Prints Markdown and writes bench/results/late_objects.md."""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
import helpers  # noqa: E402
from helpers import (O2_NOFP, build, finish, parse_counts, parse_trace,  # noqa: E402
                     release, spawn, stop, wait_tracing)
from test_memleak import parse_reports  # noqa: E402


def ustack(src: Path, *args, stdout=subprocess.PIPE) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(src))
    return subprocess.Popen([sys.executable, "-m", "ustack", *map(str, args)], env=env,
                            stdout=stdout, stderr=subprocess.PIPE, text=True)


def attached(src: Path, target, *args) -> tuple:
    us = ustack(src, *args, "-p", target.pid)
    try:
        wait_tracing(us, timeout=60)
        release(target)
        return finish(us, timeout=120)
    finally:
        stop(us)
        stop(target)


def memleak_whole(src: Path) -> bool:
    prog = build("dlopen_deep", flags=O2_NOFP)
    plugin = build("plugin_back", kind="shared", flags=O2_NOFP)
    out, _err = attached(src, spawn(prog, plugin, 3, 5, "-", stdin=subprocess.PIPE), "memleak")
    try:
        (report,) = parse_reports(out)
    except (AssertionError, ValueError):
        return False
    mine = [(f, b, n) for f, b, n in report if "back" in f]
    return len(mine) == 1 and mine[0][0][-1] == "_start" and mine[0][2] == 5


def deep_counts(src: Path) -> tuple:
    """(events whole, events) of 3 calls under 100 frames."""
    prog = build("dlopen_deep", flags=O2_NOFP)
    plugin = build("plugin_back", kind="shared", flags=O2_NOFP)
    out, _err = attached(src, spawn(prog, plugin, 100, 3, "-", stdin=subprocess.PIPE),
                         "count", "--backend", "bpf", "--stack-size", "65528",
                         f"uprobe:{prog}:back")
    stacks = parse_counts(out)
    whole = sum(s["count"] for s in stacks if s["frames"] and s["frames"][-1][0] == "_start")
    return whole, sum(s["count"] for s in stacks)


def tracefs_bare(src: Path) -> tuple:
    """(events with a bare unnamed frame and no note, events)."""
    prog = build("dlopen_main", flags=O2_NOFP)
    plugin = build("plugin", kind="shared", flags=O2_NOFP)
    out, _err = attached(src, spawn(prog, "-", plugin, 3, stdin=subprocess.PIPE),
                         "trace", "--backend", "tracefs", f"uprobe:{plugin}:plugin_leaf")
    events = parse_trace(out)
    bare = sum(1 for e in events if not e["notes"] and e["frames"][0]["module"] != "plugin.so")
    return bare, len(events)


def container_cut(src: Path, runtime, calls: int = 20000) -> tuple:
    from container import APP_PATH
    ct = runtime.start(calls)
    try:
        us = ustack(src, "count", "-P", f"uprobe:{APP_PATH}:app_work", "--container-pid",
                    ct.host_pid)
        try:
            wait_tracing(us, timeout=60)
            ct.go()
            us.send_signal(signal.SIGINT)
            out, _err = finish(us, timeout=120)
        finally:
            stop(us)
    finally:
        ct.finish()
    mine = [s for s in parse_counts(out) if s["pid"] == ct.host_pid]
    cut = sum(s["count"] for s in mine if any("cut" in f[0] for f in s["frames"]))
    return cut, sum(s["count"] for s in mine)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20)
    opts = ap.parse_args()
    trees = {"this tree": REPO / "src"}
    if os.environ.get("USTACK_BEFORE"):
        trees["before"] = Path(os.environ["USTACK_BEFORE"]) / "src"
    from container import Rootfs, Runtime
    results: dict = {name: {"memleak": 0, "deep": [0, 0], "tracefs": [0, 0], "ct": [0, 0]}
                     for name in trees}
    with tempfile.TemporaryDirectory() as tmp:
        runtime = Runtime(Rootfs(Path(tmp)))
        try:
            for i in range(opts.runs):          # the trees alternate
                for name, src in trees.items():
                    helpers.USTACK_PIDS.clear()
                    r = results[name]
                    r["memleak"] += memleak_whole(src)
                    for key, (a, b) in (("deep", deep_counts(src)),
                                        ("tracefs", tracefs_bare(src))):
                        r[key][0] += a
                        r[key][1] += b
                    if i < 3:                   # 20,000 hits a run: three runs
                        a, b = container_cut(src, runtime)
                        r["ct"][0] += a
                        r["ct"][1] += b
                print(i + 1, results, file=sys.stderr)
        finally:
            runtime.close()
    lines = [f"# Objects that appear after the start, {opts.runs} runs", "",
             f"{time.strftime('%Y-%m-%d')}, kernel {os.uname().release}, 2 CPUs shared "
             "(loaded); `python3 bench/late_objects.py`, the trees alternating.", "",
             "| | " + " | ".join(trees) + " |", "| --- |" + " --- |" * len(trees)]
    rows = (("memleak -p: dlopen, then 5 blocks through it: runs all whole",
             lambda r: f"{r['memleak']} of {opts.runs}"),
            ("count --stack-size 65528, dlopen'd library under 100 frames: events whole",
             lambda r: f"{r['deep'][0]} of {r['deep'][1]}"),
            ("count --container-pid, 20,000 hits x 3 runs: events cut",
             lambda r: f"{r['ct'][0]} of {r['ct'][1]}"),
            ("tracefs -p, dlopen'd library, process gone: bare frames without a note",
             lambda r: f"{r['tracefs'][0]} of {r['tracefs'][1]}"))
    for label, cell in rows:
        lines.append(f"| {label} | " + " | ".join(cell(results[n]) for n in trees) + " |")
    text = "\n".join(lines) + "\n"
    print(text)
    (REPO / "bench" / "results" / "late_objects.md").write_text(text)


if __name__ == "__main__":
    main()
