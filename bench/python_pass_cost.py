#!/usr/bin/env python3
"""What the Python pass (src/ustack/bpf/python.h) costs per event in the
commands whose stacks stay in the kernel: `offcpu`, `latency --by-stack`
and `memleak` of tests/programs/python/waits.py (its chain <module> ->
main -> outer -> middle -> leaf -> nap|ask|grab run N times), with Python
frames and with --no-python, interleaved. The stack-walking program's ns
per run comes from the kernel's BPF statistics (BPF_ENABLE_STATS, on
while this runs), read just before the run closes it.

    sudo python3 bench/python_pass_cost.py [--reps R] [--python 3.12]

Prints Markdown; medians of R runs."""
from __future__ import annotations

import argparse
import glob
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WAITS = REPO / "tests" / "programs" / "python" / "waits.py"

# one ustack run in this checkout's code; prints "runs ns_per_run" of the
# programs named argv[1] (the stack-walking one: see its capture)
ONE_RUN = r"""
import contextlib, ctypes, io, struct, sys
from ustack.capture import run_objects
from ustack.cli import main
from ustack.kernel import bpf_syscall as bpf
name = sys.argv[1].encode()
stats = bpf._bpf(32, (ctypes.c_uint32 * 1)(0))       # BPF_ENABLE_STATS, run time
seen = [0, 0]
close = run_objects.RunObjects.close
def read_then_close(self):
    for fd in self.programs:
        info = ctypes.create_string_buffer(256)
        bpf._bpf(bpf.OBJ_GET_INFO_BY_FD, bpf._ObjInfo(fd, 256, ctypes.addressof(info)))
        if info.raw[64:80].rstrip(b"\0") == name:
            t, c = struct.unpack_from("<QQ", info.raw, 192)     # run_time_ns, run_cnt
            seen[0] += t
            seen[1] += c
    close(self)
run_objects.RunObjects.close = read_then_close
with contextlib.redirect_stdout(io.StringIO()):
    main(sys.argv[2:])
print(seen[1], seen[0] / max(seen[1], 1))
"""


def one_cost(off_flag: str | None, command: str) -> float:
    """ns per run of the walking program in one `profile -c command`,
    given `off_flag` (a pass's --no-… flag) or not."""
    args = ["profile", "-F", "199", "-o", "/dev/null", *([off_flag] if off_flag else []),
            "-c", command]
    out = subprocess.run([sys.executable, "-c", ONE_RUN, "ustack_uw0", *args],
                         capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=str(REPO / "src")))
    return float(out.stdout.split()[-1])


def cost(command: str, reps: int, off_flag: str) -> tuple:
    """Medians of ns per run, (the pass on, off_flag), runs interleaved:
    what an interpreter's pass costs a sample of `command`."""
    on, off = [], []
    for _ in range(reps):
        on.append(one_cost(None, command))
        off.append(one_cost(off_flag, command))
    return statistics.median(on), statistics.median(off)

# command: (waits.py mode, rounds, the stack-walking program's name, ustack args)
COMMANDS = {
    "offcpu": ("sleep", 500, "ustack_off0", ["offcpu"]),
    "latency --by-stack": ("getppid", 1000, "ustack_lat0",
                           ["latency", "--by-stack", "uprobe:libc:getppid"]),
    "memleak": ("leak", 1000, "ustack_ml0", ["memleak"]),
}


def one_run(python: str, command: str, on: bool) -> tuple:
    mode, rounds, name, args = COMMANDS[command]
    with tempfile.TemporaryDirectory() as tmp:
        cmd = f"{python} {WAITS} {mode} {tmp}/facts {rounds}"
        argv = [*args, *([] if on else ["--no-python"]), "-c", cmd]
        out = subprocess.run([sys.executable, "-c", ONE_RUN, name, *argv],
                             capture_output=True, text=True, timeout=300, cwd=REPO,
                             env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    if out.returncode not in (0, 3):
        raise SystemExit(out.stderr)
    runs, ns = out.stdout.split()
    return int(runs), float(ns)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--python", default="3.12")
    a = ap.parse_args()
    found = sorted(glob.glob(f"/root/.pyenv/versions/{a.python}.*/bin/python3"))
    python = found[-1] if found else sys.exit(f"no CPython {a.python} under pyenv")
    print(f"CPython {a.python}; the stack-walking program's runs and ns per run, "
          f"median of {a.reps} (offcpu's program runs at every switch of the machine, "
          "walking only the target's)")
    print()
    print("| command | rounds | runs | ns/run, --no-python | ns/run, Python frames "
          "| added ns/run |")
    print("|---|---:|---:|---:|---:|---:|")
    for command, (_mode, rounds, _name, _args) in COMMANDS.items():
        off, on, runs = [], [], []
        for _ in range(a.reps):
            off.append(one_run(python, command, False)[1])
            n_on, ns_on = one_run(python, command, True)
            on.append(ns_on)
            runs.append(n_on)
        m_off, m_on = statistics.median(off), statistics.median(on)
        print(f"| {command} | {rounds} | {int(statistics.median(runs))} "
              f"| {m_off:.0f} | {m_on:.0f} | {m_on - m_off:+.0f} |")


if __name__ == "__main__":
    main()
