#!/usr/bin/env python3
"""Has the in-kernel DWARF unwinder's cost changed? bench/bpf_dwarf.py's
uprobe run (`count --backend bpf --unwind dwarf`, N hits of an emulated
`push %rbp` site, every object loaded before the run) with this checkout's
src/ and another checkout's, interleaved A B A B … so both see the same
machine load; medians of the whole run's wall time and of the program's
own time per hit (the kernel's BPF run-time statistics, on only while the
run lasts: BPF_ENABLE_STATS).

    sudo python3 bench/bpf_dwarf_ab.py OTHER_CHECKOUT [-n N] [--reps R]

e.g. OTHER_CHECKOUT = a `git archive` of the commit before a change."""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bpf_dwarf  # noqa: E402
from uprobe_rate import REPO  # noqa: E402

# one run, in the checkout's own code: prints "hits ns_per_hit"
RUN = r"""
import ctypes, struct, sys
from ustack import Options, Session
try:                                  # either checkout's names
    from ustack.kernel import bpf_syscall as bpf
except ImportError:
    from ustack.kernel import bpf
prog, n = sys.argv[1], int(sys.argv[2])
stats = bpf._bpf(32, (ctypes.c_uint32 * 1)(0))       # BPF_ENABLE_STATS, run time
opts = Options(command="count", events=[f"uprobe:{prog}:d"], cmdline=f"{prog} {n}",
               backend="bpf", unwind="dwarf")
with Session(opts) as run:
    hits = sum(c.count for c in run.counts())
    ns = cnt = 0
    owned = getattr(run.capture, "owned", None)
    for fd in owned.programs if owned is not None else run.capture.counter.prog_fds:
        info = ctypes.create_string_buffer(256)
        bpf._bpf(bpf.OBJ_GET_INFO_BY_FD, bpf._ObjInfo(fd, 256, ctypes.addressof(info)))
        t, c = struct.unpack_from("<QQ", info.raw, 192)     # run_time_ns, run_cnt
        ns, cnt = ns + t, cnt + c
print(hits, ns / max(cnt, 1))
"""


def run(src: Path, prog: str, n: int, timeout: float) -> tuple:
    """(wall s, the program's ns per hit) of one run on `src`."""
    start = time.monotonic()
    out = subprocess.run([sys.executable, "-c", RUN, prog, str(n)], text=True,
                         env=dict(os.environ, PYTHONPATH=str(src)), capture_output=True,
                         timeout=timeout, check=True).stdout
    wall = time.monotonic() - start
    hits, ns = out.split()
    assert int(hits) == n, (src, out)
    return wall, float(ns)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("other", type=Path, help="the checkout to compare with")
    ap.add_argument("-n", type=int, default=1_000_000)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--timeout", type=float, default=120)
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bpf_dwarf_ab: run as root")
    sides = {"this": REPO / "src", "other": args.other.resolve() / "src"}
    for src in sides.values():                 # each side runs its own code
        where = subprocess.run([sys.executable, "-c", "import ustack; print(ustack.__file__)"],
                               env=dict(os.environ, PYTHONPATH=str(src)), text=True,
                               capture_output=True, check=True).stdout
        assert where.startswith(str(src)), (src, where)
    runs: dict = {k: [] for k in sides}
    with tempfile.TemporaryDirectory(prefix="bpf_dwarf_ab.") as tmp:
        prog = bpf_dwarf.build(Path(tmp))
        for _ in range(args.reps):
            for side, src in sides.items():
                runs[side].append(run(src, prog, args.n, args.timeout))
    print(f"{args.n:,} hits, {args.reps} runs each, interleaved; load average "
          f"{os.getloadavg()[0]:.1f} at the end\n")
    print("| src | wall s (median) | program ns/hit (median) | walls | ns/hit |")
    print("|---|---:|---:|---|---|")
    for side, r in runs.items():
        walls, ns = [w for w, _ in r], [x for _, x in r]
        print(f"| {side} ({sides[side].parent.name}) | {statistics.median(walls):.3f} "
              f"| {statistics.median(ns):.0f} | {' '.join(f'{w:.2f}' for w in walls)} "
              f"| {' '.join(f'{x:.0f}' for x in ns)} |")


if __name__ == "__main__":
    main()
