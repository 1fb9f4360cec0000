"""Held-out programs against the oracles: every stack ustack gives for a
program the tests never built must equal gdb's and perf's DWARF unwinding
of the same event, or carry a note that says why not.

The programs are Debian's own binaries (no frame pointers, stripped, PIE),
each run with address randomization off (setarch -R; gdb runs programs
so): under perf record --call-graph dwarf, under ustack `trace
syscall:write -f json` on each backend, and under gdb, which prints `bt`
at each of the first GDB_EVENTS write(2) entries. The same code sits at the
same addresses in every run, and the program writes the same way, so the
N-th event's stack must be the same under every tool. perf script prints
an object-relative address, a caller's minus one (the
call's): both are put back with perf's own mmap records.
A stack is *equal* when its addresses are the oracle's; *deeper* when the
oracle's is a prefix of it and the oracle did not reach _start (perf's
copy ran out); *noted* when it differs but carries a note; anything else
is *wrong*: a defect.

    sudo .venv/bin/python bench/oracle_audit.py [--out bench/results/oracle_audit.md]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

USTACK = [sys.executable, "-m", "ustack"]
GDB_EVENTS = 5
BACKENDS = ("bpf", "perf", "tracefs")


def programs(work: Path) -> dict:
    """name -> argv of a deterministic single-threaded run that writes."""
    data = work / "in.bin"
    data.write_bytes(Path("/usr/bin/perl").read_bytes()[:2_000_000])
    text = work / "in.txt"
    text.write_text("".join(f"{(i * 7919) % 10007} line {i}\n" for i in range(60000)))
    db = work / "q.sql"
    db.write_text("create table t(a,b); with recursive c(x) as (select 1 union all "
                  "select x+1 from c where x<20000) insert into t select x, x*x from c;"
                  "select a, b from t where a % 7 = 0;\n")
    found = {
        "gzip": ["gzip", "-c", str(data)],
        "bzip2": ["bzip2", "-c", str(data)],
        "xz": ["xz", "-T1", "-c", str(data)],
        "zstd": ["zstd", "-c", "-q", str(data)],
        "sort": ["sort", str(text)],
        "sha256sum": ["sha256sum", str(data), str(text), str(data)],
        "sqlite3": ["sqlite3", ":memory:", f".read {db}"],
        "perl": ["perl", "-e", 'for $i (1..3000) { print "x" x ($i % 97), "\\n"; $| = ($i % 5 == 0) }'],
        "python3.11": ["/usr/bin/python3.11", "-c",
                       "import sys\nfor i in range(2000): sys.stdout.write('y' * (i % 89) + '\\n'); sys.stdout.flush()"],
        "jq": ["jq", "-c", ".[]", "--", str(_json_input(work))],
    }
    return {name: argv for name, argv in found.items() if shutil.which(argv[0])}


def _json_input(work: Path) -> Path:
    path = work / "in.json"
    path.write_text(json.dumps([{"i": i, "s": "v" * (i % 50)} for i in range(3000)]))
    return path


# --- one run under every tool ----------------------------------------------------

def norandom(argv: list) -> list:
    return ["setarch", "-R", *argv]


def run_all(name: str, argv: list, work: Path) -> dict:
    """argv under perf record, under each ustack backend and under gdb, all
    with address randomization off: the same code at the same addresses in
    every run. The outputs' paths by tool."""
    outs = {"oracle": work / f"{name}.perf.data", "gdb": work / f"{name}.gdb"}
    # perf itself runs under setarch: its workload, exec'd once, inherits
    # the personality (perf's DWARF walk loses a workload that execs again)
    subprocess.run(norandom(["perf", "record", "-q", "-o", str(outs["oracle"]),
                             "-e", "syscalls:sys_enter_write", "--call-graph", "dwarf,65528",
                             "-m", "8192", "--", *argv]),
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, timeout=600)
    for backend in BACKENDS:
        outs[backend] = work / f"{name}.{backend}.json"
        res = subprocess.run([*USTACK, "trace", "syscall:write", "--backend", backend, "-f", "json",
                              "-o", str(outs[backend]),
                              "-c", " ".join(shlex.quote(a) for a in norandom(argv))],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                             timeout=600)
        if res.returncode != 0:
            outs[backend] = "failed: " + (res.stderr.strip().splitlines() or ["?"])[-1]
    _gdb_run(argv, outs["gdb"])
    return outs


