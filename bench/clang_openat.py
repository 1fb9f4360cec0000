#!/usr/bin/env python3
"""clang++-14's openat(2) stacks, ustack against gdb: the same compile
(big_objects.py's template-heavy file, -O2), traced by
`ustack trace syscall:openat -c` (TRIES: the in-kernel walk, and perf's
stack copies), and run under gdb with
`catch syscall openat` and `bt` at each call. The compile opens the same
files in the same order every time (its headers, its libraries), so the
n-th event of one is the n-th of the other. Per tool: the events, those
whole (the outermost frame _start, no cut note, no [unknown] frame); and
the events whose frames are gdb's frame for frame (same_as_gdb; gdb's
inlined frames left out: ustack shows them with --inlines only).

    sudo python3 bench/clang_openat.py [--rounds N]

Prints Markdown."""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from big_objects import CLANG, CUT, SOURCE, ustack_cmd  # noqa: E402

# GCC's clones keep their function's DWARF name in gdb: open_verify.constprop.0
CLONE = re.compile(r"\.(?:constprop|isra|part|cold)(?:\.\d+)*")
# one address, several names: glibc's aliases differ by leading
# underscores, an internal __GI_ prefix or an _impl suffix (__opendir and
# opendir, __libc_start_main_impl and __libc_start_main)
GLIBC_ALIAS = re.compile(r"^(?:__GI_)?_*|_impl$")
# the default (the in-kernel walk), and the stack copies of --backend perf
# at their default 8 KiB and at the most
TRIES = (("--backend", "bpf"), ("--backend", "perf"),
         ("--backend", "perf", "--stack-size", "65528"))
SRC = Path(__file__).resolve().parent.parent / "src"
# "#3  0x00007ffff7fd21e3 in _dl_map_object (loader=...) at ...": an
# inlined call's caller is printed without the address (the callee's)
GDB_FRAME = re.compile(r"^#(\d+)\s+(0x[0-9a-f]+ in )?(.+?) \(")


def compile_cmd(work: Path) -> list:
    return [CLANG, "-O2", "-std=c++17", "-c", str(work / "heavy.cpp"), "-o",
            str(work / "heavy.o")]


def ustack_events(work: Path, *args) -> list:
    """Each openat event of the compile traced with `args` (a backend, a
    stack size): (functions innermost first, notes)."""
    out = work / "ustack.json"
    cmd, env = ustack_cmd(SRC, "trace", "syscall:openat", *args,
                          "-f", "json", "-o", str(out), "-c", " ".join(compile_cmd(work)))
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    events = []
    for line in out.read_text().splitlines():
        e = json.loads(line)
        events.append(([f["function"] or f"[{f['module']}]" for f in e["frames"]],
                       e.get("notes") or []))
    return events


def gdb_events(work: Path) -> list:
    """Each openat call of the compile under gdb: its bt's functions,
    innermost first (a catchpoint stops at the call's entry and its return:
    the entries only)."""
    script = work / "gdb.cmd"
    script.write_text("set pagination off\nset print frame-arguments none\n"
                      "set print entry-values no\nset backtrace past-main on\n"
                      "catch syscall openat\n"
                      "commands\nsilent\nbt\ncontinue\nend\nrun\n")
    res = subprocess.run(["gdb", "-batch", "-nx", "-x", str(script), "--args",
                          *compile_cmd(work)], capture_output=True, text=True)
    events, current = [], None
    for line in res.stdout.splitlines():
        m = GDB_FRAME.match(line)
        if not m:
            continue
        if m.group(1) == "0":
            current = []
            events.append(current)
        if current is None:
            continue
        if m.group(2) is None and m.group(1) != "0":
            current.pop()           # the frame before was inlined into this one
        current.append(m.group(3))
    # gdb walks on past _start into the arguments' words: cut there
    events = [e[:e.index("_start") + 1] if "_start" in e else e for e in events]
    return events[::2]      # entry, return, entry, ...: the entries


def whole(functions: list, notes=()) -> bool:
    return bool(functions) and functions[-1] == "_start" and not any(
        CUT.search(f) for f in functions) and not any(CUT.search(n) for n in notes)


def same_as_gdb(ours: list, gdb: list) -> bool:
    """ustack's frames are gdb's: the same functions outermost to innermost
    (C++ names without their arguments, GCC's clones by their function's
    name, a function neither names, ustack's `[module]`, gdb's `??`, as
    one); the innermost by its place only: the syscall's wrapper has
    aliases (ustack's `open` is gdb's `__libc_open64`); glibc's aliases
    as one (GLIBC_ALIAS)."""
    def base(name: str) -> str:
        if name == "??" or name.startswith("["):
            return "?"
        name = CLONE.sub("", name.replace("(anonymous namespace)", ""))
        name = name.split("(")[0].replace(" ", "")
        return GLIBC_ALIAS.sub("", name)
    return len(ours) == len(gdb) and [base(f) for f in ours[1:]] == [base(f) for f in gdb[1:]]


def one_round(work: Path) -> list:
    gdb = gdb_events(work)
    rows = [("gdb", len(gdb), sum(whole(e) for e in gdb), None)]
    for args in TRIES:
        ours = ustack_events(work, *args)
        same = sum(same_as_gdb(o, g) for (o, _n), g in zip(ours, gdb))
        rows.append((f"ustack {' '.join(args)}", len(ours),
                     sum(whole(f, n) for f, n in ours), same))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()
    print(f"# clang++-14 -O2's openat(2) stacks against gdb ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
          f"load {os.getloadavg()[0]:.1f})\n")
    print("| round | tool | events | whole to _start | frames equal to gdb's |")
    print("| --- | --- | ---: | ---: | ---: |")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "heavy.cpp").write_text(SOURCE)
        for n in range(1, args.rounds + 1):
            for tool, events, whole_n, same in one_round(work):
                print(f"| {n} | {tool} | {events} | {whole_n} | "
                      f"{'-' if same is None else same} |", flush=True)


if __name__ == "__main__":
    main()
