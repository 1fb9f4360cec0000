#!/usr/bin/env python3
"""Java frames kept by a recording: the share of a JVM's samples that are
whole (to the thread's root, clone3, every Java frame named) when
`ustack record` saves the run and `ustack report` names it later, the JVM
gone, beside a direct `ustack profile` of the same program.

bench/programs/JavaMix.java (default flags, no perf map; its second half
runs methods first called then, compiled while the run samples) runs
for SECONDS of CPU under -c, at 199 Hz, backend bpf; only the thread that
runs main is judged (its stacks through JavaMain), as bench/java_frames.py
judges it. Runs alternate: profile, record + report, REPS times.

    sudo python3 bench/java_recorded.py [--seconds S] [--reps R]

Prints Markdown."""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from java_frames import MIX, REPO, ustack_counts, ustack_shares  # noqa: E402


def recorded_counts(command: str, path: str) -> list:
    """The counted stacks of `ustack record -c COMMAND`, read back from
    the file once the JVM has exited (as `ustack report` reads them)."""
    import ustack
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    subprocess.run([sys.executable, "-m", "ustack", "record", "profile:hz:199", "--backend",
                    "bpf", "-o", path, "-c", command], env=env, check=True,
                   capture_output=True)
    with ustack.Session.replay(path) as run:
        return run.counts()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="ustack-java-rec-")
    try:
        subprocess.run(["javac", "-d", tmp, str(MIX)], check=True)
        command = f"java -cp {tmp} JavaMix {args.seconds:g}"
        rows: dict = {"profile -c (direct)": [], "record -c, then report": []}
        for rep in range(args.reps):
            rows["profile -c (direct)"].append(ustack_shares(ustack_counts(cmdline=command)))
            rows["record -c, then report"].append(ustack_shares(recorded_counts(
                command, os.path.join(tmp, f"mix{rep}.ustack"))))
        print(f"JavaMix for {args.seconds:g} s of CPU, profile:hz:199, backend bpf, load "
              f"average {os.getloadavg()[0]:.1f} at the end\n")
        print("| how | main's Java samples whole, named to clone3 (each run) |")
        print("|---|---|")
        for how, runs in rows.items():
            cells = ", ".join(f"{whole}/{java} ({100 * whole / max(java, 1):.1f} %)"
                              for java, whole, _stub, _top in runs)
            print(f"| {how} | {cells} |")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
