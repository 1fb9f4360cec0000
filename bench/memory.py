#!/usr/bin/env python3
"""Peak memory of a long run at the machine's highest event rate: ustack's
backends vs perf record and bpftrace, the same workloads, one run.

    sudo python3 bench/memory.py [--seconds 30] [--only uprobe|syscall]

Workloads (each started once per tool, attached with -p, run for SECONDS):
  uprobe   `chain 10**12`: a uprobe on d, hit in a tight loop (`push %rbp`
           first: the kernel emulates it, the fastest uprobe there is)
  syscall  `chain 10**12 rawwrite`: d issues write(2) itself, as fast as it
           can; the event is syscall:write (sys_enter_write)

Per tool: peak RSS (the kernel's ru_maxrss of the process, from wait4), RSS
at a third, two thirds and the end of the run (growth to the end means
memory is not bounded), the events the tool says it saw and lost. perf records to a
pipe into /dev/null (-o -): no multi-GB perf.data on disk, no post-pass.

Prints a Markdown table and writes it to bench/results/memory.md.
"""
from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from helpers import O2_FP, build, ustack_env  # noqa: E402  (one build recipe)

USTACK = [sys.executable, "-m", "ustack"]
PERF_PROBE = "memb:d"        # perf probe's group:name; no "ustack" in it


def workloads(chain: Path) -> dict:
    """name -> (target argv, ustack event, perf event, bpftrace probe)."""
    return {
        "uprobe": ([chain, 10 ** 12], f"uprobe:{chain}:d", PERF_PROBE,
                   f"uprobe:{chain}:d"),
        "syscall": ([chain, 10 ** 12, "rawwrite"], "syscall:write",
                    "syscalls:sys_enter_write",
                    "tracepoint:syscalls:sys_enter_write /pid == $1/"),
    }


def tools(event: str, perf_event: str, bpf_probe: str, pid: int, seconds: int,
          out: str) -> dict:
    """name -> argv of each tool on one workload."""
    u = [*USTACK, "count", event, "-p", str(pid), "-d", str(seconds), "-f", "folded",
         "-o", out]
    perf = ["perf", "record", "-e", perf_event, "-p", str(pid), "-o", "-"]
    return {
        "ustack count --backend perf": u + ["--backend", "perf"],
        "ustack count --backend bpf": u + ["--backend", "bpf"],
        "ustack count --backend tracefs": u + ["--backend", "tracefs"],
        "ustack count --backend perf --unwind dwarf": u + ["--backend", "perf",
                                                           "--unwind", "dwarf"],
        "ustack trace --backend perf (stdout → /dev/null)":
            [*USTACK, "trace", event, "-p", str(pid), "-d", str(seconds),
             "--backend", "perf"],
        "perf record -g": perf + ["-g", "--", "sleep", str(seconds)],
        "perf record --call-graph dwarf": perf + ["--call-graph", "dwarf", "--",
                                                  "sleep", str(seconds)],
        "bpftrace @[ustack] = count()":
            ["bpftrace", "-e", f"{bpf_probe} {{ @[ustack] = count(); }} "
             f"interval:s:{seconds} {{ exit(); }}", str(pid)],
    }


class PerfStream(threading.Thread):
    """Counts SAMPLE records and the LOST records' counts in perf's pipe
    output (`-o -`) as it flows, headers only: what perf wrote and lost."""

    def __init__(self, fd: int):
        super().__init__(daemon=True)
        self.fd, self.samples, self.lost = fd, 0, 0

    def run(self) -> None:
        header = struct.Struct("<IHH")
        skip, carry = 16, b""             # the pipe header: magic and size
        while True:
            data = os.read(self.fd, 1 << 20)
            if not data:
                return
            data, i = carry + data, 0
            carry = b""
            if skip:
                step = min(skip, len(data))
                i, skip = step, skip - step
            while not skip:
                if len(data) - i < 24:
                    carry = data[i:]
                    break
                kind, _misc, size = header.unpack_from(data, i)
                if kind == 66:             # HEADER_TRACING_DATA: its data follows
                    size += (struct.unpack_from("<I", data, i + 8)[0] + 7) & ~7
                if kind == 9:
                    self.samples += 1
                elif kind == 2:
                    self.lost += struct.unpack_from("<Q", data, i + 16)[0]
                if size < 8:               # lost track: drain uncounted
                    self.samples = self.lost = None
                    while os.read(self.fd, 1 << 20):
                        pass
                    return
                if i + size <= len(data):
                    i += size
                else:
                    skip, i = i + size - len(data), len(data)


