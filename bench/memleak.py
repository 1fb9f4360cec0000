#!/usr/bin/env python3
"""The cost of tracing allocations: ns per malloc+free pair without a tool,
under `ustack memleak`, under bcc's memleak (where installed) and under
bpftrace's equivalent script (uprobe and uretprobe on malloc, uprobe on
free, a map of outstanding blocks with their size and user stack).

    sudo python3 bench/memleak.py [-n N] [--reps R]

The target (bench/programs/mallocloop.c, -O2 -fomit-frame-pointer) waits
for a line on stdin, then times N pairs by its own clock: a tool's start-up
and exit are not in the figure. Each tool attaches with -p; the target is
released once the tool says it traces (ustack's `Tracing` line) or, for the
others, once malloc's and free's first bytes in the target are breakpoints
(read through /proc/PID/mem) and half a second more has passed. Tools
alternate within each round; medians of R rounds.

  ns/pair        what the target measured
  + ns/pair      over the uninstrumented run's
  ÷ peer         the added cost over bcc memleak's (else bpftrace's)

bcc and bpftrace walk frame pointers, so on this program their stacks end
after one or two frames; ustack unwinds to _start with DWARF in the kernel.

Prints Markdown and writes it to bench/results/memleak.md.
"""
from __future__ import annotations

import argparse
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "tests"))
from helpers import ustack_env  # noqa: E402

BCC = shutil.which("memleak-bpfcc") or shutil.which("memleak")
BPFTRACE_NAME = "bpftrace (malloc, its return, free; @[addr] = size, ustack)"
BCC_NAME = "bcc memleak"
USTACK_NAME = "ustack memleak"


def build(tmp: Path) -> str:
    out = tmp / "mallocloop"
    subprocess.run(["gcc", "-O2", "-g", "-fomit-frame-pointer", "-o", str(out),
                    str(REPO / "bench" / "programs" / "mallocloop.c")], check=True)
    return str(out)


def libc_of(pid: int) -> str:
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            path = line.split()[-1]
            if os.path.basename(path).startswith("libc.so"):
                return path
    raise SystemExit(f"process {pid} maps no libc")


def code_address(pid: int, libc: str, name: str) -> int:
    """Where libc's `name` is in process `pid`."""
    from ustack.objfile.elf import ElfImage
    image = ElfImage.open(libc)
    sym = next(s for s in image.find(name) if s.size)
    off = image.file_offset(sym.address)
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            fields = line.split()
            if fields[-1] != libc or "x" not in fields[1]:
                continue
            start, end = (int(x, 16) for x in fields[0].split("-"))
            pgoff = int(fields[2], 16)
            if pgoff <= off < pgoff + end - start:
                return start + off - pgoff
    raise SystemExit(f"{name} is not mapped in {pid}")


class Failed(Exception):
    pass


def wait_breakpoints(pid: int, libc: str, tool: subprocess.Popen,
                     timeout: float = 120) -> None:
    """Until malloc and free start with int3 in the target (their uprobes
    are in), then half a second for the tool's programs to be attached."""
    addrs = [code_address(pid, libc, n) for n in ("malloc", "free")]
    deadline = time.monotonic() + timeout
    with open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
        while time.monotonic() < deadline:
            if tool.poll() is not None:
                lines = (tool.stderr.read() + tool.stdout.read()).strip().splitlines()
                why = next((l for l in lines if "kernel headers" in l), lines[-1:] or [""])
                raise Failed(why if isinstance(why, str) else why[0])
            if all(os.pread(mem.fileno(), 1, a) == b"\xcc" for a in addrs):
                time.sleep(0.5)
                return
            time.sleep(0.02)
    raise Failed("its uprobes never appeared")


def end_tool(tool: subprocess.Popen) -> str:
    """Its output; SIGINT if it does not end with the target."""
    try:
        out, err = tool.communicate(timeout=5)
    except subprocess.TimeoutExpired:
        os.killpg(tool.pid, signal.SIGINT)
        try:
            out, err = tool.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(tool.pid, signal.SIGKILL)
            out, err = tool.communicate()
    return (out or "") + (err or "")


