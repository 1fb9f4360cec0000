#!/usr/bin/env python3
"""Complete stacks at in-kernel cost: ustack's DWARF unwinder inside BPF
beside its copy path, perf --call-graph dwarf, and frame-pointer walks
(bpftrace's `ustack`, ustack --unwind fp), one run.

    sudo python3 bench/bpf_dwarf.py [--quick]

1. uprobe: a no-frame-pointer program (main -> a -> b -> c in C, -O2
   -fomit-frame-pointer) calls d N times; d is assembly whose first
   instruction is `push %rbp` (rbp used as a plain register, with CFI), so
   the uprobe is emulated, not single-stepped. Columns as in
   bench/uprobe_rate.py, plus `frames` (of the most frequent stack: complete
   is 8, d..._start) and the tool's peak RSS.
2. profile: the same program looping (no probe) under 999 Hz sampling:
   the program's own run time (it times itself) against an unprofiled run.
3. tables: per object, the unwind rows' size and the time to build them
   (cold: no disk cache) and to load them into the kernel's map.

Prints Markdown and writes it to bench/results/.
"""
from __future__ import annotations

import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from uprobe_rate import (Failed, Run, REPO, lost_count, run_options, run_rounds,  # noqa: E402
                         timed, write_report)
from helpers import ustack_env  # noqa: E402  (path set by uprobe_rate)

sys.path.insert(0, str(REPO / "src"))

# d: `push %rbp` first (emulated by uprobes), rbp used as a scratch register,
# CFI that says so; everything else C without frame pointers.
PROGRAM = r"""
#include <stdlib.h>
#include <stdio.h>
#include <time.h>
#define KEEP __attribute__((noinline, noipa, used))
long d(long i);
__asm__(
"	.text\n	.globl d\n	.type d, @function\n"
"d:\n	.cfi_startproc\n"
"	push %rbp\n	.cfi_def_cfa_offset 16\n	.cfi_offset %rbp, -16\n"
"	mov %rdi, %rbp\n	lea 1(%rbp), %rax\n"
"	pop %rbp\n	.cfi_def_cfa_offset 8\n	.cfi_restore %rbp\n"
"	ret\n	.cfi_endproc\n	.size d, .-d\n");
volatile long sink;
KEEP long c(long n) { long s = 0; for (long i = 0; i < n; i++) s += d(i); return s + 1; }
KEEP long b(long n) { long r = c(n); __asm__ volatile(""); return r + 1; }
KEEP long a(long n) { long r = b(n); __asm__ volatile(""); return r + 1; }
int main(int argc, char **argv)
{
	long n = argc > 1 ? atol(argv[1]) : 1, rounds = argc > 2 ? atol(argv[2]) : 1;
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (long r = 0; r < rounds; r++)
		sink += a(n);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	if (argc > 2)
		fprintf(stderr, "ran %.6f s\n", (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9);
	return 0;
}
"""
TIME_RSS = ["/usr/bin/time", "-f", "maxrss %M"]


def build(tmp: Path) -> str:
    src = tmp / "dwarfbench.c"
    src.write_text(PROGRAM)
    out = tmp / "dwarfbench"
    # no -g: perf probe would look for d in DWARF (asm has none); CFI is in .eh_frame
    subprocess.run(["gcc", "-O2", "-fomit-frame-pointer", "-o", str(out), str(src)],
                   check=True)
    return str(out)


def _rss(err: str) -> int | None:
    m = re.search(r"maxrss (\d+)", err)
    return int(m.group(1)) if m else None


def _frames(out: str) -> int | None:
    """Frames of the most frequent stack of a ustack count output."""
    best, frames, cur = -1, None, 0
    for line in out.splitlines():
        if re.match(r"^\s{4}\d+\s*$", line):
            if int(line) > best:
                best, frames = int(line), cur
            cur = 0
        elif line.startswith("  ") and not line.startswith("  ("):
            cur += 1
    return frames


