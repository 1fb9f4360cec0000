#!/usr/bin/env python3
"""Cost of a user stack per uprobe hit: ustack vs perf vs bpftrace, one run.

    sudo python3 bench/uprobe_rate.py [--quick]

Builds tests/programs/chain.c (-O2 -fno-omit-frame-pointer), puts a uprobe on
`d` and runs `chain N` (d is hit N times) under each tool. Every tool is
measured REPS times, round-robin so that machine noise spreads evenly, and
the medians are reported:

  wall        seconds for the whole command, tool start-up and exit included
  µs/event    (wall - uninstrumented wall) / N
  events      stacks the tool says it captured; lost: what it says it lost
  ÷ perf      µs/event relative to `perf record -g`

Prints a Markdown table and writes it to bench/results/. A tool that fails or
times out is reported as 'failed' and not run again.
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
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from helpers import O2_FP, build, ustack_env  # noqa: E402  (one build recipe for tests and bench)

PERF_EVENT = "uprate:d"   # group:name for `perf probe`; no "ustack" in it, so
                          # ustack's own leftover cleanup never touches it


class Failed(Exception):
    pass


def run_rounds(tools: dict, results: dict, reps: int, measure, tag: str = "") -> None:
    """REPS rounds, each tool once a round (tools alternate, so a slow
    moment of the machine hits them alike). measure(name, tool) runs one
    and keeps what it measured; a tool that times out or fails has its
    results[name] replaced by why (a string), as absent tools already
    have, and is skipped from then on."""
    for rep in range(reps):
        for name, tool in tools.items():
            if isinstance(results[name], str):
                continue                     # failed or absent
            print(f"[{tag}{rep + 1}/{reps}] {name} …", file=sys.stderr, flush=True)
            try:
                measure(name, tool)
            except subprocess.TimeoutExpired as e:
                results[name] = f"failed (timeout {e.timeout:.0f} s)"
            except Failed as e:
                results[name] = f"failed ({e})"


@dataclass
class Run:
    wall: float
    events: int | None = None   # None: the tool does not say
    lost: int | None = None


def timed(cmd: list[str], timeout: float, stdout=subprocess.PIPE, env=None):
    """Run cmd, return (wall seconds, stdout, stderr). The command gets its own
    process group so that on timeout or Ctrl-C it is killed with everything it
    started (the traced program too)."""
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=stdout, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    wall = time.monotonic() - start
    if proc.returncode != 0:
        last = (err.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
        raise Failed(f"exit {proc.returncode}: {last[:120]}")
    return wall, out or "", err


def lost_count(text: str) -> int:
    """Sum of 'Lost N events'-style lines (ustack, bpftrace)."""
    return sum(int(n) for n in re.findall(r"\blost\s+(\d+)", text, re.I))


# --- the tools ----------------------------------------------------------------
# Each takes (prog, n, tmpdir, timeout) and returns a Run or raises Failed.

def baseline(prog, n, tmp, timeout):
    return Run(timed([prog, str(n)], timeout)[0])


def ustack_count(prog, n, tmp, timeout):
    # the perf path: bench/bpf_count.py measures in-kernel counting
    wall, out, err = timed([sys.executable, "-m", "ustack", "count", "--backend", "perf",
                            f"uprobe:{prog}:d", "-c", f"{prog} {n}"],
                           timeout, env=ustack_env())
    # A count stands alone on its line ("   1000000") or closes a bpftrace-style
    # key ("]: 1000000"); the CLI is young, so accept both.
    counts = re.findall(r"^\s*(?:\]:\s*)?(\d+)\s*$", out, re.M)
    return Run(wall, sum(map(int, counts)) if counts else None, lost_count(out + err))


def ustack_trace(prog, n, tmp, timeout):
    wall, _, err = timed([sys.executable, "-m", "ustack", "trace", f"uprobe:{prog}:d",
                          "-c", f"{prog} {n}"], timeout, stdout=subprocess.DEVNULL,
                         env=ustack_env())
    return Run(wall, None, lost_count(err))


def perf_record(prog, n, tmp, timeout):
    data = tmp / "perf.data"
    wall, _, _ = timed(["perf", "record", "-q", "-e", PERF_EVENT, "-g", "-o", str(data),
                        "--", prog, str(n)], timeout)
    _, stats, _ = timed(["perf", "report", "--stats", "-i", str(data)], timeout)
    data.unlink()  # ~130 bytes per sample
    # The per-event section ("uprate:d stats:") has SAMPLE and LOST_SAMPLES as
    # sample counts; the aggregated section above it counts LOST *records*.
    section = stats.split(f"{PERF_EVENT} stats:")[-1]
    samples = re.search(r"SAMPLE events:\s+(\d+)", section)
    lost = re.search(r"LOST_SAMPLES events:\s+(\d+)", section)
    return Run(wall, int(samples.group(1)) if samples else None,
               int(lost.group(1)) if lost else 0)


def bpftrace(prog, n, tmp, timeout):
    # bpftrace prints "ERROR: ... RLIMIT_MEMLOCK" here yet works: judge by exit status.
    wall, out, err = timed(["bpftrace", "-e", f"uprobe:{prog}:d {{ @[ustack] = count(); }}",
                            "-c", f"{prog} {n}"], timeout)
    counts = re.findall(r"\]:\s*(\d+)", out)
    return Run(wall, sum(map(int, counts)) if counts else None, lost_count(out + err))


def perf_probe(prog, add: bool):
    """Create (or delete) the tracefs uprobe that `perf record -e` needs."""
    subprocess.run(["perf", "probe", "-q", "-d", PERF_EVENT], capture_output=True)  # stale copy
    if add:
        subprocess.run(["perf", "probe", "-q", "-x", str(prog), "-a", f"{PERF_EVENT}=d"],
                       check=True, capture_output=True)


# --- report -------------------------------------------------------------------

def fmt(value, spec="{:,}"):
    return "-" if value is None else spec.format(value)


def table(results: dict, n: int) -> str:
    base = statistics.median(r.wall for r in results["uninstrumented"])

    def overhead(runs):
        return (statistics.median(r.wall for r in runs) - base) / n * 1e6

    perf = results.get("perf record -g")
    perf_us = overhead(perf) if isinstance(perf, list) and perf else None
    rows = ["| tool | wall s | µs/event | events | lost | ÷ perf |",
            "|---|---:|---:|---:|---:|---:|"]
    for name, runs in results.items():
        if isinstance(runs, str):  # failure message or "absent"
            rows.append(f"| {name} | {runs.replace('|', '/')} | | | | |")
            continue
        wall = statistics.median(r.wall for r in runs)
        events = [r.events for r in runs if r.events is not None]
        lost = [r.lost for r in runs if r.lost is not None]
        if name == "uninstrumented":
            rows.append(f"| {name} | {wall:.3f} | | | | |")
            continue
        us = overhead(runs)
        rows.append(f"| {name} | {wall:.3f} | {us:.2f} "
                    f"| {fmt(int(statistics.median(events)) if events else None)} "
                    f"| {fmt(int(statistics.median(lost)) if lost else None)} "
                    f"| {fmt(us / perf_us if perf_us else None, '{:.2f}')} |")
    return "\n".join(rows)


def run_options(doc: str, name: str):
    """The command line every uprobe-rate benchmark takes: (args, N,
    repetitions, report path); exits unless root."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="N=100000, 1 repetition")
    ap.add_argument("-n", type=int, help="uprobe hits per run (default 1000000)")
    ap.add_argument("--reps", type=int, help="repetitions per tool (default 3)")
    ap.add_argument("--timeout", type=float, default=120, help="seconds per run")
    ap.add_argument("-o", "--out", type=Path, help="Markdown file to write")
    args = ap.parse_args()
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)     # a user's Python writes .pyc
    n = args.n or (100_000 if args.quick else 1_000_000)
    reps = args.reps or (1 if args.quick else 3)
    out = args.out or REPO / "bench" / "results" / \
        (f"{name}_quick.md" if args.quick else f"{name}.md")
    if os.geteuid() != 0:
        sys.exit(f"{name}: run as root (uprobes, BPF and perf need it)")
    return args, n, reps, out


