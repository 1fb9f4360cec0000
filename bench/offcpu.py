#!/usr/bin/env python3
"""Off-CPU stacks on a context-switch-heavy workload: `ustack offcpu` vs
`perf record -e sched:sched_switch -g` vs a bpftrace offcputime one-liner,
one run.

    sudo python3 bench/offcpu.py [--quick] [-n PASSES] [--reps R]

Builds tests/programs/pingpong.c (-O2 -fomit-frame-pointer, as Debian
builds): two threads pass a byte through two pipes N times, each pass
blocking one thread in read() and waking the other. The program prints
how long its passes took; each tool runs it with -c. Tools run REPS times
round-robin; medians are reported:

  target s     the passes' own time (tool start-up and exit left out)
  slowdown     target s ÷ uninstrumented target s
  µs/switch    (target s − uninstrumented) ÷ the target's context switches
               (perf stat's count on an uninstrumented run)
  wall s       the whole command, start-up, exit and report included
  BPF ns/run   the kernel's own measure of the tool's BPF programs
               (kernel.bpf_stats_enabled, read from the tool's fdinfo while
               it runs): run time ÷ runs; the sched_switch program runs on
               every CPU's switches, the target's or not
  complete     share of the off-CPU time (ustack, bpftrace) or of the
               samples (perf) whose stack reaches main() or the thread's
               function: what the tool's stacks are worth here
  ÷ perf       µs/switch relative to perf record's

The bpftrace program (offcputime's logic, frame-pointer ustack):

    tracepoint:sched:sched_switch {
      $s = @start[args->next_pid];
      if ($s) { @us[@stk[args->next_pid]] = sum(nsecs - $s);
                delete(@start[args->next_pid]); delete(@stk[args->next_pid]); }
      if (pid == cpid) { @start[tid] = nsecs; @stk[tid] = ustack; } }
"""
from __future__ import annotations

import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from uprobe_rate import Failed, run_options, run_rounds, timed, write_report  # noqa: E402
from helpers import O2_NOFP, build, ustack_env  # noqa: E402  (path set by uprobe_rate)

BPFTRACE = """tracepoint:sched:sched_switch {
  $s = @start[args->next_pid];
  if ($s) { @us[@stk[args->next_pid]] = sum(nsecs - $s);
            delete(@start[args->next_pid]); delete(@stk[args->next_pid]); }
  if (pid == cpid) { @start[tid] = nsecs; @stk[tid] = ustack; } }
END { clear(@start); clear(@stk); }"""
ROOTS = ("main", "ponger")
BPF_STATS = "/proc/sys/kernel/bpf_stats_enabled"          # a complete stack reaches one of these


@dataclass
class Run:
    target: float                   # the program's own seconds
    wall: float
    complete: float | None = None   # share of complete stacks, 0..1
    events: int | None = None
    bpf_ns: float | None = None     # ns per run of the tool's BPF programs


class BpfStats:
    """Run time and runs of the BPF programs a process holds, polled from
    its fdinfo while it runs (the last values seen, per program)."""

    def __init__(self):
        self.seen: dict = {}        # fd -> (run_time_ns, run_cnt)
        self.stop = threading.Event()

    def poll(self, pid: int) -> None:
        while not self.stop.is_set():
            try:
                for fd in os.listdir(f"/proc/{pid}/fd"):
                    if os.readlink(f"/proc/{pid}/fd/{fd}") != "anon_inode:bpf-prog":
                        continue
                    with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                        info = f.read()
                    t = re.search(r"run_time_ns:\s+(\d+)", info)
                    n = re.search(r"run_cnt:\s+(\d+)", info)
                    if t and n:
                        self.seen[fd] = (int(t.group(1)), int(n.group(1)))
            except OSError:
                pass
            self.stop.wait(0.02)

    @property
    def ns_per_run(self) -> float | None:
        runs = sum(n for _t, n in self.seen.values())
        return sum(t for t, _n in self.seen.values()) / runs if runs else None


