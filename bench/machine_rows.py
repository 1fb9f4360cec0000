#!/usr/bin/env python3
"""Kernel memory of a whole-machine run while clang++-14 (compiling
bench/big_objects.py's template-heavy file, restarted as it ends),
a headless chromium (a page spinning in JS), node and java (spinning)
run: the memlock of ustack's BPF maps, read from its map fds' fdinfo while
it runs (the largest seen), the room of its row table (its header: the
bound; the rows made, where the table grows in chunks: the header's and
the closing note's), the
objects whose rows did not fit (its notes), and how many of clang's
samples reach _start, for this tree and another (--before DIR/src).
--small: the same memory of a -p run of a small C program (a loop in
main, libc) on a quiet machine, the trees alternated.

(--stack-size 65528: as bench/big_objects.py's whole-machine run, so
that clang's deep stacks deferred while their rows load are whole.)

    sudo python3 bench/machine_rows.py [--rounds N] [--before DIR/src] [--small]

Prints Markdown and adds it to bench/results/machine_rows.md (a dated section)."""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
from big_objects import folded_share, map_memory  # noqa: E402
from cold_start import Targets  # noqa: E402

SECONDS = "5"
JAVA = """public class Spin { public static void main(String[] a) {
    double s = 0; for (long i = 0; ; i++) { s += Math.sqrt(i); if (i % 100000000 == 0)
    System.out.println("ready"); } } }"""


class Machine(Targets):
    """clang++ kept compiling, chromium, node and java."""

    def __init__(self, work: Path):
        super().__init__(work)
        (work / "Spin.java").write_text(JAVA)
        self._stop = threading.Event()

    def clang_loop(self) -> None:
        self.clang()
        threading.Thread(target=self._again, daemon=True).start()

    def _again(self) -> None:
        while not self._stop.is_set():
            p = self.procs[0]
            p.wait()
            if self._stop.is_set():
                return
            self.procs[0] = subprocess.Popen(["clang++-14", "-O2", "-std=c++17", "-c",
                                              str(self.work / "heavy.cpp"), "-o", "/dev/null"])

    def java(self) -> int:
        p = subprocess.Popen(["java", str(self.work / "Spin.java")], stdout=subprocess.PIPE,
                             text=True)
        self.procs.append(p)
        p.stdout.readline()
        return p.pid

    def close(self) -> None:
        self._stop.set()
        super().close()


def one_run(src: str, cache: str, out: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=src, USTACK_CACHE_DIR=cache)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    us = subprocess.Popen([sys.executable, "-m", "ustack", "profile", "-F", "99", "-d", SECONDS,
                           "--stack-size", "65528", "-f", "folded", "-o", str(out)],
                          env=env, stderr=subprocess.PIPE, text=True)
    header = us.stderr.readline()
    peak = 0
    while us.poll() is None:
        peak = max(peak, map_memory(us.pid))
        time.sleep(0.2)
    rest = us.stderr.read()
    room = table_room(header, rest)
    full = re.search(r"(\d+) objects?'s? unwind rows did not fit the in-kernel table "
                     r"\(([\d.]+) MiB: ([^)]*)\)", header + rest)
    whole, total = folded_share(out)
    loaded = re.search(r"Unwind rows of (\d+) objects were loaded during the run[^(\n]*"
                       r"(?:\((\d+) more were wanted)?", rest)
    return {"peak": peak, "room": room,
            "loaded": (f"{loaded[1]}" + (f" ({loaded[2]} wanted)" if loaded[2] else "")
                       if loaded else "0"),
            "full": f"{full[1]} ({full[3]})" if full else "0",
            "whole": whole, "total": total}


def table_room(header: str, rest: str) -> str:
    """The row table's MiB as the run tells it: "bound / made" where it
    grows in chunks (made: at the end), else the table made whole."""
    room = re.search(r"room for (\d+) MiB", header)
    if room is None:
        return "16 (fixed)"
    made = re.search(r"; (\d+) MiB made", header)
    if made is None:
        return room[1]
    grew = re.search(r"unwind table grew from [\d.]+ to ([\d.]+) MiB", rest)
    return f"{room[1]} / {grew[1] if grew else made[1]}"


SMALL = r"""
#include <stdio.h>
#include <unistd.h>
static volatile unsigned long sink;
int main(void)
{
	printf("ready\n");
	fflush(stdout);
	for (;;)
		sink = sink * 31 + getpid();
}
"""