def ustack(backend: str, unwind: str):
    def tool(prog, n, tmp, timeout):
        wall, out, err = timed(TIME_RSS + [sys.executable, "-m", "ustack", "count",
                                           f"uprobe:{prog}:d", "--backend", backend,
                                           "--unwind", unwind, "-c", f"{prog} {n}"],
                               timeout, env=ustack_env())
        if f"[backend {backend}, unwind {unwind}" not in err:
            raise Failed(f"not the {backend}/{unwind} path: {err.splitlines()[:1]}")
        counts = re.findall(r"^\s{4}(\d+)\s*$", out, re.M)
        dropped = sum(int(x) for x in re.findall(r"(\d+) events were not counted", err))
        r = Run(wall, sum(map(int, counts)) if counts else None, lost_count(err) + dropped)
        r.frames, r.rss = _frames(out), _rss(err)
        return r
    return tool


def bpftrace(prog, n, tmp, timeout):
    wall, out, err = timed(TIME_RSS + ["bpftrace", "-e",
                                       f"uprobe:{prog}:d {{ @[ustack] = count(); }}",
                                       "-c", f"{prog} {n}"], timeout)
    blocks = re.findall(r"@\[\n(.*?)\]: (\d+)", out, re.S)
    r = Run(wall, sum(int(c) for _b, c in blocks) if blocks else None, lost_count(out + err))
    top = max(blocks, key=lambda b: int(b[1]), default=None)
    r.frames = len([l for l in top[0].splitlines() if l.strip()]) if top else None
    r.rss = _rss(err)
    return r


def perf_dwarf(prog, n, tmp, timeout):
    data = tmp / "perf.data"
    subprocess.run(["perf", "probe", "-q", "-d", "dwbench:d"], capture_output=True)
    subprocess.run(["perf", "probe", "-q", "-x", prog, "-a", "dwbench:d=d"], check=True,
                   capture_output=True)
    try:
        wall, _, err = timed(TIME_RSS + ["perf", "record", "-q", "-e", "dwbench:d",
                                         "--call-graph", "dwarf", "-o", str(data),
                                         "--", prog, str(n)], timeout)
    finally:
        subprocess.run(["perf", "probe", "-q", "-d", "dwbench:d"], capture_output=True)
    _, stats, _ = timed(["perf", "report", "--stats", "-i", str(data)], timeout)
    size = data.stat().st_size
    data.unlink()
    section = stats.split("dwbench:d stats:")[-1]
    samples = re.search(r"SAMPLE events:\s+(\d+)", section)
    lost = re.search(r"LOST_SAMPLES events:\s+(\d+)", section)
    r = Run(wall, int(samples.group(1)) if samples else None, int(lost.group(1)) if lost else 0)
    r.frames, r.rss = None, _rss(err)
    r.note = f"perf.data {size / 1e6:.0f} MB, not unwound (perf script would)"
    return r


def baseline(prog, n, tmp, timeout):
    r = Run(timed([prog, str(n)], timeout)[0])
    r.frames = r.rss = None
    return r


def bare(prog, n, tmp, timeout):
    subprocess.run(["perf", "probe", "-q", "-d", "dwbench:d"], capture_output=True)
    subprocess.run(["perf", "probe", "-q", "-x", prog, "-a", "dwbench:d=d"], check=True,
                   capture_output=True)
    try:
        wall, _, err = timed(["perf", "stat", "-x,", "-e", "dwbench:d", "--", prog, str(n)],
                             timeout)
    finally:
        subprocess.run(["perf", "probe", "-q", "-d", "dwbench:d"], capture_output=True)
    hits = re.search(r"^(\d+),", err, re.M)
    r = Run(wall, int(hits.group(1)) if hits else None, 0)
    r.frames = r.rss = None
    return r