def _gdb_run(argv: list, out: Path) -> None:
    """gdb runs argv (address randomization off, as gdb runs programs) and
    prints bt at the first GDB_EVENTS write(2) entries."""
    # the whole stack (gdb stops at main by default), each frame's address
    # printed even where it starts a source line
    cmd = ["gdb", "-q", "-batch", "-nx", "-iex", "set debuginfod enabled off",
           "-ex", "set backtrace past-main on", "-ex", "set backtrace past-entry on",
           "-ex", "set print frame-info location-and-address",
           "-ex", "catch syscall write",
           "-ex", "run " + " ".join(shlex.quote(a) for a in argv[1:]) + " > /dev/null"]
    for _ in range(GDB_EVENTS):
        cmd += ["-ex", "bt", "-ex", "continue", "-ex", "continue"]     # entry, its return
    cmd += ["-ex", "delete", "-ex", "continue", argv[0]]
    with out.open("w") as f:
        subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                       timeout=600)


def ustack_stacks(path: Path) -> list:
    """(addresses innermost first, notes) per event of a json trace."""
    stacks = []
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        frames = [f for f in rec["frames"] if not f.get("kernel") and not f.get("inlined")]
        stacks.append(([int(f["address"], 16) for f in frames if f.get("address")],
                       tuple(rec.get("notes", ()))))
    return stacks


def perf_stacks(data: Path) -> list:
    """(addresses innermost first, whether it reached _start) per event."""
    text = subprocess.run(["perf", "script", "-i", str(data), "--show-mmap-events", "--no-inline",
                           "-F", "comm,ip,sym,dso"], capture_output=True, text=True,
                          check=True).stdout
    bases: dict = {}
    stacks, current = [], None
    for line in text.splitlines():
        m = re.search(r"PERF_RECORD_MMAP2 .*: \[0x([0-9a-f]+)\(0x[0-9a-f]+\) @ (0x[0-9a-f]+|0) .*\]: \S+ (/\S+)$", line)
        if m:
            if int(m.group(2), 16) == 0:
                bases.setdefault(m.group(3), int(m.group(1), 16))
            continue
        m = re.match(r"\s+([0-9a-f]+) (.*) \((.*)\)$", line)
        if m and current is not None:
            current.append((int(m.group(1), 16), m.group(2), m.group(3)))
        elif not line.strip():
            if current:
                stacks.append(current)
            current = None
        else:
            current = []
    if current:
        stacks.append(current)
    out = []
    for s in stacks:
        pcs = []
        for i, (ip, sym, dso) in enumerate(s):
            if sym.endswith("(inlined)"):
                continue
            pcs.append(bases.get(dso, 0) + ip + (1 if i else 0))
        out.append((pcs, "_start" in s[-1][1]))
    return out


def gdb_stacks(path: Path) -> list:
    stacks, current = [], []
    for line in path.read_text(errors="replace").splitlines():
        m = re.match(r"#(\d+)\s+0x([0-9a-f]+) in ", line)
        if not m:
            if re.match(r"#0\s", line):
                raise ValueError(f"a gdb frame without its address: {line}")
            continue
        if m.group(1) == "0" and current:
            stacks.append(current)
            current = []
        pc = int(m.group(2), 16)
        if not current or current[-1] != pc:      # inlined calls share their frame's pc
            current.append(pc)
    if current:
        stacks.append(current)
    return stacks


