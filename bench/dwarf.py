#!/usr/bin/env python3
"""DWARF stacks (a stack copy per event): ustack vs perf --call-graph dwarf, one run.

    sudo python3 bench/dwarf.py [--quick]

(a) a uprobe on `d` of tests/programs/chain.c built -O2 -fomit-frame-pointer,
    `chain N` (N = 1,000,000 hits): uninstrumented; `ustack count` and
    `ustack trace > /dev/null` with --unwind dwarf; `perf record --call-graph
    dwarf` on the same uprobe (made with `perf probe`), then `perf script >
    /dev/null` timed on its own.
(b) `busy 10` (built the same way) sampled at 999 Hz: uninstrumented;
    `ustack profile --unwind dwarf`; `perf record -F 999 --call-graph dwarf`,
    then `perf script > /dev/null`.

Both tools copy 8 KiB of stack per event (their defaults). Every run is
repeated REPS times round-robin and each figure is the median. The target
runs under its own GNU time (`/usr/bin/time CMD` is what the tools start), so
its wall and CPU time are known apart from the tool's start-up and
post-processing; the tool itself runs under another GNU time, which gives
its peak RSS, and its CPU time minus the target's is the tool's own CPU.

Prints Markdown and writes it to bench/results/dwarf.md (dwarf_quick.md).
"""
from __future__ import annotations

import argparse
import os
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(BENCH))
from helpers import O2_NOFP, build, ustack_env  # noqa: E402  (one build recipe)
from uprobe_rate import fmt, lost_count, run_rounds, timed, write_report  # noqa: E402

GNU_TIME = "/usr/bin/time"
USTACK = [sys.executable, "-m", "ustack"]
STARTUP = "ustack count, `chain 1` (start-up)"


@dataclass
class Measure:
    """One run of one tool. None: not applicable or not reported."""
    wall: float                          # the whole command, as the bench saw it
    target_wall: float | None = None     # the target alone (its own GNU time)
    target_user: float | None = None
    target_sys: float | None = None
    tool_cpu: float | None = None        # user+sys of the tool minus the target's
    rss_kb: int | None = None            # peak RSS of the tool (GNU time %M)
    captured: int | None = None
    lost: int | None = None
    frames: int | None = None            # frames in the most frequent stack
    data_mb: float | None = None         # perf.data size
    notes: set = field(default_factory=set)


def read_time(path: Path) -> list[float]:
    """The numbers of GNU time's last line (-f '%e %U %S [%M]')."""
    lines = path.read_text().strip().splitlines()
    return [float(x) for x in lines[-1].split()]


def under_time(cmd: list[str], out: Path, with_rss: bool = False) -> list[str]:
    fmt_ = "%e %U %S %M" if with_rss else "%e %U %S"
    return [GNU_TIME, "-o", str(out), "-f", fmt_, *cmd]


def run_tool(tool_cmd, target_argv, tmp: Path, timeout: float, stdout=subprocess.PIPE,
             env=None):
    """Run TOOL … TARGET under GNU time, the target under its own: returns
    (Measure, stdout, stderr). tool_cmd(target) builds the command; with
    target_argv None the tool runs alone (perf script)."""
    inner, outer = tmp / "target.time", tmp / "tool.time"
    for f in (inner, outer):
        f.unlink(missing_ok=True)
    target = under_time(target_argv, inner) if target_argv is not None else None
    wall, out, err = timed(under_time(tool_cmd(target), outer, with_rss=True), timeout,
                           stdout=stdout, env=env)
    _, o_user, o_sys, rss = read_time(outer)
    if target is None:
        return Measure(wall, tool_cpu=o_user + o_sys, rss_kb=int(rss)), out, err
    t_wall, t_user, t_sys = read_time(inner)
    return Measure(wall, t_wall, t_user, t_sys, o_user + o_sys - t_user - t_sys,
                   int(rss)), out, err


def baseline(target_argv, tmp: Path, timeout: float) -> Measure:
    inner = tmp / "target.time"
    wall, _, _ = timed(under_time(target_argv, inner), timeout)
    t_wall, t_user, t_sys = read_time(inner)
    return Measure(wall, t_wall, t_user, t_sys)


def counts_of(out: str) -> tuple[int, int]:
    """`ustack count/profile` text -> (total count, frames of the top stack)."""
    total, best, frames = 0, -1, 0
    for block in out.split("\n\n"):
        lines = [l for l in block.splitlines() if l.strip()]
        if not lines or not re.fullmatch(r"\s+\d+", lines[-1]):
            continue
        n = int(lines[-1])
        total += n
        if n > best:
            best, frames = n, sum(1 for l in lines[:-1] if not l.strip().startswith("("))
    return total, frames