def rss_kb(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def measure(argv: list, seconds: int, env: dict) -> dict:
    """Run argv (its stdout to /dev/null, stderr kept); peak RSS and RSS
    over time."""
    err = tempfile.TemporaryFile(mode="w+")
    start = time.monotonic()
    # bpftrace prints its maps on stdout: kept; the others' stdout is data
    keep, perf = argv[0] == "bpftrace", argv[0] == "perf"
    proc = subprocess.Popen([str(a) for a in argv],
                            stdout=err if keep else subprocess.PIPE if perf
                            else subprocess.DEVNULL,
                            stderr=err, env=env, start_new_session=True)
    counter = None
    if perf:
        counter = PerfStream(proc.stdout.fileno())
        counter.start()
    samples = []
    deadline = start + seconds + 60
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        now = time.monotonic()
        if now > deadline:
            os.killpg(proc.pid, signal.SIGINT)
            deadline = now + 30
        kb = rss_kb(proc.pid)
        if kb is not None:
            samples.append((now - start, kb))
        time.sleep(0.5)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if counter is not None:
        counter.join()
        proc.stdout.close()
    err.seek(0)
    text = err.read()

    def at(t):
        before = [kb for s, kb in samples if s <= t]
        return before[-1] if before else None

    return {"peak": usage.ru_maxrss, "third": at(seconds / 3),
            "two_thirds": at(2 * seconds / 3), "end": at(seconds + 1),
            "status": proc.returncode, "stderr": text, "wall": time.monotonic() - start,
            "perf": counter and (counter.samples, counter.lost)}


def events_of(name: str, out: Path, stderr: str, perf) -> tuple:
    """(events seen, events lost) as the tool reports them; None: not said."""
    if perf is not None:
        return perf if perf[0] is not None else (None, None)
    lost = None
    m = re.search(r"^Lost (\d[\d,]*) events", stderr, re.M)       # ustack
    if m:
        lost = int(m.group(1).replace(",", ""))
    if name.startswith("ustack count") and out.exists():
        seen = sum(int(l.rsplit(" ", 1)[1]) for l in out.read_text().splitlines() if l)
        return seen, lost or 0
    if name.startswith("bpftrace"):
        counts = re.findall(r"\]: (\d+)$", stderr, re.M)
        return (sum(map(int, counts)) if counts else None), None
    return None, lost


def mb(kb) -> str:
    return "-" if kb is None else f"{kb / 1024:.0f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=int, default=30)
    ap.add_argument("--only", choices=("uprobe", "syscall"))
    ap.add_argument("--tools", help="only tools whose name contains this text")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root (uprobes, perf events, BPF)")
    chain = build("chain", flags=O2_FP)
    env = ustack_env()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        binary = Path(tmp) / "chain"          # its own inode: only our probes fire on it
        shutil.copy2(chain, binary)
        subprocess.run(["perf", "probe", "-q", "-d", PERF_PROBE], capture_output=True)
        subprocess.run(["perf", "probe", "-q", "-x", str(binary), f"{PERF_PROBE}=d"],
                       check=True, capture_output=True)
        try:
            for wname, (target_argv, event, perf_event, bpf_probe) in workloads(binary).items():
                if args.only and wname != args.only:
                    continue
                for tname in tools(event, perf_event, bpf_probe, 0, args.seconds, ""):
                    if args.tools and args.tools not in tname:
                        continue
                    target = subprocess.Popen([str(a) for a in target_argv])
                    out = Path(tmp) / "counts.folded"
                    out.unlink(missing_ok=True)
                    try:
                        argv = tools(event, perf_event, bpf_probe, target.pid,
                                     args.seconds, str(out))[tname]
                        print(f"{wname}: {tname} …", file=sys.stderr, flush=True)
                        r = measure(argv, args.seconds, env)
                    finally:
                        target.kill()
                        target.wait()
                    seen, lost = events_of(tname, out, r["stderr"], r["perf"])
                    if r["status"] != 0:
                        print(r["stderr"][-2000:], file=sys.stderr)
                    rows.append((wname, tname, r, seen, lost))
        finally:
            subprocess.run(["perf", "probe", "-q", "-d", PERF_PROBE], capture_output=True)

    lines = [f"## Peak memory of a {args.seconds} s run at the highest event rate",
             "",
             f"{time.strftime('%Y-%m-%d')}, kernel {platform.release()}, "
             f"{os.cpu_count()} CPUs; `chain` built -O2 -fno-omit-frame-pointer, "
             "attached with -p; each tool on a fresh target, one after the other. "
             "Peak: ru_maxrss; RSS at a third, two thirds and the end of the run (a "
             "bounded tool's RSS stops growing). perf writes to a pipe (`-o -`) read by this "
             "script, which counts its SAMPLE records and LOST counts.",
             "",
             "| workload | tool | peak RSS MB | RSS @⅓ MB | RSS @⅔ MB | RSS @end MB | events | events/s | lost | exit |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for wname, tname, r, seen, lost in rows:
        rate = f"{seen / args.seconds:,.0f}" if seen else "-"
        lines.append(f"| {wname} | {tname} | {mb(r['peak'])} | {mb(r['third'])} | "
                     f"{mb(r['two_thirds'])} | {mb(r['end'])} | {'-' if seen is None else f'{seen:,}'} | {rate} | "
                     f"{'-' if lost is None else f'{lost:,}'} | {r['status']} |")
    text = "\n".join(lines) + "\n"
    print(text)
    results = REPO / "bench" / "results"
    results.mkdir(exist_ok=True)
    if not args.only and not args.tools:
        (results / "memory.md").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