def small_run(src: str, cache: str, prog: Path) -> dict:
    """A -p profile of the small program: its maps' memlock at the
    largest, its notes."""
    target = subprocess.Popen([str(prog)], stdout=subprocess.PIPE, text=True)
    try:
        target.stdout.readline()
        env = dict(os.environ, PYTHONPATH=src, USTACK_CACHE_DIR=cache)
        us = subprocess.Popen([sys.executable, "-m", "ustack", "profile", "-F", "99", "-d", "2",
                               "-p", str(target.pid), "-f", "folded", "-o", "/dev/null"],
                              env=env, stderr=subprocess.PIPE, text=True)
        us.stderr.readline()
        peak = 0
        while us.poll() is None:
            peak = max(peak, map_memory(us.pid))
            time.sleep(0.05)
        us.stderr.read()
    finally:
        target.kill()
        target.wait()
    return {"peak": peak}


def small(trees: list, rounds: int) -> None:
    work = Path(tempfile.mkdtemp(prefix="machine_rows"))
    rows = []
    try:
        (work / "small.c").write_text(SMALL)
        prog = work / "small"
        subprocess.run(["cc", "-O2", "-o", str(prog), str(work / "small.c")], check=True)
        for tree, src in trees:         # rows cached
            small_run(src, str(work / "cache"), prog)
        for rnd in range(1, rounds + 1):
            for tree, src in trees:
                r = small_run(src, str(work / "cache"), prog)
                rows.append(f"| {rnd} | {tree} | {r['peak'] / (1 << 20):.1f} |")
                print(rows[-1], file=sys.stderr)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    load = os.getloadavg()
    print("\n".join([
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, kernel {os.uname().release}, "
        f"load average at the end {load[0]:.1f}. `python3 bench/machine_rows.py --small`: "
        "`ustack profile -F 99 -d 2 -p PID` of a C loop (main, libc), the trees alternated, "
        "rows cached first; the memlock of ustack's BPF maps at the largest.", "",
        "| round | tree | all maps (MiB) |", "| --- | --- | --- |", *rows, ""]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--before", help="another tree's src/")
    ap.add_argument("--small", action="store_true",
                    help="a -p run of a small C program, printed only")
    a = ap.parse_args()
    trees = [("this tree", str(REPO / "src"))] + ([("before", a.before)] if a.before else [])
    if a.small:
        small(trees, a.rounds)
        return
    work = Path(tempfile.mkdtemp(prefix="machine_rows"))
    cache = str(work / "cache")
    machine = Machine(work)
    rows = []
    try:
        machine.clang_loop()
        machine.chromium()
        machine.node()
        machine.java()
        for _warm in range(2):          # rows and symbols of what is sampled cached
            one_run(trees[0][1], cache, work / "warm.folded")
        for rnd in range(1, a.rounds + 1):
            for tree, src in trees:
                r = one_run(src, cache, work / "out.folded")
                share = 100 * r["whole"] / r["total"] if r["total"] else 0
                rows.append(f"| {rnd} | {tree} | {r['room']} | {r['peak'] / (1 << 20):.1f} | "
                            f"{r['loaded']} | {r['full']} | "
                            f"{r['whole']} / {r['total']} ({share:.1f} %) |")
                print(rows[-1], file=sys.stderr)
    finally:
        machine.close()
        shutil.rmtree(work, ignore_errors=True)
    load = os.getloadavg()
    text = "\n".join([
        "# Kernel memory of a whole-machine run with clang++, chromium, node and java running",
        "", f"{time.strftime('%Y-%m-%d')}, kernel {os.uname().release}, {os.cpu_count()} CPUs "
        f"shared (load average at the end {load[0]:.1f}). `python3 bench/machine_rows.py`: "
        f"`ustack profile -F 99 -d {SECONDS} --stack-size 65528` of the whole machine, its cache "
        "warmed by two runs first. Memory: the memlock of ustack's BPF maps (each map once), "
        "the largest seen while it ran. Clang's samples reach a root when their outermost frame is _start and "
        "no frame is a cut note.", "",
        "| round | tree | row table (MiB) | all maps (MiB) | objects loaded as sampled | "
        "objects that did not fit | clang samples reaching a root |",
        "| --- | --- | --- | --- | --- | --- | --- |", *rows, ""])
    print(text)
    results = REPO / "bench" / "results" / "machine_rows.md"
    if results.exists():                # a dated section after the earlier ones
        text = results.read_text() + "\n## " + text.removeprefix("# ") + "\n"
    results.write_text(text)


if __name__ == "__main__":
    main()
