#!/usr/bin/env python3
"""What the Ruby, PHP and Perl passes (src/ustack/bpf/ruby.h, php.h,
perl.h) cost per event in the commands whose stacks stay in the kernel:
`offcpu`, `latency --by-stack` and `memleak` of tests/programs/
{ruby,php,perl}/waits.* (a known chain whose leaf sleeps a millisecond
and keeps a 64 KiB block, N times), with the runtime's frames and with
its --no-… flag, interleaved; and of a shell's sleeps (no interpreter of
these: what a process running none pays). The stack-walking program's ns
per run comes from the kernel's BPF statistics, as in
bench/python_pass_cost.py (its ONE_RUN).

    sudo python3 bench/script_pass_cost.py [--reps R] [--times N]

Prints Markdown; medians of R runs."""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

from python_pass_cost import ONE_RUN  # noqa: E402 (bench/ is this script's path)

REPO = Path(__file__).resolve().parent.parent
PROGRAMS = REPO / "tests" / "programs"
# runtime: (command line before N, its --no-… flag, the libc function its sleep enters)
SCRIPTS = {
    "ruby": (f"ruby {PROGRAMS / 'ruby' / 'waits.rb'}", "--no-ruby", "ppoll"),
    "php": (f"php {PROGRAMS / 'php' / 'waits.php'}", "--no-php", "usleep"),
    "perl": (f"perl {PROGRAMS / 'perl' / 'waits.pl'}", "--no-perl", "select"),
}
# command: (the stack-walking program's name, ustack args before -c; {f}: the sleep's function)
COMMANDS = {
    "offcpu": ("ustack_off0", ["offcpu"]),
    "latency --by-stack": ("ustack_lat0", ["latency", "--by-stack", "uprobe:libc:{f}"]),
    "memleak": ("ustack_ml0", ["memleak"]),
}


def one_run(name: str, argv: list) -> tuple:
    # PHP's blocks from malloc (its own allocator's come from trimmed mmaps)
    out = subprocess.run([sys.executable, "-c", ONE_RUN, name, *argv],
                         capture_output=True, text=True, timeout=300, cwd=REPO,
                         stdin=subprocess.DEVNULL,
                         env={**os.environ, "PYTHONPATH": str(REPO / "src"),
                              "USE_ZEND_ALLOC": "0"})
    if out.returncode not in (0, 3):
        raise SystemExit(out.stderr)
    runs, ns = out.stdout.split()[-2:]
    return int(runs), float(ns)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--times", type=int, default=200)
    a = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f}; waits.* {a.times} times; medians of "
          f"{a.reps}, interleaved\n")
    print("| command | process | pass | runs | ns per run, on | off | on - off |")
    print("|---|---|---|---:|---:|---:|---:|")
    shell = f"sh -c 'for i in $(seq {a.times}); do sleep 0.001; done'"
    for command, (name, args) in COMMANDS.items():
        cases = [(rt, f"{line} {a.times}", flag, fn)
                 for rt, (line, flag, fn) in SCRIPTS.items()]
        if command != "latency --by-stack":
            cases.append(("sh + sleep (none of them)", shell, "--no-ruby --no-php --no-perl",
                          "nanosleep"))
        for label, line, flag, fn in cases:
            on, off = [], []
            for _ in range(a.reps):
                argv = [x.format(f=fn) for x in args]
                on.append(one_run(name, [*argv, "-c", line]))
                off.append(one_run(name, [*argv, *flag.split(), "-c", line]))
            ns_on = statistics.median(r[1] for r in on)
            ns_off = statistics.median(r[1] for r in off)
            runs = statistics.median(r[0] for r in on)
            print(f"| {command} | {label} | {flag.replace('--no-', '')} | {runs:.0f} | {ns_on:.0f} | "
                  f"{ns_off:.0f} | {ns_on - ns_off:.0f} |")


if __name__ == "__main__":
    main()
