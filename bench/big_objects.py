#!/usr/bin/env python3
"""Stacks through objects of LLVM's size: clang++-14 compiling a
template-heavy file (libLLVM-14: ~950 k unwind rows, libclang-cpp ~1.0 M),
sampled at 99 Hz by, at once on the same compile:
  - ustack profile -p (this tree), and the same from another tree
    (USTACK_BEFORE=DIR: its src/, e.g. `git archive main src`), if given;
  - ustack profile system-wide (this tree), the clang process's samples;
  - perf record --call-graph dwarf -p, then perf script.
A sample "reaches a root" when its outermost frame is _start and no frame
is a cut note; the kernel memory of ustack's maps is read from its bpf map
fds' fdinfo (memlock) while it runs.

    sudo python3 bench/big_objects.py [--rounds N]

Prints Markdown and writes bench/results/big_objects.md."""
from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from helpers import parse_folded, perf_script_samples  # noqa: E402

CLANG = "clang++-14"
SECONDS = 10
HZ = "299"
PERF_PERIOD = 0      # perf's cpu-clock period (ns) instead of -F: --perf-period
SOURCE = r"""
#ifndef INSTANCES
#define INSTANCES 100
#endif
#include <map>
#include <string>
#include <tuple>
#include <variant>
#include <vector>
#include <regex>
#include <sstream>
template <int N> struct Fib { static constexpr long v = Fib<N-1>::v + Fib<N-2>::v; };
template <> struct Fib<1> { static constexpr long v = 1; };
template <> struct Fib<0> { static constexpr long v = 0; };
template <int N> struct Node {
    std::map<std::string, std::vector<Node<N-1>>> kids;
    std::variant<int, double, std::string> val;
};
template <> struct Node<0> { int leaf; };
template <int N> long walk(const Node<N> &n) {
    long s = 0;
    for (auto &[k, v] : n.kids) for (auto &c : v) s += walk(c) + k.size();
    return s + std::visit([](auto &&x) { std::ostringstream o; o << x;
                                         return (long)o.str().size(); }, n.val);
}
template <> long walk(const Node<0> &n) { return n.leaf; }
template <int... Is> long many(std::integer_sequence<int, Is...>) { return (Fib<Is % 40>::v + ...); }
template <int I> long inst() {
    Node<I % 6 + 1> n; std::regex r("a+b*" + std::to_string(I));
    return walk(n) + std::regex_match("aab", r) + I;
}
template <int... Is> long all(std::integer_sequence<int, Is...>) { return (inst<Is>() + ...); }
int main() {
    return (int)(many(std::make_integer_sequence<int, 200>{})
                 + all(std::make_integer_sequence<int, INSTANCES>{}));
}
"""
# 500 instances, not the source's 100: ~2,000 samples a run where 100 gave
# ~750 on this machine (a leaf share's sampling noise, perf's against
# ustack's, was then ~2.5 points for the 37 % of unnamed code, the bar 3);
# a fold of 500 needs a deeper nesting limit than clang's 256
LONGER = ("-DINSTANCES=500", "-fbracket-depth=1024")
CUT = re.compile(r"stack.cut|too.small|\[unknown\]")


def ustack_cmd(src: Path, *args) -> tuple:
    env = dict(os.environ, PYTHONPATH=str(src))
    return [sys.executable, "-m", "ustack", *args], env


def folded_share(path: Path, comm_prefix: str = "clang") -> tuple:
    """(samples reaching _start with no cut note, samples) of clang's stacks."""
    whole = total = 0
    for stack, n in parse_folded(path.read_text()):
        if not stack[0].startswith(comm_prefix):
            continue
        total += n
        frames = stack[1:]
        if frames and frames[0] == "_start" and not any(CUT.search(f) for f in frames):
            whole += n
    return whole, total


def perf_share(text: str) -> tuple:
    whole = total = 0
    for chain in perf_script_samples(text):
        if not chain:
            continue
        total += 1
        if chain[-1][0].startswith("_start"):
            whole += 1
    return whole, total


def map_memory(pid: int) -> int:
    """Bytes of kernel memory (memlock) of the bpf maps process `pid` holds
    (each map once: a map may sit behind several fds)."""
    seen: dict = {}
    try:
        fds = os.listdir(f"/proc/{pid}/fdinfo")
    except OSError:
        return 0
    for fd in fds:
        try:
            text = open(f"/proc/{pid}/fdinfo/{fd}").read()
        except OSError:
            continue
        if "map_type:" in text:
            m = re.search(r"^memlock:\s+(\d+)", text, re.M)
            ident = re.search(r"^map_id:\s+(\d+)", text, re.M)
            seen[ident[1] if ident else fd] = int(m[1]) if m else 0
    return sum(seen.values())


