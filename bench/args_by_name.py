#!/usr/bin/env python3
"""Arguments by name: what resolving parameters from DWARF costs, and
`ustack list -v` against `bpftrace -lv` and `perf probe -V`, one run.

    sudo python3 bench/args_by_name.py [--reps N]

Rows (median of REPS runs, tools round-robin):
  resolve   in a fresh ustack process, the time of resolve_uprobes() for
            `uprobe:libc:write` with fetch-args by register (%di %si %dx),
            then by name (fd buf nbytes: DWARF of libc's debug file), and
            for tests/programs/args.c's mix (ten parameters, own DWARF);
            with ustack's on-disk cache warm, and empty ("cold cache": the
            ELF tables are read again too)
  list -v   wall time of the whole command, ustack (and its `list` without
            -v: the start-up and symbol table part) and its peers, for one
            libc function, for libc's `str*` (~80 functions) and for every
            function of the args program (ustack's cache as the user has it:
            warm after the first run)

Prints Markdown and writes it to bench/results/args_by_name.md.
"""
from __future__ import annotations

import argparse
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from helpers import O2_NOFP, build, ustack_env  # noqa: E402

LIBC = "/usr/lib/x86_64-linux-gnu/libc.so.6"
_RESOLVE = ("import sys, time; from ustack.probes.spec import parse_event; "
            "from ustack.probes.resolve import resolve_uprobes; "
            "spec = parse_event(sys.argv[1]); t = time.perf_counter(); "
            "resolve_uprobes(spec); print(time.perf_counter() - t)")


def resolve_time(event: str, cache_dir: str) -> float:
    env = dict(ustack_env(), USTACK_CACHE_DIR=cache_dir)
    out = subprocess.run([sys.executable, "-c", _RESOLVE, event], env=env,
                         capture_output=True, text=True, check=True).stdout
    return float(out)


def wall(cmd: list) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, env=ustack_env(), capture_output=True, check=True)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    reps = ap.parse_args().reps
    prog = str(build("args", flags=O2_NOFP))
    names = [sys.executable, "-m", "ustack", "list"]
    ustack = names + ["-v"]
    resolve_rows = [
        ("resolve libc write", "by register", f"uprobe:{LIBC}:write %di %si %dx"),
        ("resolve libc write", "by name", f"uprobe:{LIBC}:write fd buf nbytes"),
        ("resolve libc write", "by name, cold cache", f"uprobe:{LIBC}:write fd buf nbytes"),
        ("resolve args mix", "by register", f"uprobe:{prog}:mix %di %si %dx %cx %r8 %r9 "
                                            "+8(%sp) +16(%sp) +24(%sp) +32(%sp)"),
        ("resolve args mix", "by name", f"uprobe:{prog}:mix i len buf c neg flag ok ch big last"),
        ("resolve args mix", "by name, cold cache",
         f"uprobe:{prog}:mix i len buf c neg flag ok ch big last"),
    ]
    list_rows = [("libc write", [
        ("ustack list -v", ustack + [LIBC, "write"]),
        ("ustack list (names only)", names + [LIBC, "write"]),
        ("bpftrace -lv", ["bpftrace", "-lv", f"uprobe:{LIBC}:write"]),
        ("perf probe -V", ["perf", "probe", "-x", LIBC, "-V", "write"])]),
        ("libc str*", [
            ("ustack list -v", ustack + [LIBC, "str*"]),
            ("ustack list (names only)", names + [LIBC, "str*"]),
            ("bpftrace -lv", ["bpftrace", "-lv", f"uprobe:{LIBC}:str*"])]),
        ("args (all)", [
            ("ustack list -v", ustack + [prog]),
            ("ustack list (names only)", names + [prog]),
            ("bpftrace -lv", ["bpftrace", "-lv", f"uprobe:{prog}:*"])])]
    times: dict = {}
    warm = tempfile.mkdtemp(prefix="ustack-bench-cache-")
    for what, how, event in resolve_rows:
        resolve_time(event, warm)                      # fills the warm cache
    for _ in range(reps):
        for what, how, event in resolve_rows:
            cold = tempfile.mkdtemp(prefix="ustack-bench-cache-")
            times.setdefault((what, how), []).append(
                resolve_time(event, cold if "cold" in how else warm))
            shutil.rmtree(cold)
        for what, tools in list_rows:
            for tool, cmd in tools:
                if shutil.which(cmd[0]) or cmd[0] == sys.executable:
                    times.setdefault((what, tool), []).append(wall(cmd))
    shutil.rmtree(warm)
    lines = [f"## Arguments by name: resolution and list -v (median of {reps})", "",
             f"{platform.node()}, {platform.release()}, "
             f"{len(__import__('os').sched_getaffinity(0))} CPUs", "",
             "| what | how | ms | ÷ first row of its group |", "|---|---|---:|---:|"]
    groups: dict = {}
    for (what, how), ts in times.items():
        ms = statistics.median(ts) * 1e3
        first = groups.setdefault(what, ms)
        lines.append(f"| {what} | {how} | {ms:.1f} | {ms / first:.2f} |")
    md = "\n".join(lines) + "\n"
    print(md)
    out = REPO / "bench" / "results" / "args_by_name.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(md)


if __name__ == "__main__":
    main()
