#!/usr/bin/env python3
"""What Python frames cost: the in-kernel Python walk (bpf/python.h) per
sample, and a profiled Python program's slowdown next to py-spy's.

    sudo python3 bench/python_walk.py [--reps R] [--pythons 3.8,3.11,3.13]

1. per sample: `profile -F 999 --backend bpf` of a busy Python program
   (tests/programs/python/frames.py busy: <module> -> main -> outer ->
   middle -> leaf -> spin) and of a busy shell loop (no interpreter), with
   Python frames and with --no-python, interleaved; the unwinder programs'
   ns per run from the kernel's BPF statistics (BPF_ENABLE_STATS, on only
   while a run lasts). The difference is the Python pass's cost.
2. overhead: the same chain for a fixed number of calls (the program's own
   CPU time), alone, under `ustack profile -F HZ` and under `py-spy record
   -r HZ`, at 99 and 999 Hz (py-spy reads the target from another process:
   its cost is mostly its own CPU). Each tool's own CPU is the whole run's
   CPU (its own and its child's, by the children's rusage) less what the
   program reports as its own process's CPU.

Prints Markdown; medians of R runs."""
from __future__ import annotations

import argparse
import glob
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FRAMES = REPO / "tests" / "programs" / "python" / "frames.py"

# one profile run in this checkout's code: prints "samples ns_per_run"
PER_SAMPLE = r"""
import ctypes, struct, sys
from ustack import Options, Session
from ustack.kernel import bpf_syscall as bpf
cmd, python = sys.argv[1], sys.argv[2] == "on"
stats = bpf._bpf(32, (ctypes.c_uint32 * 1)(0))       # BPF_ENABLE_STATS, run time
opts = Options(command="profile", events=["profile:hz:999"], cmdline=cmd,
               backend="bpf", python=python)
with Session(opts) as run:
    samples = sum(c.count for c in run.counts())
    ns = cnt = 0
    for fd in run.capture.owned.programs:   # the unwinder's (and exec's: one run)
        info = ctypes.create_string_buffer(256)
        bpf._bpf(bpf.OBJ_GET_INFO_BY_FD, bpf._ObjInfo(fd, 256, ctypes.addressof(info)))
        t, c = struct.unpack_from("<QQ", info.raw, 192)     # run_time_ns, run_cnt
        ns, cnt = ns + t, cnt + c
print(samples, ns / max(cnt, 1))
"""

# the chain for N calls of outer(); prints the CPU seconds it took
FIXED_WORK = r"""
import sys, time
def spin(n):
    s = 0
    for i in range(n):
        s += i * i
    return s
def leaf(): return spin(2000)
def middle(): return leaf()
def outer(): return middle()
def main(n):
    t = time.process_time()     # CPU time: the machine's other load counts less
    for _ in range(n):
        outer()
    print(f"{time.process_time() - t:.4f} {time.process_time():.4f}")  # the loop's, the process's
main(int(sys.argv[1]))
"""


def pythons(wanted: list) -> list:
    found = []
    for v in wanted:
        paths = sorted(glob.glob(f"/root/.pyenv/versions/{v}.*/bin/python3"))
        if paths:
            found.append((v, paths[-1]))
        else:
            print(f"(no CPython {v} under /root/.pyenv/versions: skipped)", file=sys.stderr)
    return found


def ustack_env() -> dict:
    return dict(os.environ, PYTHONPATH=str(REPO / "src"))


def per_sample(cmd: str, python: bool) -> tuple:
    out = subprocess.run([sys.executable, "-c", PER_SAMPLE, cmd, "on" if python else "off"],
                         env=ustack_env(), capture_output=True, text=True, timeout=120,
                         check=True).stdout.strip().splitlines()[-1].split()
    return int(out[0]), float(out[1])     # the last line: the target may print too