def wait_mapped(pid: int, name: str, timeout: float = 60) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            if name in open(f"/proc/{pid}/maps").read():
                return
        except OSError:
            raise SystemExit("clang ended before it mapped " + name)
        time.sleep(0.01)
    raise SystemExit(f"clang did not map {name} within {timeout} s")


DEEP = "65528"       # the most --stack-size and perf's dwarf dump size take


def leaf_key(name: str) -> str:
    """A leaf's name as perf script's `sym` and ustack's folded lines both
    give it: no parameters (perf prints none), spaces and underscores
    dropped (folded lines make spaces underscores), code without a symbol
    `[unknown]` (ustack names it fn@0x... by its CFI)."""
    if name.startswith("fn@0x") or name.startswith("[unknown"):
        return "[unknown]"
    name = re.sub(r"\+0x[0-9a-f]+$", "", name)
    # perf keeps a symbol's version (cfree@GLIBC_2.2.5), ustack shows the name
    name = re.sub(r"@[A-Z][\w.]*$", "", name)
    cut = re.search(r"\((?!anonymous)", name)
    return re.sub(r"[ _]", "", name[:cut.start()] if cut else name)


def leaf_shares(stacks: list) -> dict:
    """leaf function (leaf_key) -> share of samples."""
    total = sum(n for _leaf, n in stacks) or 1
    out: dict = {}
    for leaf, n in stacks:
        key = leaf_key(leaf)
        out[key] = out.get(key, 0) + n / total
    return out


def folded_leaves(path: Path, comm_prefix: str = "clang") -> list:
    return [(stack[-1], n) for stack, n in parse_folded(path.read_text())
            if stack[0].startswith(comm_prefix) and len(stack) > 1]