def uprobe_table(results: dict, n: int) -> str:
    base = statistics.median(r.wall for r in results["uninstrumented"])

    def us(runs):
        return (statistics.median(r.wall for r in runs) - base) / n * 1e6

    def med(runs, field, fmt="{:,.0f}", scale=1):
        vals = [getattr(r, field, None) for r in runs]
        vals = [v for v in vals if v is not None]
        return fmt.format(statistics.median(vals) / scale) if vals else "-"

    ref = next((runs for name, runs in results.items()
                if name.startswith("bpftrace") and isinstance(runs, list) and runs), None) \
        or results.get("ustack count --backend bpf --unwind fp")
    ref_us = us(ref) if isinstance(ref, list) and ref else None
    rows = ["| tool | wall s | µs/event | events kept | lost | frames | peak RSS MB | ÷ FP walk |",
            "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, runs in results.items():
        if isinstance(runs, str):
            rows.append(f"| {name} | {runs} | | | | | | |")
        elif name == "uninstrumented":
            rows.append(f"| {name} | {base:.3f} | | | | | | |")
        else:
            cost = us(runs)
            ratio = f"{cost / ref_us:.2f}" if ref_us else "-"
            rows.append(f"| {name} | {statistics.median(r.wall for r in runs):.3f} "
                        f"| {cost:.2f} | {med(runs, 'events')} | {med(runs, 'lost')} "
                        f"| {med(runs, 'frames')} | {med(runs, 'rss', '{:.0f}', 1024)} "
                        f"| {ratio} |")
    return "\n".join(rows)


def alone_table(alone: dict) -> str:
    """µs per event without the tools' start-up and exit."""
    ref = alone.get("bpftrace @[ustack]=count() (frame pointers)")
    rows = ["| tool | wall s, 1 hit | µs/event without start-up/exit | ÷ bpftrace |",
            "|---|---:|---:|---:|"]
    for name, (us, one) in alone.items():
        ratio = f"{us / ref[0]:.2f}" if ref else "-"
        rows.append(f"| {name} | {one:.3f} | {us:.2f} | {ratio} |")
    return "\n".join(rows)


# --- 2. profile slowdown ------------------------------------------------------

def self_timed(cmd: list, timeout: float, env=None) -> float:
    _, _, err = timed(cmd, timeout, env=env)
    m = re.search(r"ran ([0-9.]+) s", err)
    if not m:
        raise Failed(f"no self-timing in: {err[-300:]}")
    return float(m.group(1))


def profile_rows(prog: str, reps: int, timeout: float) -> str:
    argv = [prog, "1000", "3000000"]     # ~4 s: long enough to see 1 %
    tools = {
        "unprofiled": lambda: (self_timed(argv, timeout), ""),
        "ustack profile -F 999 (DWARF in the kernel)": lambda: _profiled("dwarf", argv, timeout),
        "ustack profile -F 999 --backend perf (copy path)": lambda: _profiled("perf", argv, timeout),
        "perf record -F 999 --call-graph dwarf": lambda: _perf_profiled(argv, timeout),
    }
    res: dict = {k: [] for k in tools}
    for _ in range(reps):
        for k, f in tools.items():
            try:
                res[k].append(f())
            except (Failed, subprocess.TimeoutExpired) as e:
                res[k] = f"failed ({e})"
                break
    base = statistics.median(t for t, _ in res["unprofiled"])
    rows = ["| run | program's own time s | slowdown | notes |", "|---|---:|---:|---|"]
    for k, v in res.items():
        if isinstance(v, str):
            rows.append(f"| {k} | {v} | | |")
            continue
        t = statistics.median(x for x, _ in v)
        rows.append(f"| {k} | {t:.3f} | {100 * (t / base - 1):+.1f} % | {v[-1][1]} |")
    return "\n".join(rows)


def _profiled(path: str, argv: list, timeout: float):
    extra = ["--backend", "perf", "--unwind", "dwarf"] if path == "perf" else \
        ["--backend", "bpf", "--unwind", "dwarf"]
    _, out, err = timed([sys.executable, "-m", "ustack", "profile", "-F", "999", *extra,
                         "-c", " ".join(argv)], timeout, env=ustack_env())
    m = re.search(r"ran ([0-9.]+) s", err)
    if not m:
        raise Failed(err[-300:])
    counts = sum(int(x) for x in re.findall(r"^\s{4}(\d+)\s*$", out, re.M))
    cut = re.search(r"(\d+) events' stacks were cut short", err)
    lost = lost_count(err)
    return float(m.group(1)), (f"{counts:,} samples, {lost} lost"
                               + (f", {cut.group(1)} cut short" if cut else ""))


def _perf_profiled(argv: list, timeout: float):
    with tempfile.TemporaryDirectory() as d:
        _, _, err = timed(["perf", "record", "-q", "-F", "999", "--call-graph", "dwarf",
                           "-o", f"{d}/perf.data", "--", *argv], timeout)
    m = re.search(r"ran ([0-9.]+) s", err)
    if not m:
        raise Failed(err[-300:])
    return float(m.group(1)), ""


# --- 3. tables per object -------------------------------------------------------

def table_rows(prog: str) -> str:
    from ustack.capture.bpf_unwind import UnwindMaps
    from ustack.capture.unwind_objects import UnwindObjects
    from ustack.objfile.elf import ElfImage
    from ustack.unwind import tables
    from ustack.unwind.cfi import UnwindTable
    objects = [prog, "/lib/x86_64-linux-gnu/libc.so.6", "/lib64/ld-linux-x86-64.so.2",
               "/lib/x86_64-linux-gnu/libstdc++.so.6", sys.executable]
    go = _go_binary()
    if go:
        objects.append(go)
    rows = ["| object | rows | table KB | build ms (cold) | build ms (disk cache) | load ms |",
            "|---|---:|---:|---:|---:|---:|"]
    with tempfile.TemporaryDirectory() as cache:
        os.environ["USTACK_CACHE_DIR"] = cache
        maps = UnwindMaps(1 << 20, 16, 16)
        try:
            loader = UnwindObjects(maps, tables.for_image)
            for path in objects:
                if not os.path.exists(path):
                    continue
                ElfImage.clear_cache()
                UnwindTable.clear_cache()
                t0 = time.perf_counter()
                packed = tables.for_image(ElfImage.open(path))
                t1 = time.perf_counter()
                UnwindTable.clear_cache()
                ElfImage.clear_cache()
                t2 = time.perf_counter()
                tables.for_image(ElfImage.open(path))
                t3 = time.perf_counter()
                loader.add_path(path)
                t4 = time.perf_counter()
                n = len(packed) if packed else 0
                rows.append(f"| {os.path.basename(path)} | {n:,} | {n * tables.ROW_SIZE / 1024:.0f} "
                            f"| {(t1 - t0) * 1e3:.0f} | {(t3 - t2) * 1e3:.0f} | {(t4 - t3) * 1e3:.0f} |")
            memlock = sum(_memlock(m.fd) for m in maps.all)
        finally:
            maps.close()
    return "\n".join(rows) + (f"\n\nKernel memory of the unwinder's maps at the default "
                              f"size (1 M rows = 16 MiB of rows): {memlock / 2**20:.1f} MiB "
                              f"(memlock of the maps, stack/count maps at 16 entries here).")


def system_rows() -> str:
    """What a system-wide run loads before it starts: every object mapped
    executable by a process now, built cold (empty disk cache) and warm."""
    from ustack.capture.bpf_unwind import UnwindMaps, objects_of_target
    from ustack.capture.unwind_objects import UnwindObjects
    from ustack.objfile.elf import ElfImage
    from ustack.target import process
    from ustack.unwind import tables
    from ustack.unwind.cfi import UnwindTable
    paths = objects_of_target(process.everything(), [])
    out = []
    with tempfile.TemporaryDirectory() as cache:
        os.environ["USTACK_CACHE_DIR"] = cache
        for label in ("cold", "warm"):
            ElfImage.clear_cache()
            UnwindTable.clear_cache()
            maps = UnwindMaps(1 << 20, 16, 16)
            try:
                loader = UnwindObjects(maps, tables.for_image)
                t0 = time.perf_counter()
                for path in paths:
                    loader.add_path(path)
                took = time.perf_counter() - t0
            finally:
                maps.close()
            out.append(f"| {label} | {len(loader.loaded)} | {loader.rows_used:,} "
                       f"| {loader.bytes_loaded / 2**20:.1f} | {took:.2f} "
                       f"| {took / max(1, len(loader.loaded)) * 1e3:.0f} |")
    return ("| disk cache | objects | rows | rows MiB | load s | ms/object |\n"
            "|---|---:|---:|---:|---:|---:|\n" + "\n".join(out))


def _memlock(fd: int) -> int:
    with open(f"/proc/self/fdinfo/{fd}") as f:
        m = re.search(r"memlock:\s+(\d+)", f.read())
    return int(m.group(1)) if m else 0


def _go_binary() -> str | None:
    try:
        from helpers import build_go
        return str(build_go("gochain"))
    except Exception:
        return None


def main():
    args, n, reps, out = run_options(__doc__, "bpf_dwarf")
    with tempfile.TemporaryDirectory(prefix="bpf_dwarf.") as tmp:
        prog = build(Path(tmp))
        tools = {"uninstrumented": baseline,
                 "bare uprobe (perf stat, no stack)": bare,
                 "ustack count --backend bpf --unwind dwarf": ustack("bpf", "dwarf"),
                 "ustack count --backend bpf --unwind fp": ustack("bpf", "fp"),
                 "bpftrace @[ustack]=count() (frame pointers)": bpftrace,
                 "ustack count --backend perf --unwind dwarf": ustack("perf", "dwarf"),
                 "perf record --call-graph dwarf": perf_dwarf}
        results: dict = {k: [] for k in tools}
        if not shutil.which("bpftrace"):
            results["bpftrace @[ustack]=count() (frame pointers)"] = "absent (not installed)"
        run_rounds(tools, results, reps, lambda name, tool: results[name].append(
            tool(prog, n, Path(tmp), args.timeout)))
        # the cost of one event alone: (wall(N) - wall(1 hit)) / (N - 1)
        alone = {}
        for name in ("ustack count --backend bpf --unwind dwarf",
                     "ustack count --backend bpf --unwind fp",
                     "bpftrace @[ustack]=count() (frame pointers)"):
            if isinstance(results[name], list) and results[name]:
                one = [tools[name](prog, 1, Path(tmp), args.timeout).wall
                       for _ in range(reps)]
                alone[name] = (statistics.median(r.wall for r in results[name])
                               - statistics.median(one)) / (n - 1) * 1e6, statistics.median(one)
        print("profile …", file=sys.stderr, flush=True)
        prof = profile_rows(prog, reps, args.timeout)
        print("tables …", file=sys.stderr, flush=True)
        tabs = table_rows(prog)
        print("system-wide …", file=sys.stderr, flush=True)
        system = system_rows()
    perf_notes = [getattr(r, "note", "") for r in results["perf record --call-graph dwarf"]] \
        if isinstance(results["perf record --call-graph dwarf"], list) else []
    md = (f"## Complete stacks at in-kernel cost: DWARF unwinding inside BPF\n\n"
          f"{time.strftime('%Y-%m-%d')}, kernel {platform.release()}, {os.cpu_count()} CPUs, "
          f"medians of {reps} run(s).\n\n"
          f"### 1. {n:,} hits of a uprobe on an emulated `push %rbp` site, no frame pointers\n\n"
          "main -> a -> b -> c (C, -O2 -fomit-frame-pointer) -> d (assembly, "
          "`push %rbp` first). µs/event = (wall - uninstrumented) / N, start-up "
          "included; frames: of the most frequent stack (complete: d, c, b, a, main, "
          "__libc_start_call_main, __libc_start_main, _start = 8); ÷ FP walk: µs/event "
          "relative to bpftrace's frame-pointer `ustack` (ustack --unwind fp when "
          "bpftrace is absent), which walks the same site but gets wrong stacks.\n\n"
          + uprobe_table(results, n) + "\n\n"
          + alone_table(alone) + "\n\n"
          + (f"perf record: {perf_notes[-1]}.\n\n" if perf_notes else "")
          + "### 2. 999 Hz profile of the same program (no probe, ~4 s), its own run time\n\n"
          + prof + "\n\n### 3. Unwind tables per object\n\n" + tabs + "\n\n"
          "### 4. System-wide: the objects every process maps now\n\n"
          "What `ustack profile` with no -p/-c loads before it starts.\n\n"
          + system + "\n")
    write_report(md, out)


if __name__ == "__main__":
    main()
