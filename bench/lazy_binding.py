"""Stacks through ld.so's lazy-binding resolver against gdb: a program
that binds lazily (Debian's objdump: not -z now) runs under gdb, which
prints `bt` at every hit of _dl_fixup (the resolver's callee; the
resolver's CFA is rbx-based), and under `ustack trace
uprobe:ld.so:_dl_fixup -f json` on each backend, with this checkout's src/
and, if given, another's (`git archive BASE src`), all with address
randomization off, so the N-th hit is the same event in every run.

Per event: *equal* (gdb's addresses), *noted* (differs, with a note),
*unmarked cut* (a prefix of gdb's, no note), *bogus* (other frames than
gdb's, no note), against the gdb stack most like it (gdb's stacks with
non-addresses in them, where its own walk went astray, are left out);
and how many carry a frame-pointer note (there is CFI all along: such a
note is false). gdb's frames are its real ones: not the frames it infers
for tail calls and inlined calls.

    sudo .venv/bin/python bench/lazy_binding.py [--other DIR] [--out FILE]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
LDSO = "/lib64/ld-linux-x86-64.so.2"
PROBE = "_dl_fixup"
PROGRAM = ["/usr/bin/objdump", "-d", "/usr/bin/true"]
BACKENDS = ("bpf", "perf")


def norandom(argv: list) -> list:
    return ["setarch", "-R", *argv]


# gdb's own frames only: the call sites it infers for tail calls (DWARF
# call-site entries) and inlined calls are not frames of the machine stack
_GDB_PY = """
import gdb
OUT = open(%r, "w")


class Hit(gdb.Breakpoint):
    def stop(self):
        pcs, f = [], gdb.newest_frame()
        while f is not None and len(pcs) < 256:
            if f.type() not in (gdb.INLINE_FRAME, gdb.TAILCALL_FRAME):
                pcs.append(f.pc())
            f = f.older()
        OUT.write(" ".join(map(str, pcs)) + chr(10))
        return False


gdb.execute("set pagination off")
gdb.execute("set breakpoint pending on")
gdb.execute("set backtrace past-main on")
gdb.execute("set backtrace past-entry on")
Hit(%r)
gdb.execute("run " + %r + " > /dev/null")
OUT.close()
"""


def gdb_stacks(argv: list, work: Path) -> list:
    """gdb's pcs, innermost first, at each hit of PROBE."""
    script, out = work / "bt.py", work / "gdb.txt"
    script.write_text(_GDB_PY % (str(out), PROBE, " ".join(shlex.quote(a) for a in argv[1:])))
    subprocess.run(["gdb", "-q", "-batch", "-nx", "-iex", "set debuginfod enabled off",
                    "-x", str(script), argv[0]], capture_output=True, text=True,
                   stdin=subprocess.DEVNULL, timeout=900)
    return [[int(p) for p in line.split()] for line in out.read_text().splitlines()]


def ustack_stacks(src: Path, backend: str, argv: list, work: Path) -> list:
    """(pcs innermost first, notes) per event of `ustack trace` from src."""
    out = work / f"{backend}.{abs(hash(str(src)))}.json"
    env = dict(os.environ, PYTHONPATH=str(src))
    subprocess.run([sys.executable, "-m", "ustack", "trace", f"uprobe:{LDSO}:{PROBE}",
                    "--backend", backend, "--unwind", "dwarf", "-f", "json", "-o", str(out),
                    "-c", " ".join(shlex.quote(a) for a in norandom(argv))],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                   check=True, timeout=900)
    stacks = []
    for line in out.read_text().splitlines():
        rec = json.loads(line)
        frames = [f for f in rec["frames"] if not f.get("kernel") and not f.get("inlined")]
        if any(f.get("module") == "setarch" for f in frames):   # before its exec
            continue
        stacks.append(([int(f["address"], 16) for f in frames if f.get("address")],
                       tuple(rec.get("notes", ()))))
    return stacks


def judge(mine: tuple, gdb: list) -> str:
    """mine against the gdb stack most like it (ustack also sees the hits
    of setarch, which gdb does not run: events are not matched by order)."""
    pcs, notes = mine

    def shared(other):
        n = 0
        while n < min(len(pcs), len(other)) and pcs[n] == other[n]:
            n += 1
        return n
    like = max(gdb, key=lambda g: (g == pcs, shared(g)))
    if pcs == like:
        return "equal"
    if notes:
        return "noted"
    return "unmarked cut" if like[:len(pcs)] == pcs else "bogus"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--other", type=Path, help="another checkout (its src/) to compare with")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    srcs = {"this": HERE.parent / "src"}
    if args.other:
        srcs["other"] = args.other / "src"
    lines = [f"`{' '.join(PROGRAM)}`, uprobe on ld.so's {PROBE}, against gdb's bt at "
             "each hit (address randomization off)", "",
             "| src | backend | events | equal | noted | unmarked cut | bogus | "
             "frame-pointer note |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        gdb = gdb_stacks(PROGRAM, work)
        # gdb's own walk goes astray once (non-addresses after a libc frame):
        # no oracle for that event
        astray = [g for g in gdb if any(p < 0x10000 for p in g)]
        gdb = [g for g in gdb if g not in astray]
        for name, src in srcs.items():
            for backend in BACKENDS:
                mine = ustack_stacks(src, backend, PROGRAM, work)
                verdicts = [judge(m, gdb) for m in mine]
                fp = sum(any(n.startswith("frame pointer used") for n in m[1]) for m in mine)
                lines.append(f"| {name} | {backend} | {len(mine)} "
                             f"(gdb {len(gdb)} + {len(astray)} astray) | "
                             + " | ".join(str(verdicts.count(v)) for v in
                                          ("equal", "noted", "unmarked cut", "bogus"))
                             + f" | {fp} |")
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
