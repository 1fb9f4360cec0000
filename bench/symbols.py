#!/usr/bin/env python3
"""Names per second: Go .gopclntab lookups and demangling, ustack vs the
command-line tools that answer the same question, on the same inputs.

    python3 bench/symbols.py [--quick]

Go: a large stripped Go binary (the Go toolchain's `compile`, else the
tests' gochain), N random pcs inside its functions. ustack's table is
opened once (timed apart), then each pc is looked up for its name, and
for name + file:line + inlined calls (--lines --inlines); `go tool
addr2line` gets the same pc list on stdin (wall time, start-up included;
it reads the table the same way and prints name + file:line).

Demangling: every mangled function name of libstdc++ (C++) and of a Rust
v0 binary when rustc is present; first pass (cold) and second (cached),
against `c++filt` reading the same list on stdin.

Prints a Markdown table and writes it to bench/results/."""
from __future__ import annotations

import argparse
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "bench"))
from helpers import build_go  # noqa: E402
from uprobe_rate import write_report  # noqa: E402

from ustack.objfile import demangle as dm  # noqa: E402
from ustack.objfile.elf import ElfImage  # noqa: E402
from ustack.objfile.gopclntab import Pclntab, go_table  # noqa: E402


def go_binary() -> Path:
    for cand in sorted(Path("/usr/lib").glob("go-*/pkg/tool/linux_amd64/compile")):
        return cand
    return build_go("gochain", strip=True)


def rate(n: int, seconds: float) -> str:
    return f"{n / seconds:,.0f}" if seconds > 0 else "-"


def bench_go(n: int) -> list:
    path = go_binary()
    image = ElfImage.open(str(path))
    addr, off, size = image.sections[".gopclntab"]
    with open(path, "rb") as f:
        f.seek(off)
        blob = f.read(size)
    t = time.perf_counter()
    table = Pclntab(blob, addr, None, image.sections[".text"][0])
    t_open = time.perf_counter() - t
    table = go_table(image)         # with the image reader: inlined calls too
    funcs = list(table.functions())
    rng = random.Random(1)
    pcs = [rng.randrange(e, end) for _, e, end in rng.choices(funcs, k=n)]
    t = time.perf_counter()
    for pc in pcs:
        table.find(pc)
    t_names = time.perf_counter() - t
    t = time.perf_counter()
    for pc in pcs:
        table.frames(pc)
    t_frames = time.perf_counter() - t
    rows = [(f"ustack .gopclntab open ({len(funcs):,} functions, {size / 1e6:.1f} MB)",
             f"{t_open * 1000:.1f} ms", ""),
            ("ustack pc → name", rate(n, t_names), f"{n:,} pcs"),
            ("ustack pc → name, file:line, inlined calls", rate(n, t_frames), f"{n:,} pcs")]
    if shutil.which("go"):
        t = time.perf_counter()
        subprocess.run(["go", "tool", "addr2line", str(path)], check=True,
                       input="".join(f"0x{pc:x}\n" for pc in pcs),
                       capture_output=True, text=True)
        rows.append(("go tool addr2line (name, file:line; start-up included)",
                     rate(n, time.perf_counter() - t), f"{n:,} pcs"))
    return [(f"`{path.name}` " + r[0] if i == 0 else r[0], *r[1:])
            for i, r in enumerate(rows)]


def mangled_names(binary: str, prefix: str) -> list:
    out = subprocess.run(["nm", "-D" if binary.endswith(".so.6") else "--defined-only",
                          binary], capture_output=True, text=True).stdout
    return sorted({p[-1] for p in (l.split() for l in out.splitlines())
                   if p and p[-1].startswith(prefix)})


def bench_demangle(label: str, names: list) -> list:
    if not names:
        return [(f"{label}: no names", "-", "")]
    dm._cache.clear()
    t = time.perf_counter()
    for name in names:
        dm.demangle(name)
    cold = time.perf_counter() - t
    t = time.perf_counter()
    for name in names:
        dm.demangle(name)
    warm = time.perf_counter() - t
    rows = [(f"ustack demangle {label}, first time", rate(len(names), cold), f"{len(names):,} names"),
            (f"ustack demangle {label}, cached", rate(len(names), warm), f"{len(names):,} names")]
    if shutil.which("c++filt"):
        t = time.perf_counter()
        subprocess.run(["c++filt"], input="\n".join(names) + "\n", check=True,
                       capture_output=True, text=True)
        rows.append((f"c++filt {label} (start-up included)",
                     rate(len(names), time.perf_counter() - t), f"{len(names):,} names"))
    return rows


def rust_names() -> list:
    rustc = shutil.which("rustc") or "/root/.cargo/bin/rustc"
    if not Path(rustc).exists():
        return []
    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / "demo.rs"
        src.write_text('fn main() { let v: Vec<String> = std::env::args().collect(); '
                       'println!("{:?}", v); }\n')
        subprocess.run([rustc, "-C", "symbol-mangling-version=v0", "-o", f"{d}/demo",
                        str(src)], check=True, capture_output=True)
        return mangled_names(f"{d}/demo", "_R")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="20,000 pcs instead of 200,000")
    ap.add_argument("-o", "--out", type=Path, help="Markdown file to write")
    args = ap.parse_args()
    n = 20_000 if args.quick else 200_000
    out = args.out or REPO / "bench" / "results" / \
        ("symbols_quick.md" if args.quick else "symbols.md")
    rows = bench_go(n)
    libstdcxx = "/usr/lib/x86_64-linux-gnu/libstdc++.so.6"
    rows += bench_demangle("C++ (libstdc++ exports)",
                           mangled_names(libstdcxx, "_Z") if os.path.exists(libstdcxx) else [])
    rows += bench_demangle("Rust v0", rust_names())
    table = ["| what | per second | on |", "|---|---:|---|"]
    table += [f"| {a} | {b} | {c} |" for a, b, c in rows]
    md = (f"## Symbols: Go pclntab lookups and demangling\n\n"
          f"{time.strftime('%Y-%m-%d')}, kernel {platform.release()}, {os.cpu_count()} CPUs, "
          f"Python {platform.python_version()}; one run. Command-line tools include "
          f"their start-up.\n\n" + "\n".join(table) + "\n")
    write_report(md, out)


if __name__ == "__main__":
    main()
