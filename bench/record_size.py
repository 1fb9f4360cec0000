#!/usr/bin/env python3
"""Recordings: `ustack record` vs `perf record`, file size and report speed, one run.

    sudo python3 bench/record_size.py [--quick]

A uprobe on `d` of tests/programs/chain.c, `chain N` (N = 100,000 hits):
(a) DWARF: chain built -O2 -fomit-frame-pointer; `perf record --call-graph
    dwarf` (8 KiB of stack per event, its default) vs `ustack record
    --unwind dwarf` (unwound while recording: the addresses are saved) and
    `ustack record --unwind dwarf --raw-stacks` (the stack copies saved,
    as perf does).
(b) frame pointers: chain built -O2 -fno-omit-frame-pointer; `perf record
    -g` vs `ustack record --unwind fp`.
Then each file is read back: `perf script` and `perf report --stdio`
(> /dev/null) vs `ustack report` (a stack per event, as perf script) and
`ustack report --as count` (counted, as perf report); stacks/s = events in
the file / wall seconds of the reading command.

Every run is repeated REPS times round-robin and each figure is the median.
Prints Markdown and writes it to bench/results/record_size.md
(record_size_quick.md with --quick).
"""
from __future__ import annotations

import argparse
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(BENCH))
from dwarf import perf_probe, perf_stats  # noqa: E402  (perf's uprobe and its counts)
from helpers import O2_FP, O2_NOFP, build, ustack_env  # noqa: E402
from uprobe_rate import Failed, fmt, lost_count, timed, write_report  # noqa: E402

USTACK = [sys.executable, "-m", "ustack"]
EVENT = "probe_chain:d"


def ustack_record(prog: Path, n: int, data: Path, extra: list, timeout: float) -> dict:
    wall, _, err = timed([*USTACK, "record", *extra, f"uprobe:{prog}:d",
                          "-c", f"{prog} {n}", "-o", str(data)], timeout, env=ustack_env())
    m = re.search(r"Recorded (\d+) events", err)
    if not m:
        raise Failed(f"ustack record said: {err.strip()[-200:]}")
    return dict(record_s=wall, events=int(m.group(1)), lost=lost_count(err),
                bytes=data.stat().st_size)


def perf_record(prog: Path, n: int, data: Path, extra: list, timeout: float) -> dict:
    perf_probe(EVENT, prog)
    try:
        wall, _, _ = timed(["perf", "record", "-q", *extra, "-e", EVENT, "-o", str(data),
                            "--", str(prog), str(n)], timeout)
    finally:
        perf_probe(EVENT, None)
    samples, lost = perf_stats(data, EVENT, timeout)
    return dict(record_s=wall, events=samples, lost=lost, bytes=data.stat().st_size)


def read_time(cmd: list, timeout: float, env=None) -> float:
    start = time.monotonic()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   timeout=timeout, check=True, env=env)
    return time.monotonic() - start


def ustack_reads(data: Path, timeout: float) -> dict:
    env = ustack_env()
    return {"script_s": read_time([*USTACK, "report", str(data)], timeout, env),
            "report_s": read_time([*USTACK, "report", "--as", "count", str(data)],
                                  timeout, env)}


def perf_reads(data: Path, timeout: float) -> dict:
    return {"script_s": read_time(["perf", "script", "-i", str(data)], timeout),
            "report_s": read_time(["perf", "report", "--stdio", "-i", str(data)],
                                  timeout)}


TOOLS = {      # name -> (recorder, its extra args, reader)
    "dwarf": {
        "perf record --call-graph dwarf": (perf_record, ["--call-graph", "dwarf"], perf_reads),
        "ustack record --unwind dwarf": (ustack_record, ["--unwind", "dwarf"], ustack_reads),
        "ustack record --unwind dwarf --raw-stacks":
            (ustack_record, ["--unwind", "dwarf", "--raw-stacks"], ustack_reads),
    },
    "fp": {
        "perf record -g": (perf_record, ["-g"], perf_reads),
        "ustack record --unwind fp": (ustack_record, ["--unwind", "fp"], ustack_reads),
    },
}


