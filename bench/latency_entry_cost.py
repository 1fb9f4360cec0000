#!/usr/bin/env python3
"""The per-call cost of latency's entry program for a process that runs no
JVM, and for a JVM's calls through its JIT code (where java is installed),
this tree against another (--before DIR, a tree whose src/ holds the
ustack to compare), alternating A/B.

    sudo python3 bench/latency_entry_cost.py --before DIR [-n N] [--reps R]

`ustack latency --by-stack uprobe:chain:d -c "chain N"` (tests/programs/
chain.c, -O2 without frame pointers: the entry's stack unwound in the
kernel) with kernel.bpf_stats_enabled on; the entry program's run time
and runs are read from ustack's fdinfo while it runs (the entry program is
the one the verifier processed the most instructions of: it walks the
stack, the return program only times). The JVM's: `latency --by-stack
uprobe:libjvm.so:JVM_Sleep -c "java Naps 100"` (tests/programs/java: 400
calls under Java methods). Reports the median ns per entry of
each tree and their ratio; the load average beside them (2 shared CPUs:
the numbers are noisy, the ratio is what to read).

Writes bench/results/latency_entry_cost.md.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from offcpu import BPF_STATS  # noqa: E402
from uprobe_rate import write_report  # noqa: E402
from helpers import O2_NOFP, build  # noqa: E402  (path set by uprobe_rate)

REPO = Path(__file__).resolve().parent.parent


def _fdinfo_programs(pid: int) -> dict:
    """fd -> (verified instructions, run_time_ns, run_cnt) of pid's BPF programs."""
    out = {}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") != "anon_inode:bpf-prog":
                continue
            info = Path(f"/proc/{pid}/fdinfo/{fd}").read_text()
        except OSError:
            continue
        fields = dict(re.findall(r"^(\w+):\s+(\d+)$", info, re.M))
        if "run_cnt" in fields:
            out[fd] = (int(fields.get("verified_insns", 0)), int(fields["run_time_ns"]),
                       int(fields["run_cnt"]))
    return out


def communicate_watching_programs(proc) -> tuple:
    """((stdout, stderr), {fd: (verified instructions, run_time_ns,
    run_cnt)}) of the running ustack `proc`: its BPF programs' counters
    read every 10 ms until it ends (its last reading of each program)."""
    seen: dict = {}
    done = threading.Event()

    def poll():
        while not done.is_set():
            try:
                seen.update(_fdinfo_programs(proc.pid))
            except OSError:
                pass
            done.wait(0.01)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    try:
        return proc.communicate(timeout=300), seen
    finally:
        done.set()
        poller.join()


def entry_ns(src: Path, event: str, command: str) -> tuple:
    """(ns per run of the entry program, its runs) of one `latency
    --by-stack EVENT -c COMMAND` with the ustack of `src`."""
    env = dict(os.environ, PYTHONPATH=str(src))
    proc = subprocess.Popen([sys.executable, "-m", "ustack", "latency", "--by-stack",
                             event, "-c", command],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    (_out, err), seen = communicate_watching_programs(proc)
    if proc.returncode:
        raise SystemExit(f"ustack failed: {err.strip().splitlines()[-1:]}")
    _insns, ns, runs = max(seen.values())
    return ns / runs if runs else float("nan"), runs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", required=True, help="a tree whose src/ is the other ustack")
    ap.add_argument("-n", type=int, default=200_000)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    chain = build("chain", flags=O2_NOFP)
    cases = {"no JVM": (f"uprobe:{chain}:d", f"{chain} {args.n}")}
    java = shutil.which("java")
    if java:
        import tempfile
        from helpers import compiled_java_chain
        classes = compiled_java_chain(Path(tempfile.mkdtemp(prefix="ustack-naps-")), "Naps")
        libjvm = Path(java).resolve().parents[1] / "lib" / "server" / "libjvm.so"
        cases["JVM, through its JIT code"] = (
            f"uprobe:{libjvm}:JVM_Sleep",
            f"{java} -XX:CompileCommand=quiet -XX:CompileCommand=dontinline,Naps::* "
            f"-cp {classes} Naps 100")
    trees = {"this tree": REPO / "src", "before": Path(args.before).resolve() / "src"}
    ns: dict = {(c, t): [] for c in cases for t in trees}
    runs: dict = {(c, t): [] for c in cases for t in trees}
    loads = []
    was = Path(BPF_STATS).read_text()
    Path(BPF_STATS).write_text("1")
    try:
        for _ in range(args.reps):
            for case, (event, command) in cases.items():
                for name, src in trees.items():          # alternating
                    loads.append(os.getloadavg()[0])
                    one, n = entry_ns(src, event, command)
                    ns[(case, name)].append(one)
                    runs[(case, name)].append(n)
    finally:
        Path(BPF_STATS).write_text(was)
    rows = ["| process | tree | entry ns/call (median) | each run | entries counted |",
            "|---|---|---|---|---|"]
    ratios = []
    for case in cases:
        for name in trees:
            rows.append(f"| {case} | {name} | {statistics.median(ns[(case, name)]):.0f} | "
                        + ", ".join(f"{x:.0f}" for x in ns[(case, name)])
                        + f" | {', '.join(map(str, runs[(case, name)]))} |")
        mine, before = (statistics.median(ns[(case, t)]) for t in trees)
        ratios.append(f"{case}: {mine / before:.2f}")
    text = (f"# latency's entry program\n\n"
            f"`ustack latency --by-stack uprobe:chain:d -c 'chain {args.n}'` (-O2, no frame "
            f"pointers){' and JVM_Sleep under java Naps 100' if java else ''}, "
            f"{args.reps} alternated pairs, load average "
            f"{min(loads):.1f}-{max(loads):.1f} on {os.cpu_count()} CPUs, "
            f"{time.strftime('%Y-%m-%d')}.\n\n" + "\n".join(rows)
            + f"\n\nratio this tree / before: {'; '.join(ratios)}\n")
    write_report(text, REPO / "bench" / "results" / "latency_entry_cost.md")


if __name__ == "__main__":
    main()
