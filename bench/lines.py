#!/usr/bin/env python3
"""--lines/--inlines in libc's debug file: ustack vs eu-addr2line and
binutils addr2line on the same addresses, one run.

    python3 bench/lines.py [--quick]

200 and 2,000 addresses inside libc's functions (random, fixed seed) are
named with file:line and inlined calls by each tool, each in a fresh process:

  python start-up      `python3 -c 'import ustack.symbols.symbolizer'`: the
                       floor of any ustack run that names frames
  ustack names         function names only (symbol tables of libc and its
                       debug file read through libelf), empty cache
  ustack names, pyelftools
                       the same with the symbol tables read through
                       pyelftools (ustack without libelf.so.1)
  ustack all cold      --lines --inlines, empty cache: symbol tables and DWARF
  ustack cold          --lines --inlines, the symbol tables cached by the
                       names run, no DWARF answer kept: libdw reads the units
                       holding the addresses (native.libdw) from an image of
                       the debug file's DWARF inflated in memory
  ustack warm          the same again: libdw's answers read back
  ustack symcache      --lines --inlines, empty cache, without libdw: the
                       SymCache of the whole debug file is built (symbolic);
                       then warm, read back (as after a run that asked libdw
                       for 2,048 addresses)
  ustack pyelftools    --lines --inlines, empty cache, without libdw and
                       symbolic: the units holding the addresses parsed by
                       pyelftools (the last fallback; 200 addresses only)
  ustack symbolize     the command a user runs, `ustack symbolize --binary
                       LIBC --lines --inlines TRACE` on a saved trace of N
                       frames `libc.so.6[+0xOFF]`: all cold (empty cache),
                       cold (symbol tables cached) and warm, as above but
                       with the command's own start-up, parsing and printing
  eu-addr2line -i -f   one process for all addresses
  addr2line -i -f      one process for all addresses (binutils)

`first` is the time to the first address's answer (ustack only: the tools
answer all at once), `total` the wall time for all N measured inside the
process (ustack: from before its imports), `wall` the whole process from
fork to exit, `peak RSS` the process's. ustack's workers run with their
bytecode compiled beforehand (a private PYTHONPYCACHEPREFIX), as an
installed ustack has it. Needs libc6-dbg. Writes bench/results/lines.md
(lines_quick.md with --quick: 200 addresses, one repetition).
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(REPO / "src"))

LIBC = "/lib/x86_64-linux-gnu/libc.so.6"


def worker(mode: str, addr_file: str) -> None:
    """Runs in a fresh process: symbolize the addresses, print timings."""
    start = time.perf_counter()
    from ustack.model import Mapping
    from ustack.objfile.elf import ElfImage
    from ustack.symbols.symbolizer import SymbolOptions, Symbolizer

    class WholeFile:            # libc mapped at 0 with file offset 0
        def find(self, pid, addr):
            return Mapping(0, 1 << 48, 0, LIBC)

    vaddrs = json.loads(Path(addr_file).read_text())
    if mode == "names-pyelftools":
        from ustack.native import libelf
        libelf.available = lambda: False
    if mode in ("symcache", "pyelftools"):
        from ustack.native import libdw
        libdw.available = lambda: False
    if mode == "pyelftools":
        from ustack.objfile import symcache

        def unavailable(path):
            raise symcache.SymCacheError("left out by the benchmark")
        symcache.build = unavailable
    image = ElfImage.open(LIBC)
    offsets = [image.file_offset(v) for v in vaddrs]
    lines = not mode.startswith("names")
    sym = Symbolizer(WholeFile(), SymbolOptions(lines=lines, inlines=lines))
    frames = list(sym.frames(0, offsets[:1]))
    first = time.perf_counter() - start
    for off in offsets[1:]:
        frames.extend(sym.frames(0, [off]))
    total = time.perf_counter() - start
    import resource
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"first": first, "total": total, "rss_kb": rss,
                      "frames": len(frames), "lines": sum(1 for f in frames if f.line)}),
          flush=True)
    leave_as_the_cli_does()


def leave_as_the_cli_does() -> None:
    """What ustack.cli.entry does after a command: the line answers saved,
    then out without tearing the interpreter down (the worker's wall time
    is then the command's)."""
    memos = sys.modules.get("ustack.objfile.line_memo")
    if memos is not None:
        memos.save_all()
    os._exit(0)


def worker_env(cache: str, pycache: str) -> dict:
    env = dict(os.environ, USTACK_CACHE_DIR=cache, PYTHONPYCACHEPREFIX=pycache)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def run_worker(mode: str, addr_file: str, cache: str, pycache: str) -> dict:
    import subprocess
    env = worker_env(cache, pycache)
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, __file__, "--worker", mode, addr_file],
                            stdout=subprocess.PIPE, env=env)
    out = proc.communicate()[0]
    wall = time.perf_counter() - start
    if proc.returncode:
        raise SystemExit(f"worker {mode} failed")
    return dict(json.loads(out), wall=wall)


