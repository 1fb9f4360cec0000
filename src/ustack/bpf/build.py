"""Build the BPF objects from their C: python -m ustack.bpf.build [--check].

Each NAME.bpf.c becomes NAME.bpf.o beside it, with clang's BPF target and
libbpf's headers (Debian: clang llvm libbpf-dev), its DWARF stripped (the
loader needs only .BTF and .BTF.ext). The output depends only on the
sources and the toolchain, not on where the checkout is: clang runs in this
folder on relative paths. --check builds into a temporary folder and fails
when a committed object differs (CI runs it: the C is what ships)."""
from __future__ import annotations

import argparse
import filecmp
import glob
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
CLANG_FLAGS = ["-target", "bpf", "-mcpu=v3", "-O2", "-g", "-Wall", "-Werror",
               "-I/usr/include/x86_64-linux-gnu",   # asm/types.h for linux/types.h
               "-fdebug-compilation-dir=.", f"-fdebug-prefix-map={HERE}=."]


def sources() -> list:
    return sorted(os.path.basename(p) for p in glob.glob(os.path.join(HERE, "*.bpf.c")))


def tool(name: str) -> str:
    """The path of clang or llvm-strip (Debian may version their names)."""
    found = shutil.which(name) or next(iter(sorted(
        glob.glob(f"/usr/bin/{name}-[0-9]*"), reverse=True)), None)
    if found is None:
        raise SystemExit(f"{name} not found: install clang and llvm "
                         "(apt-get install clang llvm libbpf-dev)")
    return found


def build(out_dir: str) -> list:
    """Compile every source into out_dir; the objects' names."""
    clang, strip = tool("clang"), tool("llvm-strip")
    built = []
    for src in sources():
        obj = src[:-2] + ".o"
        out = os.path.join(out_dir, obj)
        run = subprocess.run([clang, *CLANG_FLAGS, "-c", src, "-o", out],
                             cwd=HERE, capture_output=True, text=True)
        if run.returncode:
            raise SystemExit(f"clang failed on {src}:\n{run.stderr.strip()}")
        subprocess.run([strip, "-g", out], check=True)
        built.append(obj)
    return built


def check() -> list:
    """The objects whose committed copy differs from a rebuild (or is missing)."""
    with tempfile.TemporaryDirectory(prefix="ustack-bpf-") as tmp:
        return [obj for obj in build(tmp)
                if not os.path.exists(os.path.join(HERE, obj))
                or not filecmp.cmp(os.path.join(tmp, obj), os.path.join(HERE, obj),
                                   shallow=False)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ustack.bpf.build",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="fail if a committed object differs from a rebuild")
    args = parser.parse_args(argv)
    if args.check:
        stale = check()
        if stale:
            print("BPF objects differ from their C (run python -m ustack.bpf.build): "
                  + ", ".join(stale), file=sys.stderr)
            return 1
        print(f"{len(sources())} BPF objects match their C")
        return 0
    for obj in build(HERE):
        print(f"built {obj}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
