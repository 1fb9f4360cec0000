#!/usr/bin/env python3
"""Return probes over every function and fragment of a program and of
libc, and uprobes over every byte of code with data in it: does the
traced program print what it prints unprobed?

    sudo python3 bench/return_probes.py [--old SRC] [--skip-libc]

Runs, each on the perf, bpf and tracefs backends (latency is bpf only):
  cold_part  count 'uretprobe:BIN:*' -c BIN (tests/programs/cold_part.c,
             gcc -O2: work and its fragment work.cold);
  stripped   its `strip -s` copy: a uretprobe at each FDE start the
             resolver accepts (the others are counted as refused);
  latency    latency 'uprobe:BIN:*' (bpf);
  libc       count 'uretprobe:libc:*' -c 'sort FILE' (tracefs: 'uretprobe:
             libc:_IO_*' -a, its uprobes are in every process that maps
             libc), and latency
             'uprobe:libc:*' of the same (bpf);
  code_data  a uprobe at every byte offset of trick and shifted
             (tests/programs/code_data.c) the resolver accepts, in the
             binary and its stripped copy; the accepted offsets are checked
             against objdump's instruction starts (trick's decoded past its
             data byte): how many are off one, how many true starts kept.
`changed` counts runs whose printed output differs from the unprobed
run's. --old SRC also runs the cold_part rows with another tree's src/
(the code before these checks): libc rows never run old code, since a
uretprobe on a libc fragment would harm every process on the machine.
Writes bench/results/return_probes.md.
"""
from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(REPO / "src"))
from helpers import build  # noqa: E402
from uprobe_rate import write_report  # noqa: E402

BACKENDS = ("perf", "bpf", "tracefs")


def ustack(src: str, *args, timeout: float = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=src)
    return subprocess.run([sys.executable, "-m", "ustack", *args], env=env,
                          capture_output=True, text=True, timeout=timeout)


def plain(cmd: list) -> str:
    return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout


def verdicts(kind: str, path: str, addresses) -> tuple:
    """(accepted, refused) addresses for `kind` probes, by the resolver."""
    from ustack.model import UstackError
    from ustack.probes.resolve import resolve_uprobes
    from ustack.probes.spec import parse_event
    accepted, refused = [], []
    for a in addresses:
        try:
            resolve_uprobes(parse_event(f"{kind}:{path}:0x{a:x}"))
        except UstackError:
            refused.append(a)
        else:
            accepted.append(a)
    return accepted, refused


def fde_starts(path: str) -> list:
    from ustack.objfile.on_disk import OnDisk
    return [lo for lo, _hi in OnDisk.of(path).fde_ranges()]


def true_starts(path: str, spans) -> set:
    """objdump's instruction starts of code_data's trick and shifted: trick
    decoded from its jmp and from that jmp's target trick+0x3 (the byte
    between is data), shifted from its symbol."""
    import re
    starts = set()
    for span in spans:
        pieces = [(span.start, span.start + 2), (span.start + 3, span.stop)] \
            if plain(["objdump", "-d", f"--start-address=0x{span.start:x}",
                      f"--stop-address=0x{span.start + 2:x}", path]).count("jmp") \
            else [(span.start, span.stop)]
        for lo, hi in pieces:
            out = plain(["objdump", "-d", "--no-show-raw-insn", f"--start-address=0x{lo:x}",
                         f"--stop-address=0x{hi:x}", path])
            starts |= {int(m.group(1), 16) for m in re.finditer(r"^\s+([0-9a-f]+):", out, re.M)}
    return starts