def ustack_run(mode: str, args: list[str], target_argv, tmp, timeout, n=None) -> Measure:
    def cmd(target):
        return [*USTACK, mode, "--unwind", "dwarf", *args, "-c", shlex.join(target)]
    if mode == "trace":                  # stdout to /dev/null: stacks are not counted
        m, _, err = run_tool(cmd, target_argv, tmp, timeout, stdout=subprocess.DEVNULL,
                             env=ustack_env())
        m.lost = lost_count(err)
        m.captured = n - m.lost if n is not None else None
    else:
        m, out, err = run_tool(cmd, target_argv, tmp, timeout, env=ustack_env())
        m.captured, m.frames = counts_of(out)
        m.lost = lost_count(err)
    return m


# --- perf -------------------------------------------------------------------------

def perf_stats(data: Path, event: str | None, timeout: float) -> tuple[int | None, int]:
    """(samples, lost samples) from `perf report --stats`: the event's own
    section (SAMPLE, LOST_SAMPLES count samples; the aggregate LOST counts
    records)."""
    _, stats, _ = timed(["perf", "report", "--stats", "-i", str(data)], timeout)
    sections = re.split(r"^\S.* stats:\s*$", stats, flags=re.M)
    section = sections[-1] if len(sections) > 1 else stats
    if event is not None and f"{event} stats:" in stats:
        section = stats.split(f"{event} stats:")[-1]
    samples = re.search(r"\bSAMPLE events:\s+(\d+)", section)
    lost = re.search(r"LOST_SAMPLES events:\s+(\d+)", section)
    return (int(samples.group(1)) if samples else None,
            int(lost.group(1)) if lost else 0)


