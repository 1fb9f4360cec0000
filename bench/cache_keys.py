#!/usr/bin/env python3
"""What naming cache entries by content costs at start-up: the same
commands run from two source trees, alternated, each in a fresh process,
each tree with its own cache directory, warm (one untimed run first) and
cold (the cache directory emptied before each timed run).

    sudo python3 bench/cache_keys.py BEFORE_SRC [--reps N]

BEFORE_SRC: a src/ directory of the code to compare with (e.g. an export
of the commit before: `git archive COMMIT src | tar -x -C DIR`); the
other side is this checkout's src/. Commands:

  list libc     ustack list /lib/x86_64-linux-gnu/libc.so.6
  list node     ustack list /usr/bin/node          (86,000 functions)
  trace 1 hit   ustack trace uprobe:CHAIN:d -c 'CHAIN 1'   (chain -O2, no FP)
  lookups       in one fresh process, the cached facts of chain, libc, ld.so,
                libm and libstdc++ (functions, kernel rows, CFI table): the
                time of those lookups alone (imports excluded), where the
                new keys' memo reads and debug-file searches are paid

Also, in this process, the hashing itself: the symbol tables' key of libc
and node (objfile/elf_symtab.py), and the CFI sections' key (unwind/cfi_key.py).
Writes bench/results/cache_keys.md."""
from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "src"))      # this checkout's ustack, for hashing_ms()
from helpers import O2_NOFP, build  # noqa: E402

LIBC = "/lib/x86_64-linux-gnu/libc.so.6"
NODE = "/usr/bin/node"


OBJECTS = [LIBC, "/lib64/ld-linux-x86-64.so.2", "/lib/x86_64-linux-gnu/libm.so.6",
           "/lib/x86_64-linux-gnu/libstdc++.so.6"]
LOOKUPS = """
import sys, time
from ustack.objfile.elf import ElfImage
from ustack.unwind import tables
from ustack.unwind.cfi import UnwindTable
start = time.perf_counter()
for path in sys.argv[1:]:
    image = ElfImage.open(path)
    image.lookup(image.functions[len(image.functions) // 2].address)
    tables.for_image(image)
    UnwindTable.for_image(image)
print((time.perf_counter() - start) * 1000)
"""


def run(src: str, cache: str, args: list) -> float:
    env = dict(os.environ, PYTHONPATH=src, USTACK_CACHE_DIR=cache)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    command = ["-c", LOOKUPS, *args[1:]] if args[0] == "lookups" else ["-m", "ustack", *args]
    start = time.perf_counter()
    res = subprocess.run([sys.executable, *command], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    took = time.perf_counter() - start
    if res.returncode != 0:
        raise SystemExit(f"{args}: {res.stderr}")
    return float(res.stdout) if args[0] == "lookups" else took * 1000


def hashing_ms() -> list:
    """(what, ms) of computing the content keys once, in this process."""
    from ustack.objfile.elf import ElfImage
    from ustack.objfile.elf_reader import open_reader
    from ustack.objfile.elf_symtab import ReadOnce, _tables_key   # the measured code
    from ustack.unwind.cfi_key import cfi_sections, sections_key
    out = []
    for path in (LIBC, NODE):
        with open(path, "rb") as f:
            reader = open_reader(path, f)
            best = min(_timed(lambda: _tables_key(ReadOnce(reader))) for _ in range(3))
            reader.close()
        out.append((f"symbol tables' key, {os.path.basename(path)}", best))
        image = ElfImage.open(path)
        best = min(_timed(lambda: sections_key(cfi_sections(image))) for _ in range(3))
        out.append((f"CFI sections' key, {os.path.basename(path)}", best))
    return out


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1000


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("before_src")
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--node-reps", type=int, default=5, help="runs of `list node` (seconds each)")
    opts = ap.parse_args()
    chain = str(build("chain", flags=O2_NOFP))
    sides = {"before": os.path.abspath(opts.before_src), "after": str(REPO / "src")}
    commands = {
        "list libc": ["list", LIBC],
        "list node": ["list", NODE],
        "trace, 1 hit": ["trace", f"uprobe:{chain}:d", "-c", f"{chain} 1"],
        "lookups of 5 objects (in-process)": ["lookups", chain, *OBJECTS],
    }
    tmp = tempfile.mkdtemp(prefix="ustack-cache-keys-")
    rows = []
    try:
        for label, args in commands.items():
            for warm in (True, False):
                times: dict = {side: [] for side in sides}
                caches = {side: os.path.join(tmp, side) for side in sides}
                if warm:
                    for side, src in sides.items():
                        run(src, caches[side], args)
                for _ in range(opts.node_reps if NODE in args else opts.reps):
                    for side, src in sides.items():
                        if not warm:
                            shutil.rmtree(caches[side], ignore_errors=True)
                        times[side].append(run(src, caches[side], args))
                for side in sides:
                    rows.append((label, "warm" if warm else "cold", side,
                                 statistics.median(times[side]), times[side]))
                print(rows[-2:], flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    hashed = hashing_ms()
    lines = [
        "## Start-up with cache entries named by content (bench/cache_keys.py)",
        "",
        f"{platform.node()}, {platform.release()}, {os.cpu_count()} CPUs, "
        f"{time.strftime('%Y-%m-%d %H:%M')}, load average "
        f"{os.getloadavg()[0]:.1f}; before = {sides['before']}, after = this "
        f"checkout; sides alternated, fresh process each, {opts.reps} runs "
        f"({opts.node_reps} of `list node`); "
        "warm = cache filled by one untimed run, cold = cache emptied before each run.",
        "",
        "| command | cache | code | median ms | runs |",
        "|---|---|---|---:|---|",
    ]
    for label, state, side, median, times in rows:
        lines.append(f"| {label} | {state} | {side} | {median:.0f} | "
                     + " ".join(f"{t:.0f}" for t in times) + " |")
    lines += ["", "Hashing alone (best of 3, in one process):", "",
              "| what | ms |", "|---|---:|"]
    lines += [f"| {what} | {ms:.1f} |" for what, ms in hashed]
    out = BENCH / "results" / "cache_keys.md"
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
