#!/usr/bin/env python3
"""Runs `ustack ARGS...` in this process with a clock on its start-up and
end stages: for each function named in STAGES, when it was first entered
and last left (seconds from LAUNCH, the CLOCK_MONOTONIC nanoseconds the
caller read just before starting this process), how many calls and their
total time, across every thread; and the CPU seconds the process had
used at the first entry (its threads' together). Written as one JSON object to OUT when
ustack ends. Used by bench/cold_start.py --stages.

    python3 bench/stage_clock.py LAUNCH_NS OUT ARGS...
"""
from __future__ import annotations

import functools
import importlib
import json
import os
import sys
import threading
import time

LAUNCH = int(sys.argv[1]) / 1e9
OUT = sys.argv[2]
AT_INTERPRETER = time.monotonic() - LAUNCH

# (label, module, qualified name): the stages of a run, in their order
STAGES = [
    ("set-up", "ustack.session", "Session._set_up"),
    ("resolve probes", "ustack.session", "resolve_probes"),
    ("prepare ahead", "ustack.target.ahead", "prepare"),
    ("kernel offsets (BTF)", "ustack.capture.kernel_offsets", "Offsets.of_this_kernel"),
    ("BTF walk", "ustack.kernel.btf", "vmlinux_offsets"),
    ("open capture", "ustack.session", "Session._open_capture"),
    ("objects of target", "ustack.capture.bpf_unwind", "objects_of_target"),
    ("interpreters' objects", "ustack.capture.bpf_unwind", "interpreters_objects"),
    ("rows capacity (ELF headers)", "ustack.capture.bpf_unwind", "rows_capacity"),
    ("machine maps scan", "ustack.capture.lazy_rows", "ObjectPaths.scan"),
    ("new counter", "ustack.capture.bpf_capture", "BpfCapture._new_counter"),
    ("load programs", "ustack.capture.bpf_counter", "BpfCounter.load_programs"),
    ("rows add_path", "ustack.capture.bpf_unwind", "UnwindObjects.add_path"),
    ("open events", "ustack.capture.perf", "PerfCapture.open"),
    ("attach", "ustack.capture.bpf_counter", "BpfCounter.attach"),
    ("tracker from /proc", "ustack.target.mappings", "MappingTracker.seed_target"),
    ("header", "ustack.commands.run", "_header"),
    ("stream start", "ustack.session", "Session.start"),
    ("stacks resolved", "ustack.symbols.stacks", "StackResolver.stacks"),
    ("stack resolved", "ustack.symbols.stacks", "StackResolver.stack"),
    ("resolver key", "ustack.symbols.stacks", "StackResolver.key"),
    ("ELF symbol lookups", "ustack.symbols.elf_source", "ElfSource.resolve"),
    ("builder child asked", "ustack.objfile.builders", "start"),
    ("wait for a builder", "ustack.objfile.builders", "wait"),
    ("functions built or read back", "ustack.objfile.elf", "ElfImage._build_deferred"),
    ("functions scanned (index)", "ustack.objfile.symbol_scan", "SymbolScan.__init__"),
    ("CFI for the user-space unwinder", "ustack.unwind.cfi_index", "for_unwinder"),
    ("kernel counted read", "ustack.counting.tally", "kernel_counted"),
    ("stacks named (stack_counts)", "ustack.counting.tally", "stack_counts"),
    ("report finish", "ustack.report.folded", "FoldedReport.finish"),
    ("capture stopped (sampling over)", "ustack.capture.bpf_capture", "BpfCapture.stop"),
    ("capture close", "ustack.capture.closer", "close_capture"),
]

records: dict = {}
lock = threading.Lock()
# with STAGE_CALLS set: (label, from, to, first string argument) of each call
# of these stages, which object each one was about
CALLS_OF = {"rows add_path", "builder child asked", "functions built or read back",
            "functions scanned (index)", "CFI for the user-space unwinder",
            "wait for a builder"}
calls: list = []


def clocked(label, fn):
    @functools.wraps(fn)
    def run(*args, **kw):
        t0 = time.monotonic()
        # this process's CPU so far, every thread's: at the first entry only
        # (each read sums every thread's clock: ~0.6 ms at 20 threads)
        cpu = time.process_time() if label not in records else None
        try:
            return fn(*args, **kw)
        finally:
            t1 = time.monotonic()
            with lock:
                r = records.setdefault(label, {"first": t0 - LAUNCH, "cpu": cpu,
                                               "calls": 0, "total": 0.0})
                r["calls"] += 1
                r["total"] += t1 - t0
                r["last_end"] = t1 - LAUNCH
                if label in CALLS_OF and os.environ.get("STAGE_CALLS"):
                    what = next((str(getattr(a, "path", a)) for a in args
                                 if isinstance(getattr(a, "path", a), (str, tuple))), "")
                    calls.append((label, t0 - LAUNCH, t1 - LAUNCH, what))
    return run


def install() -> None:
    for label, module, qual in STAGES:
        try:
            owner = importlib.import_module(module)
        except ImportError:
            continue
        *path, name = qual.split(".")
        for part in path:
            owner = getattr(owner, part, None)
        if owner is None or not hasattr(owner, name):
            continue
        setattr(owner, name, clocked(label, getattr(owner, name)))
        # modules that imported the name before the clock went on
        for mod in list(sys.modules.values()):
            if not path and getattr(mod, name, None) is getattr(owner, name).__wrapped__:
                setattr(mod, name, getattr(owner, name))


def first_sample_clock() -> None:
    """When the first piece with samples passed (Session._applied)."""
    from ustack import session

    applied = session.Session._applied

    def seen(self, piece):
        if piece.samples and "first sample" not in records:
            records["first sample"] = {"first": time.monotonic() - LAUNCH}
        return applied(self, piece)
    session.Session._applied = seen


def dump() -> None:
    records["interpreter up"] = {"first": AT_INTERPRETER}
    records["end"] = {"first": time.monotonic() - LAUNCH, "cpu": time.process_time()}
    if calls:
        records["_calls"] = sorted(calls, key=lambda c: c[1])
    with open(OUT, "w") as f:
        json.dump(records, f)


import ustack.cli  # noqa: E402
import ustack.session  # noqa: E402,F401
records["imports done"] = {"first": time.monotonic() - LAUNCH}
install()
first_sample_clock()
sys.argv = ["ustack", *sys.argv[3:]]
if os.environ.get("STAGE_PROFILE"):     # cProfile of the main thread, to that file
    import cProfile
    # STAGE_PROFILE_CPU: the main thread's CPU time, not the clock's
    profile = (cProfile.Profile(time.thread_time) if os.environ.get("STAGE_PROFILE_CPU")
               else cProfile.Profile())
    status = profile.runcall(ustack.cli.main)
    profile.dump_stats(os.environ["STAGE_PROFILE"])
else:
    status = ustack.cli.main()      # entry() without its os._exit
dump()
sys.stdout.flush()
sys.stderr.flush()
os._exit(status)