def timed_bpf(cmd: list, timeout: float, env=None):
    """timed(), with the BPF programs' cost: (wall, stdout, stderr, ns/run)."""
    stats = BpfStats()
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, start_new_session=True)
    poller = threading.Thread(target=stats.poll, args=(proc.pid,), daemon=True)
    poller.start()
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    finally:
        stats.stop.set()
        poller.join()
    wall = time.monotonic() - start
    if proc.returncode != 0:
        last = (err.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
        raise Failed(f"exit {proc.returncode}: {last[:120]}")
    return wall, out, err, stats.ns_per_run


def target_seconds(out: str) -> float:
    m = re.search(r"^(\d+\.\d+)$", out, re.M)
    if not m:
        raise Failed(f"no time printed: {out[-200:]!r}")
    return float(m.group(1))


def baseline(prog, n, tmp, timeout):
    wall, out, _ = timed([prog, str(n)], timeout)
    return Run(target_seconds(out), wall)


def ustack_offcpu(*extra):
    def run(prog, n, tmp, timeout):
        folded = tmp / "off.folded"
        wall, out, _, ns = timed_bpf([sys.executable, "-m", "ustack", "offcpu", *extra,
                                      "-f", "folded", "-o", str(folded), "-c",
                                      f"{prog} {n}"], timeout, env=ustack_env())
        total = reached = 0
        for line in folded.read_text().splitlines():
            stack, us = line.rsplit(" ", 1)
            names = stack.split(";")
            if "[woken_by]" in names:
                names = names[:names.index("[woken_by]")]
            total += int(us)
            reached += int(us) if any(r in names for r in ROOTS) else 0
        return Run(target_seconds(out), wall, reached / total if total else None,
                   bpf_ns=ns)
    return run


def perf_record(prog, n, tmp, timeout):
    data = tmp / "perf.data"
    # -B: perf 6.1 aborts at its build-id step on this kernel without it
    wall, out, _ = timed(["perf", "record", "-q", "-B", "-e", "sched:sched_switch", "-g",
                          "-o", str(data), "--", prog, str(n)], timeout)
    _, script, _ = timed(["perf", "script", "-i", str(data), "-F", "ip,sym"], timeout)
    data.unlink()
    samples = [s for s in script.split("\n\n") if s.strip()]
    reached = sum(1 for s in samples if any(            # "\tADDRESS NAME" lines
        line.split()[1:2] in ([r] for r in ROOTS) for line in s.splitlines()))
    return Run(target_seconds(out), wall, reached / len(samples) if samples else None,
               len(samples))


def bpftrace(prog, n, tmp, timeout):
    wall, out, _, ns = timed_bpf(["bpftrace", "-e", BPFTRACE, "-c", f"{prog} {n}"],
                                 timeout)
    # its stacks are named at exit, when the program is gone: not judged
    return Run(target_seconds(out), wall, bpf_ns=ns)


def switches(prog, n, timeout) -> int:
    """The target's context switches, as perf stat counts them."""
    _, _, err = timed(["perf", "stat", "-x,", "-e", "context-switches", "--", prog,
                       str(n)], timeout)
    m = re.search(r"^(\d+),,context-switches", err, re.M)
    if not m:
        raise Failed(f"perf stat said {err[-200:]!r}")
    return int(m.group(1))


def table(results: dict, events: int) -> str:
    base = statistics.median(r.target for r in results["uninstrumented"])

    def cost(runs):
        return (statistics.median(r.target for r in runs) - base) / events * 1e6

    perf = results.get("perf record -e sched:sched_switch -g")
    perf_cost = cost(perf) if isinstance(perf, list) and perf else None
    rows = ["| tool | target s | slowdown | µs/switch | BPF ns/run | wall s | complete "
            "| ÷ perf |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, runs in results.items():
        if isinstance(runs, str):
            rows.append(f"| {name} | {runs} | | | | | | |")
            continue
        target = statistics.median(r.target for r in runs)
        wall = statistics.median(r.wall for r in runs)
        shares = [r.complete for r in runs if r.complete is not None]
        complete = f"{100 * statistics.median(shares):.1f} %" if shares else "-"
        if name == "uninstrumented":
            rows.append(f"| {name} | {target:.3f} | 1.00 | | | {wall:.3f} | | |")
            continue
        c = cost(runs)
        ratio = f"{c / perf_cost:.2f}" if perf_cost else "-"
        bpf_ns = [r.bpf_ns for r in runs if r.bpf_ns is not None]
        per_run = f"{statistics.median(bpf_ns):,.0f}" if bpf_ns else "-"
        rows.append(f"| {name} | {target:.3f} | {target / base:.2f} | {c:.2f} | "
                    f"{per_run} | {wall:.3f} | {complete} | {ratio} |")
    return "\n".join(rows)


def main():
    args, n, reps, out = run_options(__doc__, "offcpu")
    if not args.n:
        n = 20_000 if args.quick else 100_000
    prog = str(build("pingpong", flags=O2_NOFP))
    tools = {"uninstrumented": baseline,
             "ustack offcpu": ustack_offcpu(),
             "ustack offcpu --wakers": ustack_offcpu("--wakers"),
             "perf record -e sched:sched_switch -g": perf_record,
             "bpftrace offcputime one-liner": bpftrace}
    results: dict = {name: [] for name in tools}
    for name, exe in [("perf record -e sched:sched_switch -g", "perf"),
                      ("bpftrace offcputime one-liner", "bpftrace")]:
        if not shutil.which(exe):
            results[name] = f"absent ({exe} not installed)"
    events = switches(prog, n, args.timeout)
    stats_was = Path(BPF_STATS).read_text().strip()
    Path(BPF_STATS).write_text("1")
    with tempfile.TemporaryDirectory(prefix="offcpu.") as tmp:
        run_rounds(tools, results, reps, lambda name, tool: results[name].append(
            tool(prog, n, Path(tmp), args.timeout)))
    Path(BPF_STATS).write_text(stats_was)
    md = (f"## offcpu: off-CPU stacks of ping-pong threads\n\n"
          f"`pingpong {n}` (two threads, {n:,} passes through pipes, "
          f"{events:,} context switches of the target) built -O2 "
          f"-fomit-frame-pointer; medians of {reps} run(s); "
          f"{time.strftime('%Y-%m-%d')}, kernel {platform.release()}, "
          f"{os.cpu_count()} CPUs.\n\n" + table(results, events) + "\n\n"
          "complete: the stack reaches main() or ponger() (through libc's read, "
          "which has no frame pointers); bpftrace's stacks are named at its exit, "
          "after the program is gone, so only ustack's and perf's are judged.\n")
    write_report(md, out)


if __name__ == "__main__":
    main()