def one_round(work: Path, before: Path | None) -> tuple:
    clang = subprocess.Popen([CLANG, "-O2", "-std=c++17", *LONGER, "-c", str(work / "heavy.cpp"),
                              "-o", str(work / "heavy.o")], stderr=subprocess.DEVNULL)
    procs: dict = {}
    perfs: dict = {}
    try:
        wait_mapped(clang.pid, "libclang-cpp")
        pid = ["-p", str(clang.pid)]
        runs = {"ustack -p": (REPO / "src", pid),
                f"ustack -p --stack-size {DEEP}": (REPO / "src", pid + ["--stack-size", DEEP]),
                f"ustack whole machine --stack-size {DEEP}": (REPO / "src",
                                                             ["--stack-size", DEEP])}
        if before is not None:
            runs["ustack -p (before)"] = (before / "src", pid)
        for name, (src, target) in runs.items():
            out = work / (re.sub(r"\W+", "_", name) + ".folded")
            cmd, env = ustack_cmd(src, "profile", "-F", HZ, "-d", str(SECONDS), "--backend",
                                  "bpf", "-f", "folded", "-o", str(out), *target)
            procs[name] = (subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True), out)
        memory = {}
        for name, (p, _out) in procs.items():      # once the header is out: maps made
            header = p.stderr.readline()
            memory[name] = (map_memory(p.pid), header.strip())
        # perf starts once every ustack run samples: the same window of the
        # compile (its phases differ: Sema in libclang-cpp, then LLVM's
        # passes), else a run that starts later sees more of libLLVM
        for name, mode in (("perf --call-graph dwarf", "dwarf"),
                           (f"perf --call-graph dwarf,{DEEP}", f"dwarf,{DEEP}")):
            data = work / (re.sub(r"\W+", "_", name) + ".data")
            perfs[name] = (subprocess.Popen(
                ["perf", "record", "-B", "-q", "--call-graph", mode,
                 *(["-e", "cpu-clock", "-c", str(PERF_PERIOD)] if PERF_PERIOD else ["-F", HZ]),
                 "-p", str(clang.pid), "-o", str(data), "--", "sleep", str(SECONDS)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL), data)
        result, leaves = {}, {}
        for name, (p, out) in procs.items():
            err = p.communicate()[1]
            whole, total = folded_share(out)
            result[name] = (whole, total, memory[name][0], memory[name][1], err.strip())
            leaves[name] = leaf_shares(folded_leaves(out))
        for name, (p, data) in perfs.items():
            p.wait()
            script = subprocess.run(["perf", "script", "--no-inline", "-i", str(data),
                                     "-F", "comm,ip,sym,dso"],
                                    capture_output=True, text=True).stdout
            samples = perf_script_samples(script)
            whole, total = perf_share(script)
            result[name] = (whole, total, 0, "", "")
            users = [[f for f in chain if "kernel" not in f[1] and f[1] != "inlined"]
                     for chain in samples]       # ustack shows neither without options
            leaves[name] = leaf_shares([(chain[0][0], 1) for chain in users if chain])
        return result, leaves
    finally:
        for p, _out in procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
                p.wait()
        for p, _data in perfs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
        clang.kill()
        clang.wait()


def top_gap(ours: dict, perf: dict, n: int = 20) -> tuple:
    """The largest difference, in points, between our share and perf's of
    perf's top-n leaf functions, and that function."""
    top = sorted(perf, key=perf.get, reverse=True)[:n]
    return max(((abs(ours.get(f, 0) - perf[f]) * 100, f) for f in top), default=(0.0, ""))


def main() -> None:
    global SECONDS, HZ, PERF_PERIOD
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=SECONDS, help="of sampling, each round")
    ap.add_argument("--hz", default=HZ)
    ap.add_argument("--perf-period", type=int, default=0, metavar="NS",
                    help="perf samples every NS of cpu-clock instead of at --hz")
    ap.add_argument("--out", default="big_objects.md", help="its name in bench/results/")
    ap.add_argument("--keep", metavar="DIR", help="keep the last round's outputs in DIR")
    opts = ap.parse_args()
    SECONDS, HZ, PERF_PERIOD = opts.seconds, str(opts.hz), opts.perf_period
    before = Path(os.environ["USTACK_BEFORE"]) if os.environ.get("USTACK_BEFORE") else None
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(opts.keep or tmp)
        work.mkdir(parents=True, exist_ok=True)
        (work / "heavy.cpp").write_text(SOURCE)
        gaps = []
        for i in range(opts.rounds):
            result, leaves = one_round(work, before)
            for name, (whole, total, mem, header, err) in result.items():
                rows.append((i + 1, name, whole, total, mem, header, err))
                print(i + 1, name, whole, total, mem, file=sys.stderr)
            perf = leaves[f"perf --call-graph dwarf,{DEEP}"]
            gaps.append((i + 1, {name: top_gap(l, perf) for name, l in leaves.items()
                                 if name.startswith("ustack")}))
            last_leaves = leaves
    lines = [f"# Big objects: clang++-14 -O2 on a template-heavy file, {HZ} Hz, "
             f"{SECONDS} s of it, all tools at once", "",
             f"{time.strftime('%Y-%m-%d')}, kernel {os.uname().release}, 2 CPUs shared "
             "(loaded). `python3 bench/big_objects.py`. A sample reaches a root when its "
             "outermost frame is `_start` and no frame is a cut note. Memory: memlock of "
             "ustack's BPF maps (rows, pages, objects, stacks, counts...).", "",
             "| round | tool | reach a root | samples | share | ustack maps (MiB) |",
             "| --- | --- | --- | --- | --- | --- |"]
    for rnd, name, whole, total, mem, _h, _e in rows:
        share = f"{100 * whole / total:.1f} %" if total else "-"
        lines.append(f"| {rnd} | {name} | {whole} | {total} | {share} | "
                     f"{mem / (1 << 20):.1f} |" if mem else
                     f"| {rnd} | {name} | {whole} | {total} | {share} | - |")
    lines += ["", f"Top-20 leaf functions of perf --call-graph dwarf,{DEEP}: the largest gap "
              "(points) between a tool's share and perf's:", ""]
    for rnd, by_tool in gaps:
        lines.append(f"- round {rnd}: " + ", ".join(f"{name} {gap:.1f} (`{f[:40]}`)"
                                                    for name, (gap, f) in by_tool.items()))
    perf = last_leaves[f"perf --call-graph dwarf,{DEEP}"]
    tools = [name for name in last_leaves if name.startswith("ustack")]
    lines += ["", "The last round's top-20 leaf functions of perf (shares, %):", "",
              "| function | perf | " + " | ".join(tools) + " |",
              "| --- | --- | " + " | ".join("---" for _ in tools) + " |"]
    for f in sorted(perf, key=perf.get, reverse=True)[:20]:
        lines.append(f"| `{f[:70]}` | {100 * perf[f]:.1f} | "
                     + " | ".join(f"{100 * last_leaves[t].get(f, 0):.1f}" for t in tools) + " |")
    lines += ["", "Headers and summaries of the last round:", ""]
    last = max(r[0] for r in rows)
    for rnd, name, _w, _t, _m, header, err in rows:
        if rnd == last and (header or err):
            lines += [f"- {name}: `{header}` {err}".rstrip()]
    text = "\n".join(lines) + "\n"
    print(text)
    (REPO / "bench" / "results" / opts.out).write_text(text)


if __name__ == "__main__":
    main()
