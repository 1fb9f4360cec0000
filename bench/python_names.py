#!/usr/bin/env python3
"""Python frames' names and depth, next to py-spy, and what naming code
objects by id costs per sample.

    sudo python3 bench/python_names.py [--old SRC] [--src SRC] [--reps R] [--pythons 3.11,3.12]
                                       [--no-depth] [--no-names] [--per-sample-only]

1. names: tests/programs/python/throwaway.py (functions compiled, run and
   freed, each with a name and first line of its own) under `ustack trace
   syscall:getppid`: each event's leaf frame against the program's own
   record of what ran; then profiled (-F 999) by ustack and by py-spy,
   where a frame named thrown_I whose line lies outside thrown_I's lines
   is wrongly named. Non-printable characters in every output counted.
2. depth: tests/programs/python/deep.py, recursion 1,000 deep spinning at
   the bottom, profiled by both at 99 Hz: samples holding `main` and
   `<module>`, of all its samples.
3. per sample: bench/python_walk.py's measure (BPF run_time_ns / run_cnt
   of the unwinder programs, profile -F 999 of frames.py busy) for this
   tree's src and --old's, interleaved A B B A.

Prints Markdown."""
from __future__ import annotations

import argparse
import glob
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "tests"))
import python_walk  # noqa: E402

PROGRAMS = REPO / "tests" / "programs" / "python"
THROWAWAY, DEEP, FRAMES = PROGRAMS / "throwaway.py", PROGRAMS / "deep.py", PROGRAMS / "frames.py"
SPY = Path(sys.executable).parent / "py-spy"
NOT_READ = "[python code, not read]"
THROWN = re.compile(r"thrown_(\d+)")


def pythons(wanted: list) -> list:
    found = python_walk.pythons(wanted)
    if os.path.exists("/usr/bin/python3.11"):
        found.append(("debian-3.11", "/usr/bin/python3.11"))
    return found


def env(src: Path) -> dict:
    return dict(os.environ, PYTHONPATH=str(src))


def ustack(src: Path, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ustack", *args], env=env(src),
                          capture_output=True, text=True, timeout=600)


def unprintable(text: str) -> int:
    return sum(1 for c in text if not (c.isprintable() or c == "\n"))


def thrown_lines(i: int) -> range:
    """The lines of thrown_I (throwaway.py: its def after i % 97 blank lines)."""
    first = i % 97 + 1
    return range(first, first + 6)


def names_by_trace(src: Path, py: str, n: int) -> tuple:
    """(events, wrong, not read, unprintable) of a trace of n functions."""
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "ran"
        res = ustack(src, "trace", "syscall:getppid", "-c", f"{py} {THROWAWAY} {n} {log}")
        ran = log.read_text().split()
    wrong = unread = 0
    # each event's Python frames' names, read leniently: an older tree
    # may write what a strict parser refuses
    records = [[m[1] for m in re.finditer(r"^ {20}: (.*) \[python\]", block, re.M)]
               for block in res.stdout.split("\n\n") if block.strip()]
    for want, names in zip(ran, records):
        if not names:
            continue
        leaf = names[0]
        unread += leaf == NOT_READ or leaf.startswith("[python code")
        wrong += leaf != want and not leaf.startswith("[python code")
    return len(records), wrong, unread, unprintable(res.stdout + res.stderr)


def folded_wrong(lines: list, line_of) -> tuple:
    """(thrown_ frames, those whose line is not their function's) in folded
    lines; line_of(frame) -> (name, line) or None."""
    frames = wrong = 0
    for text in lines:
        stack, _, count = text.rpartition(" ")
        for frame in stack.split(";"):
            parsed = line_of(frame)
            if parsed is None:
                continue
            name, line = parsed
            m = THROWN.fullmatch(name)
            if not m:
                continue
            frames += int(count)
            wrong += int(count) * (line not in thrown_lines(int(m[1])))
    return frames, wrong


def _ustack_frame(frame: str):
    # folded: "thrown_12_[python]_throwaway.py:15"? ustack writes py-spy's raw form
    m = re.fullmatch(r"(\S+?) \((?:.*/)?throwaway\.py:(\d+)\)", frame)
    return (m[1], int(m[2])) if m else None


def names_by_profile(src: Path, py: str, n: int, spin: int) -> tuple:
    """(ustack: thrown frames, wrong; py-spy: thrown frames, wrong; unprintable)."""
    with tempfile.TemporaryDirectory() as tmp:
        log, out, spy = Path(tmp) / "ran", Path(tmp) / "u.folded", Path(tmp) / "s.txt"
        cmd = f"{py} {THROWAWAY} {n} {log} 0 {spin}"
        res = ustack(src, "profile", "-F", "999", "-o", str(out), "-f", "folded", "-c", cmd)
        ours = out.read_text().splitlines()
        subprocess.run([str(SPY), "record", "-r", "999", "-f", "raw", "-o", str(spy), "--",
                        *cmd.split()], capture_output=True, timeout=600, check=True)
        theirs = spy.read_text().splitlines()
    a = folded_wrong(ours, _ustack_frame)
    b = folded_wrong(theirs, _ustack_frame)
    return a, b, unprintable("\n".join(ours) + res.stderr)