# --- judging ------------------------------------------------------------------

def judge(mine: tuple, oracle_pcs: list, oracle_complete: bool) -> str:
    pcs, notes = mine
    if pcs == oracle_pcs:
        return "equal"
    if not oracle_complete and pcs[:len(oracle_pcs)] == oracle_pcs:
        return "deeper"
    return "noted" if notes else "wrong"


def _likest(pcs: list, perf: list) -> tuple:
    """perf's stack equal to pcs, else the one sharing the longest prefix."""
    def shared(other):
        n = 0
        while n < min(len(pcs), len(other)) and pcs[n] == other[n]:
            n += 1
        return n
    return max(perf, key=lambda p: (p[0] == pcs, shared(p[0])))


def audit(name: str, argv: list, work: Path) -> list:
    outs = run_all(name, argv, work)
    perf = perf_stacks(outs["oracle"])
    gdb = gdb_stacks(outs["gdb"])
    rows = []
    for backend in BACKENDS:
        if isinstance(outs[backend], str):
            rows.append((name, backend, outs[backend]))
            continue
        mine = ustack_stacks(outs[backend])
        verdicts = {"equal": 0, "deeper": 0, "noted": 0, "wrong": 0}
        wrong = []
        if len(perf) == len(mine):          # event by event
            pairs = [(mine[i], perf[i]) for i in range(len(mine))]
        else:                               # perf lost events: each stack against its like
            pairs = [(m, _likest(m[0], perf)) for m in mine]
        for i, (m, (pcs, whole)) in enumerate(pairs):
            v = judge(m, pcs, whole)
            verdicts[v] += 1
            if v == "wrong" and len(wrong) < 2:
                wrong.append((i, [hex(p) for p in m[0]], [hex(p) for p in pcs]))
        by_gdb = [judge(mine[i], pcs, True) for i, pcs in enumerate(gdb[:len(mine)])]
        rows.append((name, backend, len(mine), len(perf), verdicts,
                     f"{by_gdb.count('equal')} equal, {by_gdb.count('noted')} noted, "
                     f"{by_gdb.count('wrong')} wrong of {len(by_gdb)}", wrong))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="bench/results/oracle_audit.md")
    ap.add_argument("--only", nargs="*", help="program names")
    args = ap.parse_args()
    lines = ["| program | backend | events (ustack/perf) | = perf | deeper than perf | noted | wrong | first 5 vs gdb |",
             "|---|---|---|---:|---:|---:|---:|---|"]
    details = []
    with tempfile.TemporaryDirectory(prefix="ustack-audit-") as tmp:
        work = Path(tmp)
        for name, argv in programs(work).items():
            if args.only and name not in args.only:
                continue
            for row in audit(name, argv, work):
                if len(row) == 3:
                    lines.append(f"| {row[0]} | {row[1]} | {row[2]} | | | | | |")
                    continue
                name_, backend, n, np_, v, g, wrong = row
                lines.append(f"| {name_} | {backend} | {n}/{np_} | {v['equal']} | {v['deeper']} | "
                             f"{v['noted']} | {v['wrong']} | {g} |")
                for w in wrong:
                    details.append(f"- {name_} {backend} event {w[0]}: ustack {w[1]} perf {w[2]}")
                print(lines[-1], flush=True)
    head = [f"## Held-out programs against perf's and gdb's DWARF unwinding ({time.strftime('%Y-%m-%d')}, "
            f"kernel {os.uname().release}; `sudo .venv/bin/python bench/oracle_audit.py`)", "",
            "Each row: one program's `write(2)` events on one backend, address by address against "
            "perf record --call-graph dwarf (every event) and gdb's `bt` (the first five). "
            "*noted*: differs, with a note saying why; *wrong*: differs silently (a defect).", ""]
    text = "\n".join(head + lines + ([""] + details if details else [])) + "\n"
    Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
