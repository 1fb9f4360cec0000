#!/usr/bin/env python3
"""A -c command's first burst with an empty cache: every event comes before
the command's rows are built, so the in-kernel walk defers each stack to
ustack through count's ring. For this tree and another (--before DIR/src),
runs alternated:

- the deferred records' size in the ring (bytes, as the ring's length
  word says; the reader is wrapped to see them) and how many the ring holds;
- the count program's ns per event (kernel.bpf_stats_enabled on, run time ÷
  runs read from ustack's fdinfo while it runs), each event deferred;
- how many of the burst's stacks are whole (reach _start, no note).

    sudo python3 bench/deferred_records.py --before DIR/src [--runs N] [--hits N]

`ustack count uprobe:chain:d -c 'chain HITS'` (tests/programs/chain.c,
-O2 without frame pointers), USTACK_CACHE_DIR a fresh folder each run.
Writes bench/results/deferred_records.md."""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
from offcpu import BPF_STATS  # noqa: E402
from latency_entry_cost import communicate_watching_programs  # noqa: E402
from uprobe_rate import write_report  # noqa: E402
from helpers import O2_NOFP, build, parse_counts, funcs  # noqa: E402

WHOLE = ["d", "c", "b", "a", "main", "__libc_start_call_main", "__libc_start_main", "_start"]

# run in the measured tree: ustack's main with the ring reader wrapped to
# note each deferred record's length and the ring's size
_WRAPPED = r"""
import json, sys
from ustack.capture import bpf_dwarf, bpf_unwind
from ustack.kernel.bpf_syscall import RING_RECORD_HEADER, ring_next
sizes, rings = [], []
read = bpf_dwarf.ring_samples
def ring_samples(chunk, samples, offset, limit, *a, **k):
    at, end = offset, min(len(chunk), offset + limit)
    while at < end:
        n = bpf_unwind._U32.unpack_from(chunk, at)[0]
        if bpf_unwind.RECORD.unpack_from(chunk, at + RING_RECORD_HEADER)[5] == bpf_unwind.DEFERRED:
            sizes.append(n & 0x0FFFFFFF)
        at = ring_next(at, n)
    return read(chunk, samples, offset, limit, *a, **k)
bpf_dwarf.ring_samples = ring_samples
ring_bytes = bpf_dwarf.deferral_ring_bytes
def deferral_ring_bytes(*a, **k):
    rings.append(ring_bytes(*a, **k))
    return rings[-1]
bpf_dwarf.deferral_ring_bytes = deferral_ring_bytes
from ustack.cli import main
try:
    status = main(sys.argv[1:])
finally:
    print("SIZES " + json.dumps([sizes, rings]), file=sys.stderr)
sys.exit(status)
"""


def one_run(src: Path, chain: Path, hits: int, work: Path) -> dict:
    cache = work / "cache"
    subprocess.run(["rm", "-rf", str(cache)], check=True)
    env = dict(os.environ, PYTHONPATH=str(src), USTACK_CACHE_DIR=str(cache))
    proc = subprocess.Popen([sys.executable, "-c", _WRAPPED, "count", f"uprobe:{chain}:d",
                             "-c", f"{chain} {hits}"], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    (out, err), seen = communicate_watching_programs(proc)
    sizes, rings = json.loads(err.split("SIZES ", 1)[1].splitlines()[0])
    whole = sum(s["count"] for s in parse_counts(out) if funcs(s["frames"]) == WHOLE)
    counted = [v for v in seen.values() if v[2]]
    _insns, ns, runs = max(counted) if counted else (0, 0, 0)
    return dict(sizes=sizes, ring=rings[0] if rings else 0, whole=whole,
                ns=ns / runs if runs else float("nan"), runs=runs,
                cut=int(m[1]) if (m := re.search(r"(\d+) events' stacks were cut", err)) else 0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", required=True, metavar="DIR/src")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--hits", type=int, default=1000)
    opts = ap.parse_args()
    chain = build("chain", flags=O2_NOFP)
    trees = {"this tree": REPO / "src", "before": Path(opts.before)}
    results: dict = {t: [] for t in trees}
    loads = []
    was = Path(BPF_STATS).read_text()
    Path(BPF_STATS).write_text("1")
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for _ in range(opts.runs):
                for name, src in trees.items():       # alternated
                    loads.append(os.getloadavg()[0])
                    results[name].append(one_run(src, chain, opts.hits, Path(tmp)))
    finally:
        Path(BPF_STATS).write_text(was)
    rows = ["| tree | record bytes (median) | ring MiB | records it holds | ns/event "
            "(median; each run) | whole of each burst | cut |", "|---|---|---|---|---|---|---|"]
    for name, runs in results.items():
        sizes = [s for r in runs for s in r["sizes"]]
        size = statistics.median(sizes) if sizes else 0
        ring = runs[0]["ring"]
        holds = int(ring // ((size + 8 + 7) // 8 * 8)) if size else 0
        rows.append(f"| {name} | {size:.0f} | {ring >> 20} | {holds} | "
                    f"{statistics.median(r['ns'] for r in runs):.0f}; "
                    + ", ".join(f"{r['ns']:.0f}" for r in runs) + " | "
                    + ", ".join(str(r["whole"]) for r in runs) + " | "
                    + ", ".join(str(r["cut"]) for r in runs) + " |")
    text = (f"# A command's first burst, deferred\n\n"
            f"`ustack count uprobe:chain:d -c 'chain {opts.hits}'` (-O2, no frame pointers), "
            f"empty cache each run, {opts.runs} alternated pairs, load average "
            f"{min(loads):.1f}-{max(loads):.1f} on {os.cpu_count()} CPUs, "
            f"{time.strftime('%Y-%m-%d')}. ns/event: the count program's run time per run "
            "(bpf_stats), every event deferred.\n\n" + "\n".join(rows) + "\n")
    write_report(text, REPO / "bench" / "results" / "deferred_records.md")


if __name__ == "__main__":
    main()