def run_once(prog: str, n: int, name: str) -> float:
    """ns per pair the target measured under tool `name`."""
    target = subprocess.Popen([prog, str(n)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    tool = None
    try:
        pid = target.pid
        time.sleep(0.05)                 # its libc mapped (it blocks in fgets)
        libc = libc_of(pid)
        if name == USTACK_NAME:
            tool = subprocess.Popen([sys.executable, "-m", "ustack", "memleak", "-p",
                                     str(pid)], stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True,
                                    env=ustack_env(), start_new_session=True)
            line = tool.stderr.readline()
            if not line.startswith("Tracing"):
                raise SystemExit(f"ustack did not trace: {line}{tool.stderr.read()}")
        elif name == BCC_NAME:
            tool = subprocess.Popen([BCC, "-p", str(pid), "3600"], stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True,
                                    start_new_session=True)
            wait_breakpoints(pid, libc, tool)
        elif name == BPFTRACE_NAME:
            script = (f"uprobe:{libc}:malloc {{ @size[tid] = arg0; }} "
                      f"uretprobe:{libc}:malloc /@size[tid]/ {{ @sizes[retval] = "
                      "@size[tid]; @stacks[retval] = ustack; delete(@size[tid]); } "
                      f"uprobe:{libc}:free {{ delete(@sizes[arg0]); delete(@stacks[arg0]); }} "
                      "END { clear(@size); clear(@sizes); clear(@stacks); }")
            tool = subprocess.Popen(["bpftrace", "-p", str(pid), "-e", script],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True, start_new_session=True)
            wait_breakpoints(pid, libc, tool)
        target.stdin.write("go\n")
        target.stdin.close()
        out = target.stdout.read()
        if target.wait(timeout=600) != 0:
            raise SystemExit(f"the target failed under {name}")
        return float(out)
    finally:
        if target.poll() is None:
            target.kill()
            target.wait()
        if tool is not None:
            end_tool(tool)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", type=int, default=200_000, help="pairs per run (default 200000)")
    ap.add_argument("--reps", type=int, default=3, help="rounds (default 3)")
    ap.add_argument("-o", "--out", type=Path, default=REPO / "bench" / "results" / "memleak.md")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("memleak: run as root (uprobes and BPF need it)")
    names = ["uninstrumented", USTACK_NAME]
    absent = {}
    for name, exe in ((BCC_NAME, BCC), (BPFTRACE_NAME, shutil.which("bpftrace"))):
        if exe:
            names.append(name)
        else:
            absent[name] = "absent (not installed)"
    results: dict = {name: [] for name in names}
    with tempfile.TemporaryDirectory(prefix="memleak.") as tmp:
        prog = build(Path(tmp))
        for rep in range(args.reps):
            for name in [n for n in names if n not in absent]:
                print(f"[{rep + 1}/{args.reps}] {name} …", file=sys.stderr, flush=True)
                try:
                    results[name].append(run_once(prog, args.n, name))
                except Failed as e:
                    absent[name] = f"failed: {str(e)[:100]}"
    names = [n for n in names if n not in absent]
    med = {name: statistics.median(v) for name, v in results.items() if name in names}
    base = med["uninstrumented"]
    peer = BCC_NAME if BCC_NAME in med else BPFTRACE_NAME if BPFTRACE_NAME in med else None
    rows = ["| tool | ns/pair | + ns/pair | ÷ " + (peer or "peer") + " | runs |",
            "|---|---:|---:|---:|---|"]
    for name in names:
        added = med[name] - base
        ratio = (f"{added / (med[peer] - base):.2f}"
                 if peer and name != "uninstrumented" else "")
        runs = ", ".join(f"{v:,.0f}" for v in results[name])
        rows.append(f"| {name} | {med[name]:,.0f} | "
                    f"{'' if name == 'uninstrumented' else f'{added:,.0f}'} | {ratio} | {runs} |")
    for name, why in absent.items():
        rows.append(f"| {name} | {why} | | | |")
    load = " ".join(open("/proc/loadavg").read().split()[:3])
    md = (f"## memleak: the cost of a malloc+free pair\n\n"
          f"`mallocloop {args.n}` (malloc(64) and its free, -O2 -fomit-frame-pointer, "
          f"stacks 6 frames deep), timed by the program; medians of {args.reps}; "
          f"{time.strftime('%Y-%m-%d')}, kernel {platform.release()}, "
          f"{os.cpu_count()} CPUs, loadavg at the end {load}.\n\n" + "\n".join(rows) + "\n")
    print(md)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(md)


if __name__ == "__main__":
    main()