def perf_frames(data: Path) -> int | None:
    """Frames of the first sample `perf script` prints (then stop it)."""
    proc = subprocess.Popen(["perf", "script", "-i", str(data)], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    frames, started = 0, False
    try:
        for line in proc.stdout:
            if not line.strip():
                if started:
                    break
            elif line[0].isspace():
                frames += 1
            else:
                started = True
    finally:
        proc.kill()
        proc.wait()
    return frames or None


def perf_run(record_args: list[str], event: str | None, target_argv, tmp: Path,
             timeout: float) -> tuple[Measure, Measure]:
    """perf record (+ report --stats) and perf script > /dev/null, timed apart."""
    data = tmp / "perf.data"
    try:
        rec, _, _ = run_tool(lambda t: ["perf", "record", "-q", *record_args, "-o",
                                        str(data), "--", *t], target_argv, tmp, timeout)
        rec.data_mb = data.stat().st_size / 1e6
        rec.captured, rec.lost = perf_stats(data, event, timeout)
        script, _, _ = run_tool(lambda _: ["perf", "script", "-i", str(data)], None,
                                tmp, timeout, stdout=subprocess.DEVNULL)
        script.captured = rec.captured
        script.frames = rec.frames = perf_frames(data)
    finally:
        data.unlink(missing_ok=True)
    return rec, script


def perf_probe(event: str, prog: Path | None) -> None:
    """Create (prog given) or delete the tracefs uprobe `perf record -e` uses."""
    subprocess.run(["perf", "probe", "-q", "-d", event], capture_output=True)
    if prog is not None:
        subprocess.run(["perf", "probe", "-q", "-x", str(prog), "-a", f"{event}=d"],
                       check=True, capture_output=True)


# --- report ---------------------------------------------------------------------------

def med(runs: list[Measure], attr: str):
    vals = [getattr(r, attr) for r in runs if getattr(r, attr) is not None]
    return statistics.median(vals) if vals else None


def post_rate(runs: list[Measure], startup_cpu: float = 0.0,
              frames: int | None = None) -> tuple[float | None, float | None]:
    """(samples, frames) per second of the tool's CPU after start-up."""
    rates = [r.captured / (r.tool_cpu - startup_cpu) for r in runs
             if r.captured and r.tool_cpu and r.tool_cpu - startup_cpu > 0]
    frames = med(runs, "frames") or frames
    if not rates:
        return None, None
    rate = statistics.median(rates)
    return rate, rate * frames if frames else None


def startup_cpu(results: dict) -> float:
    runs = results.get(STARTUP)
    return (med(runs, "tool_cpu") or 0.0) if isinstance(runs, list) else 0.0


def table_a(results: dict, n: int) -> str:
    base = med(results["uninstrumented"], "target_wall") or 0.0
    start = startup_cpu(results)
    count = results.get("ustack count")
    count_frames = med(count, "frames") if isinstance(count, list) else None
    rows = ["| run | target s | µs/hit | wall s | captured | lost | CPU s (tool) "
            "| samples/s | frames/s | peak RSS MB | perf.data MB |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, runs in results.items():
        if isinstance(runs, str):
            rows.append(f"| {name} | {runs.replace('|', '/')} |" + " |" * 9)
            continue
        tw = med(runs, "target_wall")
        us = ((tw - base) / n * 1e6 if tw is not None and
              name in ("ustack count", "ustack trace > /dev/null", "perf record") else None)
        rate, frate = (post_rate(runs, start, count_frames)
                       if name in ("ustack count", "ustack trace > /dev/null") else (None, None))
        if name == "perf script > /dev/null":   # perf: samples per second of perf script
            w = med(runs, "wall")
            s = med(runs, "captured")
            rate = s / w if s and w else None
            frate = rate * med(runs, "frames") if rate and med(runs, "frames") else None
        rows.append(
            f"| {name} | {fmt(tw, '{:.2f}')} | {fmt(us, '{:.2f}')} "
            f"| {fmt(med(runs, 'wall'), '{:.2f}')} "
            f"| {fmt(_int(med(runs, 'captured')))} | {fmt(_int(med(runs, 'lost')))} "
            f"| {fmt(med(runs, 'tool_cpu'), '{:.2f}')} "
            f"| {fmt(_int(rate))} | {fmt(_int(frate))} "
            f"| {fmt(_mb(med(runs, 'rss_kb')))} | {fmt(_int(med(runs, 'data_mb')))} |")
    return "\n".join(rows)


def table_b(results: dict, start: float) -> str:
    base = med(results["uninstrumented"], "target_user")
    rows = ["| run | target wall s | target user s | target sys s | user CPU lost "
            "| wall s | samples | lost | CPU s (tool) | samples/s | peak RSS MB "
            "| perf.data MB |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, runs in results.items():
        if isinstance(runs, str):
            rows.append(f"| {name} | {runs.replace('|', '/')} |" + " |" * 10)
            continue
        user = med(runs, "target_user")
        lost_cpu = (f"{(base - user) / base * 100:.1f} %"
                    if user is not None and base and name != "uninstrumented" else "-")
        if name == "perf script > /dev/null":
            w, s = med(runs, "wall"), med(runs, "captured")
            rate = s / w if s and w else None
        else:
            rate = post_rate(runs, start)[0] if name == "ustack profile" else None
        rows.append(
            f"| {name} | {fmt(med(runs, 'target_wall'), '{:.2f}')} "
            f"| {fmt(user, '{:.2f}')} | {fmt(med(runs, 'target_sys'), '{:.2f}')} "
            f"| {lost_cpu} | {fmt(med(runs, 'wall'), '{:.2f}')} "
            f"| {fmt(_int(med(runs, 'captured')))} | {fmt(_int(med(runs, 'lost')))} "
            f"| {fmt(med(runs, 'tool_cpu'), '{:.2f}')} | {fmt(_int(rate))} "
            f"| {fmt(_mb(med(runs, 'rss_kb')))} | {fmt(_int(med(runs, 'data_mb')))} |")
    return "\n".join(rows)


def _int(x):
    return None if x is None else int(round(x))


def _mb(kb):
    return None if kb is None else int(round(kb / 1024))


# --- main -------------------------------------------------------------------------------

def run_round_robin(tools: dict, results: dict, reps: int, tag: str) -> None:
    def measure(name, fn):
        out = fn()
        if isinstance(out, tuple):           # perf: record and script
            results[name].append(out[0])
            results["perf script > /dev/null"].append(out[1])
        else:
            results[name].append(out)
    run_rounds(tools, results, reps, measure, tag=f"{tag} ")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="100,000 hits, busy 3 s, 1 repetition")
    ap.add_argument("-n", type=int, help="uprobe hits (default 1,000,000)")
    ap.add_argument("--seconds", type=float, help="busy's run time (default 10)")
    ap.add_argument("--reps", type=int, help="repetitions (default 3)")
    ap.add_argument("--timeout", type=float, default=300, help="seconds per run")
    ap.add_argument("-o", "--out", type=Path, help="Markdown file to write")
    args = ap.parse_args()
    n = args.n or (100_000 if args.quick else 1_000_000)
    secs = args.seconds or (3 if args.quick else 10)
    reps = args.reps or (1 if args.quick else 3)
    out_md = args.out or BENCH / "results" / ("dwarf_quick.md" if args.quick else "dwarf.md")
    if os.geteuid() != 0:
        sys.exit("dwarf: run as root (uprobes and perf need it)")
    if not os.access(GNU_TIME, os.X_OK):
        sys.exit(f"dwarf: {GNU_TIME} (GNU time, Debian package `time`) is needed")
    have_perf = shutil.which("perf") is not None
    event = f"dwbench{os.getpid()}:d"         # no "ustack" in it: ustack never removes it
    started = time.monotonic()

    with tempfile.TemporaryDirectory(prefix="bench-dwarf.") as tmpdir:
        tmp = Path(tmpdir)
        # private copies: the perf probe sits on this inode only
        chain, busy = tmp / "chain", tmp / "busy"
        shutil.copy2(build("chain", flags=O2_NOFP), chain)
        shutil.copy2(build("busy", flags=O2_NOFP), busy)
        # warm ustack's CFI cache the way any second run finds it
        timed([*USTACK, "count", "--unwind", "dwarf", f"uprobe:{chain}:d", "-c",
               f"{chain} 10"], args.timeout, env=ustack_env())

        chain_argv = [str(chain), str(n)]
        a: dict = {k: [] for k in ("uninstrumented", STARTUP, "ustack count",
                                   "ustack trace > /dev/null", "perf record",
                                   "perf script > /dev/null")}
        tools_a = {
            "uninstrumented": lambda: baseline(chain_argv, tmp, args.timeout),
            STARTUP: lambda: ustack_run("count", [f"uprobe:{chain}:d"], [str(chain), "1"],
                                        tmp, args.timeout),
            "ustack count": lambda: ustack_run("count", [f"uprobe:{chain}:d"], chain_argv,
                                               tmp, args.timeout),
            "ustack trace > /dev/null": lambda: ustack_run(
                "trace", [f"uprobe:{chain}:d"], chain_argv, tmp, args.timeout, n),
            "perf record": lambda: perf_run(["-e", event, "--call-graph", "dwarf"], event,
                                            chain_argv, tmp, args.timeout),
        }
        busy_argv = [str(busy), str(secs)]
        b: dict = {k: [] for k in ("uninstrumented", "ustack profile", "perf record",
                                   "perf script > /dev/null")}
        tools_b = {
            "uninstrumented": lambda: baseline(busy_argv, tmp, args.timeout),
            "ustack profile": lambda: ustack_run("profile", ["-F", "999"], busy_argv, tmp,
                                                 args.timeout),
            "perf record": lambda: perf_run(["-F", "999", "--call-graph", "dwarf"], None,
                                            busy_argv, tmp, args.timeout),
        }
        if not have_perf:
            for res in (a, b):
                res["perf record"] = res["perf script > /dev/null"] = \
                    "absent (perf not installed)"
        try:
            if have_perf:
                perf_probe(event, chain)
            run_round_robin(tools_a, a, reps, "a")
        finally:
            if have_perf:
                perf_probe(event, None)
        run_round_robin(tools_b, b, reps, "b")

    minutes = (time.monotonic() - started) / 60
    md = f"""## DWARF stacks: ustack vs `perf --call-graph dwarf`

{time.strftime('%Y-%m-%d')}, kernel {platform.release()}, {os.cpu_count()} CPUs; medians of {reps} run(s), round-robin; bench took {minutes:.1f} min. Both tools copy 8 KiB of user stack per event (their defaults); ustack's CFI cache is warm.

### (a) a uprobe on `d`: `chain {n:,}`, built -O2 -fomit-frame-pointer

{table_a(a, n)}

### (b) profile at 999 Hz: `busy {secs:g}`, built -O2 -fomit-frame-pointer

{table_b(b, startup_cpu(a))}

How to read these:
- *target s*: the traced program alone (its own GNU time, inside the tool), so tool start-up and post-processing are not in it; *µs/hit* = (target s − uninstrumented) / N. *wall s*: the whole command.
- *captured*: stacks the tool reports (ustack count/profile: the sum of its counts; ustack trace: N − lost, its output is not counted; perf: SAMPLE in `perf report --stats`). *lost*: ustack's `Lost N events`; perf's LOST_SAMPLES.
- *CPU s (tool)*: user+sys CPU of the tool process minus the target's. ustack decodes, unwinds and symbolizes while the target runs, so its post-processing cannot be timed apart: its *samples/s* is captured / (its own CPU seconds − the start-up row's), ring-buffer reading included, so a lower bound on its unwind + symbolize speed; the start-up row (one hit) is Python start, probe set-up and the CFI tables loaded from the cache; (b) uses the same start-up figure. perf's unwinding happens in `perf script`: its *samples/s* is samples / `perf script` wall time. *frames/s* = samples/s × the frames of one stack (ustack: the most frequent stack of `count`, also used for `trace`; perf: the first sample `perf script` prints).
- *peak RSS*: GNU time %M of the tool (ustack's includes the tiny target). perf mmaps perf.data, and `perf record` reads it back at exit for build-ids: much of perf's RSS is file-backed pages of perf.data.
- (b) *user CPU lost*: busy spins for a fixed wall time, so the sampling cost shows as user CPU the target did not get: 1 − target user s / uninstrumented user s.
- The machine is shared and has 2 CPUs: compare rows of one run, not runs.
"""
    write_report(md, out_md)


if __name__ == "__main__":
    main()