def timed(cmd: list, **kw) -> tuple:
    """Run cmd; (the program's loop's CPU seconds, the CPU seconds of cmd
    and all it waited for, less the program's own: the tool's CPU)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=True, **kw)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    loop, program = _own_from(run)
    return loop, cpu - program


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=4)
    ap.add_argument("--pythons", default="3.8,3.11,3.13")
    ap.add_argument("--calls", type=int, default=20000,
                    help="outer() calls (overhead; ~2 s of work, a short profile)")
    ap.add_argument("--hz", default="99,999", help="sampling rates of the overhead part")
    ap.add_argument("--overhead-only", action="store_true", help="skip the per-sample part")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root")
    found = pythons(args.pythons.split(","))

    if not args.overhead_only:
        per_sample_table(args, found)
    overhead_table(args, found)
    return 0


def per_sample_table(args, found) -> None:
    print("## Per sample (profile -F 999, unwinder programs' ns per run)\n")
    print("| target | Python frames | --no-python | Python pass |")
    print("|---|---|---|---|")
    targets = [(f"CPython {v} frames.py", f"{py} {FRAMES} busy 2") for v, py in found]
    targets.append(("dash loop (no interpreter)",
                    "dash -c 'i=0; while [ $i -lt 1500000 ]; do i=$((i+1)); done'"))
    for label, cmd in targets:
        runs: dict = {True: [], False: []}
        for rep in range(args.reps):        # A B B A …: the first of a pair runs slower
            for python in ((True, False) if rep % 2 == 0 else (False, True)):
                runs[python].append(per_sample(cmd, python)[1])
        on, off = runs[True], runs[False]
        a, b = statistics.median(on), statistics.median(off)
        print(f"| {label} | {a:.0f} ns | {b:.0f} ns | {a - b:+.0f} ns |")


def overhead_table(args, found) -> None:
    print("\n## Overhead (the program's own CPU seconds for a fixed number of calls)\n")
    print("| CPython | Hz | alone | target under ustack | target under py-spy "
          "| ustack's own CPU | py-spy's own CPU |")
    print("|---|---|---|---|---|---|---|")
    spy = Path(sys.executable).parent / "py-spy"
    with tempfile.TemporaryDirectory() as tmp:
        prog = Path(tmp) / "fixed.py"
        prog.write_text(FIXED_WORK)
        for v, py in found:
            for hz in [int(h) for h in args.hz.split(",")]:
                alone, ours, ours_cpu, theirs, theirs_cpu = [], [], [], [], []
                for _ in range(args.reps):
                    own, cpu = timed([py, str(prog), str(args.calls)])
                    alone.append(own)
                    own, cpu = timed(
                        [sys.executable, "-m", "ustack", "profile", "-F", str(hz), "-o",
                         str(Path(tmp) / "p.folded"), "-c",
                         f"{py} {prog} {args.calls}"], env=ustack_env())
                    ours.append(own)
                    ours_cpu.append(cpu)
                    if spy.exists():
                        own, cpu = timed(
                            [str(spy), "record", "-r", str(hz), "-f", "raw", "-o",
                             str(Path(tmp) / "s.txt"), "--", py, str(prog), str(args.calls)])
                        theirs.append(own)
                        theirs_cpu.append(cpu)
                base = statistics.median(alone)

                def rel(xs):
                    return f"{statistics.median(xs):.3f} s ({statistics.median(xs) / base - 1:+.1%})" \
                        if xs else "-"

                def tool(xs):
                    return f"{statistics.median(xs):.2f} s" if xs else "-"
                print(f"| {v} | {hz} | {base:.3f} s | {rel(ours)} | {rel(theirs)} "
                      f"| {tool(ours_cpu)} | {tool(theirs_cpu)} |")


def _own_from(run) -> tuple:
    """The program's printed seconds (its loop's, its whole process's),
    among the tool's own lines on stdout."""
    return next((float(m[1]), float(m[2])) for m in
                (re.fullmatch(r"(\d+\.\d{4}) (\d+\.\d{4})", line.strip())
                 for line in run.stdout.splitlines()) if m)


if __name__ == "__main__":
    sys.exit(main())
