"""Does each `profile --every 1` file hold no more CPU time than its
stated duration allows? A whole-machine run, -F 99, -d 6; ustack is held
still (SIGSTOP) for 2.5 s from 1.5 s in, so it reads a backlog when it
goes on, as on a loaded machine or while unwind rows are built. Each file:
its duration, its samples as CPU-seconds, and their ratio (at most the
machine's CPUs when every sample is in the interval it was taken in).

    python bench/every_intervals.py [--src DIR] [ustack options...]

--src: the ustack tree to run (another checkout, to compare)."""
from __future__ import annotations

import gzip
import os
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
HZ = 99


def main() -> None:
    args = sys.argv[1:]
    src = os.path.join(HERE, "..", "src")
    if args[:1] == ["--src"]:
        src, args = args[1], args[2:]
    sys.path.insert(0, os.path.join(HERE, "..", "src"))
    from ustack.report.pprof_proto import Profile
    with tempfile.TemporaryDirectory() as out:
        run = subprocess.Popen(
            [sys.executable, "-m", "ustack", "profile", "-F", str(HZ), "--every", "1",
             "-d", "6", "-o", out + "/", *args], env=dict(os.environ, PYTHONPATH=src),
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        run.stderr.readline()                   # Tracing ...: live
        time.sleep(1.5)
        run.send_signal(signal.SIGSTOP)
        time.sleep(2.5)
        run.send_signal(signal.SIGCONT)
        run.communicate()
        print(f"| file | duration s | samples | CPU-s | CPUs (machine: {os.cpu_count()}) |")
        print("|---|---:|---:|---:|---:|")
        for name in sorted(os.listdir(out)):
            with open(os.path.join(out, name), "rb") as f:
                profile = Profile.FromString(gzip.decompress(f.read()))
            n = sum(s.value[0] for s in profile.sample)
            seconds = profile.duration_nanos / 1e9
            print(f"| {name} | {seconds:.3f} | {n} | {n / HZ:.2f} | {n / HZ / seconds:.2f} |")


if __name__ == "__main__":
    main()