def depth_totals(src: Path, py: str, seconds: float) -> tuple:
    """(ustack: samples, with dive, with main and <module>; py-spy: the
    same). All the program's samples count: one whose chain is cut short
    (a note instead of dive) lacks main and <module> as much as any."""
    with tempfile.TemporaryDirectory() as tmp:
        out, spy = Path(tmp) / "u.folded", Path(tmp) / "s.txt"
        cmd = f"{py} {DEEP} 1000 0 {seconds}"
        ustack(src, "profile", "-F", "99", "-o", str(out), "-f", "folded", "-c", cmd)
        subprocess.run([str(SPY), "record", "-r", "99", "-f", "raw", "-o", str(spy), "--",
                        *cmd.split()], capture_output=True, timeout=600, check=True)
        return tuple(_deep_share(p.read_text().splitlines()) for p in (out, spy))


def _deep_share(lines: list) -> tuple:
    every = total = whole = 0
    for text in lines:
        stack, _, count = text.rpartition(" ")
        every += int(count)
        if "dive" not in stack:
            continue
        names = [f.split(" (")[0] for f in stack.split(";")]
        total += int(count)
        whole += int(count) * ("main" in names and "<module>" in names)
    return every, total, whole


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", type=Path, help="another tree's src/ for the per-sample A/B")
    ap.add_argument("--reps", type=int, default=4)
    ap.add_argument("--pythons", default="3.9,3.10,3.11,3.12,3.13")
    ap.add_argument("--functions", type=int, default=2000)
    ap.add_argument("--per-sample-only", action="store_true")
    ap.add_argument("--no-depth", action="store_true", help="names only (the depth part is slow)")
    ap.add_argument("--no-names", action="store_true", help="depth only")
    ap.add_argument("--depth-runs", type=int, default=1, help="runs of the depth part per version")
    ap.add_argument("--depth-seconds", type=float, default=3.0,
                    help="CPU seconds the recursion spins at its bottom")
    ap.add_argument("--src", type=Path, default=REPO / "src", help="the tree's src/ to run")
    args = ap.parse_args()
    src = args.src
    found = pythons(args.pythons.split(","))

    if not args.per_sample_only:
        names_and_depth(args, src, found)
    if args.old:
        per_sample(args, src, found)
    return 0


def names_and_depth(args, src: Path, found: list) -> None:
    if not args.no_names:
        names_table(args, src, found)
    if args.no_depth:
        return
    print(f"\n## Depth: recursion 1,000, profile at 99 Hz, {args.depth_seconds:g} s\n")
    print("| CPython | ustack samples | with dive | with main and <module> | py-spy samples "
          "| with dive | with main and <module> |")
    print("|---|---|---|---|---|---|---|")
    for _run in range(args.depth_runs):
        for v, py in found:
            (ua, ut, uw), (sa, st, sw) = depth_totals(src, py, args.depth_seconds)
            print(f"| {v} | {ua} | {ut} | {uw} ({uw / max(ua, 1):.0%}; {uw / max(ut, 1):.0%} "
                  f"of those with dive) | {sa} | {st} | {sw} ({sw / max(sa, 1):.0%}; "
                  f"{sw / max(st, 1):.0%}) |", flush=True)


def names_table(args, src: Path, found: list) -> None:
    print("## Names: throwaway functions\n")
    print("| CPython | trace: events | named after another | not read | non-printable "
          "| profile: ustack thrown_ frames | wrong line | py-spy thrown_ frames | wrong line |")
    print("|---|---|---|---|---|---|---|---|---|")
    for v, py in found:
        events, wrong, unread, bad = names_by_trace(src, py, args.functions)
        (uf, uw), (sf, sw), bad2 = names_by_profile(src, py, 300, 20000)
        print(f"| {v} | {events} | {wrong} | {unread} | {bad + bad2} | {uf} | {uw} | {sf} | {sw} |",
              flush=True)


def per_sample(args, src: Path, found: list) -> None:
    if True:
        print("\n## Per sample: unwinder programs' ns per run, profile -F 999 frames.py busy\n")
        print("| CPython | before (--old) | after | after - before |")
        print("|---|---|---|---|")
        for v, py in found:
            cmd = f"{py} {FRAMES} busy 2"
            runs: dict = {"old": [], "new": []}
            for rep in range(args.reps):
                for which in (("old", "new") if rep % 2 == 0 else ("new", "old")):
                    tree = args.old if which == "old" else src
                    out = subprocess.run([sys.executable, "-c", python_walk.PER_SAMPLE, cmd,
                                          "on"], env=env(tree), capture_output=True, text=True,
                                         timeout=120, check=True).stdout.split()
                    runs[which].append(float(out[-1]))
            a, b = statistics.median(runs["old"]), statistics.median(runs["new"])
            print(f"| {v} | {a:.0f} ns | {b:.0f} ns | {b - a:+.0f} ns ({b / a - 1:+.0%}) |")


if __name__ == "__main__":
    sys.exit(main())