def run_tool(cmd: list, env=None) -> dict:
    import subprocess
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    _pid, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - start
    if proc.returncode:
        raise SystemExit(f"{cmd[0]} {' '.join(map(str, cmd[1:4]))}… failed ({proc.returncode})")
    return {"first": None, "total": wall, "wall": wall, "rss_kb": usage.ru_maxrss}


def command_env(cache: str, pycache: str) -> dict:
    """The environment of `ustack symbolize`: src first on the path, as an
    installed ustack would be found."""
    return dict(worker_env(cache, pycache), PYTHONPATH=str(REPO / "src"))


def saved_trace(path: str, vaddrs: list) -> None:
    """A saved ftrace user stack with a frame `LIBC[+0xOFF]` per address:
    OFF counts from the start of libc's executable mapping."""
    from ustack.objfile.elf import ElfImage
    image = ElfImage.open(LIBC)
    (_vaddr, offset, _size), = image.executable_segments()
    base = offset & ~0xFFF
    with open(path, "w") as f:
        f.write("# tracer: nop\n"
                "           chain-1234  [001] ..... 100.000000: <user stack trace>\n")
        f.writelines(f" => {LIBC}[+{image.file_offset(v) - base:#x}]\n" for v in vaddrs)


def main() -> None:
    import argparse
    import platform
    import random
    import statistics
    import tempfile
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer addresses, one repetition")
    ap.add_argument("--worker", nargs=2, metavar=("MODE", "FILE"), help=argparse.SUPPRESS)
    ap.add_argument("-n", type=int, help="addresses (default 200 and 2000, quick 200)")
    ap.add_argument("--reps", type=int, help="repetitions, median kept (default 3, quick 1)")
    args = ap.parse_args()
    from ustack.objfile.debuginfo import find_debug_file
    from ustack.objfile.elf import ElfImage
    found = find_debug_file(ElfImage.open(LIBC))
    if found.how != "build-id":
        sys.exit("libc6-dbg is not installed for this libc")
    sizes = [args.n] if args.n else ([200] if args.quick else [200, 2000])
    reps = args.reps or (1 if args.quick else 3)
    funcs = [s for s in ElfImage.open(found.path).functions if s.size > 16]
    md = [f"## --lines/--inlines in libc's debug file (median of {reps})", "",
          f"{platform.node()}, {platform.release()}, {os.cpu_count()} CPUs", "",
          "| addresses | tool | first (s) | total (s) | wall (s) | addr/s | peak RSS (MB) |",
          "|---:|---|---:|---:|---:|---:|---:|"]
    for n in sizes:
        rnd = random.Random(1)
        vaddrs = [s.address + rnd.randrange(s.size) for s in rnd.choices(funcs, k=n)]
        results: dict = {}
        with tempfile.TemporaryDirectory() as tmp:
            addr_file = os.path.join(tmp, "addrs.json")
            Path(addr_file).write_text(json.dumps(vaddrs))
            hexes = [hex(v) for v in vaddrs]
            trace = os.path.join(tmp, "trace.txt")
            saved_trace(trace, vaddrs)
            pycache = os.path.join(tmp, "pycache")
            run_worker("names", addr_file, tempfile.mkdtemp(dir=tmp), pycache)  # compiles
            symbolize = [sys.executable, "-m", "ustack", "symbolize", "--binary", LIBC,
                         "--lines", "--inlines", trace]
            run_tool(symbolize, command_env(tempfile.mkdtemp(dir=tmp), pycache))  # compiles
            for _ in range(reps):
                cache = tempfile.mkdtemp(dir=tmp)
                fresh = tempfile.mkdtemp(dir=tmp)
                other_names = tempfile.mkdtemp(dir=tmp)
                whole = tempfile.mkdtemp(dir=tmp)
                slow = tempfile.mkdtemp(dir=tmp)
                command_fresh = tempfile.mkdtemp(dir=tmp)
                command = tempfile.mkdtemp(dir=tmp)
                for other in (whole, slow, command):    # their symbol tables cached, untimed
                    run_worker("names", addr_file, other, pycache)
                floor = [sys.executable, "-c", "import os, ustack.symbols.symbolizer; os._exit(0)"]
                runs = {
                    "python start-up + ustack's symbolizer imports": lambda: run_tool(
                        floor, dict(worker_env(cache, pycache), PYTHONPATH=str(REPO / "src"))),
                    "ustack names": lambda: run_worker("names", addr_file, cache, pycache),
                    "ustack names, symbol tables through pyelftools":
                        lambda: run_worker("names-pyelftools", addr_file, other_names, pycache),
                    "ustack --lines --inlines, all cold (symbol tables too)":
                        lambda: run_worker("lines", addr_file, fresh, pycache),
                    "ustack --lines --inlines, cold (libdw)":
                        lambda: run_worker("lines", addr_file, cache, pycache),
                    "ustack --lines --inlines, warm (libdw's answers kept)":
                        lambda: run_worker("lines", addr_file, cache, pycache),
                    "ustack --lines --inlines, cold without libdw (SymCache built)":
                        lambda: run_worker("symcache", addr_file, whole, pycache),
                    "ustack --lines --inlines, warm from the SymCache":
                        lambda: run_worker("symcache", addr_file, whole, pycache),
                    "ustack symbolize --lines --inlines, all cold": lambda: run_tool(
                        symbolize, command_env(command_fresh, pycache)),
                    "ustack symbolize --lines --inlines, cold": lambda: run_tool(
                        symbolize, command_env(command, pycache)),
                    "ustack symbolize --lines --inlines, warm": lambda: run_tool(
                        symbolize, command_env(command, pycache)),
                    "eu-addr2line -i -f": lambda: run_tool(["eu-addr2line", "-i", "-f", "-e", LIBC, *hexes]),
                    "addr2line -i -f": lambda: run_tool(["addr2line", "-i", "-f", "-e", LIBC, *hexes]),
                }
                if n <= 200:
                    runs["ustack --lines --inlines, pyelftools only, cold"] = \
                        lambda: run_worker("pyelftools", addr_file, slow, pycache)
                for name, fn in runs.items():   # names first: it fills the symbol cache
                    results.setdefault(name, []).append(fn())

        def med(rows, key):
            vals = [r[key] for r in rows if r[key] is not None]
            return statistics.median(vals) if vals else None

        for name, rows in results.items():
            first, total = med(rows, "first"), med(rows, "total")
            md.append(f"| {n:,} | {name} | {'' if first is None else f'{first:.3f}'} | "
                      f"{total:.3f} | {med(rows, 'wall'):.3f} | {n / total:,.0f} | "
                      f"{med(rows, 'rss_kb') / 1024:.0f} |")
    md.append("")
    out = BENCH / "results" / ("lines_quick.md" if args.quick else "lines.md")
    from uprobe_rate import write_report  # one report writer for all benchmarks (not in the workers)
    write_report("\n".join(md) + "\n", out)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:     # a worker imports no more than ustack does
        worker(*sys.argv[2:4])
    else:
        main()