def row(name: str, backend: str, src: str, args: list, expect: str, rows: list,
        note: str = "") -> None:
    t = time.monotonic()
    res = ustack(src, *args)
    changed = res.returncode == 0 and expect not in res.stdout
    failed = res.returncode != 0
    crashed = "was killed by SIG" in res.stderr
    rows.append((name, backend, "changed" if changed else (
        "crashed" if crashed else "failed" if failed else "same"),
                 f"{time.monotonic() - t:.1f}", note))
    if failed:
        print(f"{name} {backend}: {res.stderr.strip()[-300:]}", file=sys.stderr)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--old", help="another tree's src/ to run the cold_part rows with")
    ap.add_argument("--skip-libc", action="store_true")
    opts = ap.parse_args()
    new = str(REPO / "src")
    full = str(build("cold_part", flags=("-O2",)))
    work = tempfile.mkdtemp(prefix="return-probes-")
    stripped = os.path.join(work, "cold_part")
    subprocess.run(["strip", "-s", "-o", stripped, full], check=True)
    expect = plain([full])
    rows: list = []
    ok, refused = verdicts("uretprobe", stripped, fde_starts(stripped))
    for src in [new] + ([opts.old] if opts.old else []):
        tag = "" if src == new else " (old)"
        for backend in BACKENDS:
            row("cold_part uretprobe:BIN:*" + tag, backend, src,
                ["count", f"uretprobe:{full}:*", "-c", full, "--backend", backend],
                expect, rows)
            events = [f"uretprobe:{stripped}:0x{a:x}" for a in
                      (ok if src == new else ok + refused)]
            row("cold_part stripped, FDE starts" + tag, backend, src,
                ["count", *events, "-c", stripped, "--backend", backend], expect, rows,
                f"{len(events)} placed, {len(refused) if src == new else 0} refused")
        row("cold_part latency BIN:*" + tag, "bpf", src,
            ["latency", f"uprobe:{full}:*", "-c", full], expect, rows)
    if not opts.skip_libc:
        words = os.path.join(work, "words")
        with open(words, "w") as f:
            f.write("".join(f"{(i * 7919) % 5003} line {i}\n" for i in range(5000)))
        cmd = f"sort -n {words}"
        sorted_out = plain(["sort", "-n", words])
        for backend in BACKENDS:
            # tracefs's uprobes fire in every process that maps libc (-a):
            # all of libc's returns would slow the whole machine, so there
            # its stdio (_IO_*: 194 functions, 12 fragments skipped)
            glob = "_IO_*" if backend == "tracefs" else "*"
            row(f"libc uretprobe:libc:{glob}", backend, new,
                ["count", f"uretprobe:libc:{glob}", "-c", cmd, "--backend", backend]
                + (["-a"] if backend == "tracefs" else []), sorted_out, rows)
        row("libc latency libc:*", "bpf", new, ["latency", "uprobe:libc:*", "-c", cmd],
            sorted_out, rows)
    code_data = str(build("code_data", flags=("-O2",)))
    code_stripped = os.path.join(work, "code_data")
    subprocess.run(["strip", "-s", "-o", code_stripped, code_data], check=True)
    expect = plain([code_data])
    from ustack.objfile.elf import ElfImage
    image = ElfImage.open(code_data)
    spans = [range(s.address, s.address + s.size) for s in image.symbols.functions
             if s.name in ("trick", "shifted")]
    starts = true_starts(code_data, spans)
    for path, tag in ((code_data, "code_data"), (code_stripped, "code_data stripped")):
        ok, refused = [], []
        for span in spans:
            a, r = verdicts("uprobe", path, span)
            ok += a
            refused += r
        off = len(set(ok) - starts)
        kept = len(starts & set(ok))
        for backend in BACKENDS:
            row(tag + ", every byte", backend, new,
                ["count", *[f"uprobe:{path}:0x{a:x}" for a in ok], "-c", path,
                 "--backend", backend], expect, rows,
                f"{len(ok)} placed, {len(refused)} refused; {off} off an instruction "
                f"start, {kept} of {len(starts)} true starts")
    lines = [f"# Return probes and data in code: printed output vs unprobed\n",
             f"{platform.node()} kernel {platform.release()}, {time.strftime('%Y-%m-%d')}; "
             "`same`: the traced program printed its unprobed output.\n",
             "| run | backend | output | s | probes |", "|---|---|---|---|---|"]
    lines += [f"| {' | '.join(r)} |" for r in rows]
    changed = sum(r[2] != "same" for r in rows if "(old)" not in r[0])
    lines.append(f"\nchanged, crashed or failed runs (this code): {changed} of "
                 f"{sum('(old)' not in r[0] for r in rows)} runs")
    write_report("\n".join(lines) + "\n", BENCH / "results" / "return_probes.md")
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