def main():
    args, n, reps, out = run_options(__doc__, "uprobe_rate")

    prog = str(build("chain", flags=O2_FP))
    tools = {"uninstrumented": baseline,
             "ustack count --backend perf": ustack_count,
             "ustack trace (stdout → /dev/null)": ustack_trace,
             "perf record -g": perf_record,
             "bpftrace @[ustack]=count()": bpftrace}
    results: dict[str, list[Run] | str] = {name: [] for name in tools}
    for name, exe in [("perf record -g", "perf"), ("bpftrace @[ustack]=count()", "bpftrace")]:
        if not shutil.which(exe):
            results[name] = f"absent ({exe} not installed)"

    with tempfile.TemporaryDirectory(prefix="uprobe_rate.") as tmp:
        try:
            if isinstance(results["perf record -g"], list):
                perf_probe(prog, add=True)
            run_rounds(tools, results, reps, lambda name, tool: results[name].append(
                tool(prog, n, Path(tmp), args.timeout)))
        finally:
            if shutil.which("perf"):
                perf_probe(prog, add=False)

    md = (f"## uprobe rate: a user stack per hit of a uprobe on `d`\n\n"
          f"`chain {n}` built -O2 -fno-omit-frame-pointer (first instruction of d: "
          f"`push %rbp`, emulated by the kernel); medians of {reps} run(s); "
          f"{time.strftime('%Y-%m-%d')}, kernel {platform.release()}, "
          f"{os.cpu_count()} CPUs. µs/event includes tool start-up and exit.\n\n"
          + table(results, n) + "\n\n"
          "perf's events can exceed N: perf 6.1 sometimes writes a sample twice "
          "(same timestamp in `perf script`).\n")
    write_report(md, out)


def write_report(md: str, out: Path) -> None:
    """Print a results table and keep it under bench/results/."""
    print(md)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(md)
    print(f"written to {out.relative_to(REPO) if out.is_relative_to(REPO) else out}",
          file=sys.stderr)


if __name__ == "__main__":
    main()
