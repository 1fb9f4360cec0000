#!/usr/bin/env python3
"""What the Python pass (src/ustack/bpf/python.h) adds to each BPF program
that walks a stack: the instructions the verifier processed
(`verified_insns`) with the pass's option on and off (off, the verifier
drops it as dead code), against the kernel's limit of 1,000,000. With
--passes, each interpreter pass's alone and all of them on (the default
of a run), with the load's time (the bpf(2) call, median of --reps).

    sudo python3 bench/python_pass_size.py      # src/ of this checkout
    sudo python3 bench/python_pass_size.py --passes [--reps 5]

Loads each program once with maps as the C declares them (the unwinder's
row table as a run makes it: UnwindMaps); attaches nothing."""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from ustack.capture.bpf_unwind import UnwindMaps, kernel_rodata  # noqa: E402
from ustack.capture.kernel_offsets import Offsets  # noqa: E402
from ustack.capture.bpf_counter import bpf_program_object  # noqa: E402
from ustack.kernel import bpf_syscall  # noqa: E402

# (object, program, program type, its options' variable and enum, the
# options always on, the pass's option)
PROGRAMS = (
    ("unwind", "unwind_count", bpf_syscall.PROG_PERF_EVENT, "options", "unwind_option",
     ("UW_DEFER",), "UW_PYTHON"),
    ("unwind", "unwind_trace", bpf_syscall.PROG_KPROBE, "options", "unwind_option",
     ("UW_DEFER",), "UW_PYTHON"),
    ("offcpu", "offcpu_switch", None, "off_options", "offcpu_option",
     ("OFF_USER_ONLY",), "OFF_PYTHON"),
    ("offcpu", "offcpu_waking", bpf_syscall.PROG_TRACEPOINT, "off_options", "offcpu_option",
     ("OFF_USER_ONLY",), "OFF_PYTHON"),
    ("latency", "latency_entry", bpf_syscall.PROG_KPROBE, "options", "latency_option",
     ("LAT_DWARF_STACK",), "LAT_PYTHON"),
    ("memleak", "memleak_entry", bpf_syscall.PROG_KPROBE, "ml_options", "memleak_option",
     (), "ML_PYTHON"),
)


PASSES = ("PYTHON", "V8", "PHP", "PERL", "RUBY")


def verified(obj_name: str, program: str, prog_type, variable: str, enum: str,
             always: tuple, python: str | None, timed: list | None = None) -> int:
    """Verified instructions of the program with the pass options in
    `python` (one name, or several separated by spaces) on; its load's
    milliseconds appended to `timed`."""
    obj = bpf_program_object(obj_name)
    bits = obj.enum(enum)
    off = Offsets.of_this_kernel()
    unwind_maps = UnwindMaps(1 << 16, 16, 16, objects=16, vmas=16, pages_capacity=16)
    rodata = {**kernel_rodata(off, unwind_maps), "task_fsbase": off.task_fsbase,
              variable: sum(bits[b] for b in always)
              | sum(bits[p] for p in (python or "").split())}
    if obj_name == "offcpu":
        rodata.update(task_pid=off.task_pid, task_exit_state=off.task_exit_state,
                      task_stack=off.task_stack)
    maps: dict = {"row_chunks": unwind_maps.rows.outer}
    try:
        start = time.perf_counter()
        fd = obj.load(program, maps, rodata, prog_type, "ustack_pysize")
        if timed is not None:
            timed.append((time.perf_counter() - start) * 1000)
        try:
            return bpf_syscall.verified_insns(fd)
        finally:
            os.close(fd)
    finally:
        for m in maps.values():
            m.close()
        unwind_maps.close()


def passes(reps: int) -> None:
    """Each pass alone and all of them: verified instructions, load ms."""
    print(f"load average {os.getloadavg()[0]:.1f}; load ms: medians of {reps}\n")
    print("| program | none | " + " | ".join(p.lower() for p in PASSES) + " | all |")
    print("|---|" + "---:|" * (len(PASSES) + 2))
    for obj, program, ptype, variable, enum, always, python in PROGRAMS:
        prefix = python.split("_")[0]
        cells = []
        for on in ("", *(f"{prefix}_{p}" for p in PASSES),
                   " ".join(f"{prefix}_{p}" for p in PASSES)):
            timed: list = []
            for _ in range(reps):
                n = verified(obj, program, ptype, variable, enum, always, on or None, timed)
            cells.append(f"{n} ({statistics.median(timed):.0f} ms)")
        print(f"| {obj}.bpf.c {program} | " + " | ".join(cells) + " |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--passes", action="store_true")
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    if a.passes:
        passes(a.reps)
        return
    print("| program | verified, no Python pass | with it | added |")
    print("|---|---:|---:|---:|")
    for obj, program, ptype, variable, enum, always, python in PROGRAMS:
        without = verified(obj, program, ptype, variable, enum, always, None)
        with_ = verified(obj, program, ptype, variable, enum, always, python)
        print(f"| {obj}.bpf.c {program} | {without} | {with_} | {with_ - without} |")


if __name__ == "__main__":
    main()