def measure(kind: str, prog: Path, n: int, reps: int, timeout: float) -> dict:
    results: dict = {name: [] for name in TOOLS[kind]}
    with tempfile.TemporaryDirectory(prefix="ustack-bench-") as tmp:
        for _ in range(reps):
            for name, (record, extra, reads) in TOOLS[kind].items():
                data = Path(tmp) / "run.data"
                try:
                    m = record(prog, n, data, extra, timeout)
                    m.update(reads(data, timeout))
                except (Failed, subprocess.SubprocessError) as e:
                    m = {"failed": str(e)[:120]}
                finally:
                    data.unlink(missing_ok=True)
                results[name].append(m)
    return results


def med(runs: list, key: str):
    vals = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(vals) if vals else None


def table(results: dict) -> str:
    rows = ["| run | events | lost | record s | file KB | bytes/event | ÷ perf (size) "
            "| events/s, stack per event | events/s, counted |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    perf_name = next(iter(results))
    perf_bpe = None
    for name, runs in results.items():
        failed = [r["failed"] for r in runs if "failed" in r]
        if failed and len(failed) == len(runs):
            rows.append(f"| {name} | failed: {failed[0]} |" + " |" * 8)
            continue
        events, size = med(runs, "events"), med(runs, "bytes")
        bpe = size / events if events else None
        if name == perf_name:
            perf_bpe = bpe
        ratio = perf_bpe / bpe if perf_bpe and bpe else None
        script, report = med(runs, "script_s"), med(runs, "report_s")
        rows.append(
            f"| {name} | {fmt(events and int(events))} | {fmt(med(runs, 'lost') and int(med(runs, 'lost')))} "
            f"| {fmt(med(runs, 'record_s'), '{:.2f}')} | {fmt(size and size / 1024, '{:,.0f}')} "
            f"| {fmt(bpe, '{:,.1f}')} | {fmt(ratio, '{:,.0f}×') if name != perf_name else '1×'} "
            f"| {fmt(events / script if events and script else None, '{:,.0f}')} "
            f"| {fmt(events / report if events and report else None, '{:,.0f}')} |")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="10,000 hits, 1 repetition")
    ap.add_argument("--hits", type=int, help="hits of d (default 100,000)")
    ap.add_argument("--only", choices=tuple(TOOLS), help="one section only")
    args = ap.parse_args()
    n, reps = (10_000, 1) if args.quick else (100_000, 3)
    n = args.hits or n
    started = time.monotonic()
    progs = {"dwarf": build("chain", flags=O2_NOFP), "fp": build("chain", flags=O2_FP)}
    sections = []
    for kind, title in (("dwarf", "(a) DWARF: chain built -O2 -fomit-frame-pointer"),
                        ("fp", "(b) frame pointers: chain built -O2 -fno-omit-frame-pointer")):
        if args.only and kind != args.only:
            continue
        results = measure(kind, progs[kind], n, reps, timeout=600)
        sections.append(f"### {title}, `chain {n:,}`\n\n{table(results)}\n")
    md = (f"## Recordings: `ustack record` vs `perf record`\n\n"
          f"{time.strftime('%Y-%m-%d')}, kernel {platform.release()}, "
          f"{len(__import__('os').sched_getaffinity(0))} CPUs; medians of {reps} run(s), "
          f"round-robin; bench took {(time.monotonic() - started) / 60:.1f} min. "
          f"Command: `sudo python3 bench/record_size.py {' '.join(sys.argv[1:])}`.\n\n"
          + "\n".join(sections) + """
How to read these:
- *events*: events in the file (perf: SAMPLE in `perf report --stats`; ustack: what `record` says it wrote); *lost*: events the kernel buffers dropped while recording.
- *bytes/event*: file size / events; *÷ perf (size)*: perf's bytes/event over this row's.
- *events/s, stack per event*: events / wall seconds of `perf script` or `ustack report` (a stack per event, text), output to /dev/null; *counted*: of `perf report --stdio` or `ustack report --as count`. Both include the tool's start-up (Python's ~0.3 s, perf's less) and symbolizing.
- ustack unwinds DWARF samples while recording (the binaries are surely the ones that ran there) and saves each distinct stack once, each event as ~30 bytes before gzip; `--raw-stacks` saves the 8 KiB stack copies as perf does (re-unwindable later, e.g. with other debug files).
""")
    name = "record_size" + ("_quick" if args.quick else "") + (
        f"_{args.only}_{n}" if args.only or args.hits else "")
    write_report(md, BENCH / "results" / f"{name}.md")


if __name__ == "__main__":
    main()
