"""`ustack dump -p PID`: every thread's stack once, native and Python (as
pstack, eu-stack, py-spy dump). Each thread is stopped with PTRACE_SEIZE +
PTRACE_INTERRUPT only while its registers, its stack's bytes and its
Python frames are read; all are detached before anything is unwound or
named, whatever happens (signals that would end ustack wait until then).
A thread created meanwhile is not seized, so it never stops.

The pause is kept short on a busy machine: everything that can be done
before the stop is (thread names and states, the maps, seizing, which
stops nothing), every thread is interrupted at once and let go at once,
all stacks are read in one process_vm_readv, and ustack runs as a
real-time thread for the pause (root may), so busy processes beside it
do not take its CPU between the stop and the resume."""
from __future__ import annotations

import bisect
import json
import os
import signal
import sys
import time

from .. import unprivileged
from ..kernel import procfs, process_vm, ptrace
from ..model import SCRIPT_KINDS, Frame, SymbolOptions, UstackError
from ..options import symbol_options
from ..output import Output
from ..report.output import choose_format
from ..report.text import format_duration, frame_line
from ..symbols.python import PythonCode
from ..symbols.symbolizer import Symbolizer
from ..target.mappings import MappingTracker
from ..unwind import python_frames
from ..unwind.dwarf import DwarfUnwinder
from ..unwind.python_runtime import find_interpreter

STACK_BYTES = 512 << 10     # read above each thread's sp (up to its mapping's end)
STATES = {"R": "running", "S": "sleeping", "D": "disk sleep", "T": "stopped",
          "t": "tracing stop", "Z": "zombie", "X": "dead", "I": "idle", "P": "parked"}
_HELD = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


class Captured:
    """What was read of one thread while it was stopped."""
    __slots__ = ("tid", "comm", "state", "regs", "stack", "groups", "note")

    def __init__(self, tid: int, comm: str, state: str):
        self.tid, self.comm, self.state = tid, comm, state
        self.regs: dict = {}
        self.stack = b""
        self.groups: tuple = ()
        self.note = ""


class ThreadStack:
    """One thread's named stack, innermost frame first."""
    __slots__ = ("tid", "comm", "state", "frames", "notes")

    def __init__(self, tid: int, comm: str, state: str, frames: tuple, notes: tuple):
        self.tid, self.comm, self.state = tid, comm, state
        self.frames, self.notes = frames, notes


def _not_readable(pid: int) -> None:
    """Refuse a process that exists but whose maps cannot be read, saying
    so (not "no process")."""
    why = procfs.maps_error(pid) if procfs.process_exists(pid) else None
    if why:
        raise UstackError(f"process {pid} ({procfs.comm(pid) or '?'}) exists, but "
                          f"/proc/{pid}/maps cannot be read: {why}")


def check_target(pid: int) -> None:
    """Refuse, in one sentence, what cannot or must not be stopped."""
    if pid == os.getpid():
        raise UstackError("ustack cannot dump its own process")
    if not procfs.process_exists(pid):
        raise UstackError(f"no process {pid}")
    if procfs.is_kernel_thread(pid):
        raise UstackError(f"process {pid} is a kernel thread: it has no user stack")
    unprivileged.check_dump(pid)
    tracer = tracer_of(pid)
    if tracer:
        raise UstackError(f"process {pid} is already traced by {tracer} "
                          f"({procfs.comm(tracer) or '?'}); detach it first")


def tracer_of(pid: int) -> int:
    """The TracerPid of /proc/PID/status (0: none)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("TracerPid:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def thread_state(pid: int, tid: int) -> str:
    try:
        with open(f"/proc/{pid}/task/{tid}/stat") as f:
            stat = f.read()
    except OSError:
        return "?"
    return stat[stat.rfind(")") + 2:stat.rfind(")") + 3] or "?"


def capture(pid: int, interp, realtime: bool = True) -> tuple:
    """(captured threads, nanoseconds the process was stopped: from the
    first PTRACE_INTERRUPT to the last detach); `realtime`: as a SCHED_FIFO
    thread during the pause, when allowed."""
    held = signal.pthread_sigmask(signal.SIG_BLOCK, _HELD)
    seized: list = []
    stopped: list = []
    mem = procfs.ProcessMemory(pid)
    ends = mapping_ends(pid)
    # all that needs no stop, first: names and states (as they were before
    # the stop), and seizing, which stops nothing
    threads = [Captured(tid, procfs.comm(pid, tid), thread_state(pid, tid))
               for tid in procfs.threads(pid)]
    t0 = None
    try:
        for c in threads:
            try:
                ptrace.seize(c.tid)
            except ProcessLookupError:
                continue                          # gone meanwhile
            except OSError as e:
                raise UstackError(f"cannot stop thread {c.tid} of process {pid}: "
                                  f"{e.strerror}") from None
            seized.append(c)
        with Realtime(realtime):
            t0 = time.monotonic_ns()
            try:
                for c in seized:
                    try:
                        ptrace.interrupt(c.tid)
                    except ProcessLookupError:
                        pass                      # exiting: waitpid sees its exit
                for c in seized:
                    _, status = os.waitpid(c.tid, ptrace.WALL)
                    if os.WIFSTOPPED(status):
                        stopped.append(c)
                _read_stopped(pid, stopped, mem, ends, interp)
            finally:
                _detach(seized)
                took = time.monotonic_ns() - t0
    finally:
        if t0 is None:                            # failed while seizing
            _detach(seized)
        mem.close()
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
    return [c for c in stopped if c.regs], took


def _read_stopped(pid: int, stopped: list, mem, ends: list, interp) -> None:
    """Registers, stack bytes (one process_vm_readv for all threads) and
    Python frames of the stopped threads."""
    for c in stopped:
        try:
            c.regs = ptrace.registers(c.tid)
        except ProcessLookupError:
            c.regs = {}                           # killed while stopped
    read = [c for c in stopped if c.regs]
    ranges = [(c.regs["sp"], max(0, min(STACK_BYTES, end_of_mapping(ends, c.regs["sp"])
                                        - c.regs["sp"]))) for c in read]
    try:
        stacks = process_vm.read_ranges(pid, ranges)
    except OSError:
        stacks = [b""] * len(read)
    states = _thread_states(mem, interp)
    for c, stack in zip(read, stacks):
        c.stack = stack
        tstate = states.get(c.regs["fs_base"])
        if tstate:
            c.groups, c.note = python_frames.frame_groups(mem, interp, tstate)


def _detach(seized: list) -> None:
    """Let every seized thread go, stopped or not, as it was."""
    for c in seized:
        try:
            ptrace.detach(c.tid)
        except OSError:
            pass                                  # exited while stopped


class Realtime:
    """The calling thread as SCHED_FIFO (the lowest real-time priority)
    while in the block, when `wanted` and allowed (root): on a busy
    machine a normal thread waits for the CPU between the stop and the
    resume while the target stays stopped. Its policy is restored after."""

    def __init__(self, wanted: bool):
        self.wanted, self.saved = wanted, None

    def __enter__(self):
        if self.wanted:
            try:
                self.saved = (os.sched_getscheduler(0), os.sched_getparam(0))
                os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
            except OSError:
                self.saved = None                 # not allowed: a normal pause
        return self

    def __exit__(self, *exc):
        if self.saved is not None:
            os.sched_setscheduler(0, *self.saved)
        return False


def mapping_ends(pid: int) -> list:
    """Sorted (start, end) of every mapping of the process: a stack is read
    from sp to its mapping's end only (a thread's stack ends just above its
    outermost frame; reading on would only cost stopped time)."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            return sorted(tuple(int(x, 16) for x in line.split(None, 1)[0].split("-"))
                          for line in f)
    except OSError:
        return []


def end_of_mapping(ends: list, addr: int) -> int:
    i = bisect.bisect_right(ends, (addr, float("inf"))) - 1
    if i >= 0 and ends[i][0] <= addr < ends[i][1]:
        return ends[i][1]
    return addr + STACK_BYTES                   # mapped since: read as far as it goes


def _thread_states(mem, interp) -> dict:
    if interp is None:
        return {}
    try:
        return python_frames.thread_states(mem, interp)
    except OSError:
        return {}


def dump(pid: int, options: SymbolOptions = SymbolOptions()) -> tuple:
    """(ThreadStacks in tid order, nanoseconds the process was stopped)."""
    check_target(pid)
    tracker = MappingTracker()
    if not tracker.seed_from_proc(pid):
        _not_readable(pid)
        raise UstackError(f"no process {pid}")
    interp = find_interpreter(procfs.executable_mappings(pid))
    captured, took = capture(pid, interp)
    unwinder = DwarfUnwinder(debug_dirs=options.debug_dirs, cut_advice="the stack is deeper "
                             f"than the {STACK_BYTES >> 10} KiB read")
    code = PythonCode()
    names = Symbolizer(tracker, options, code)
    find = lambda addr: tracker.find(pid, addr)     # noqa: E731
    out = []
    for c in captured:
        pcs, notes = unwinder.unwind(c.regs, c.stack, find)
        if interp is not None:
            for group in c.groups:
                for addr, _ in group:
                    code.remember(pid, addr, interp.version)
            pcs, merged = python_frames.merge(pcs, c.groups, interp.eval_ranges)
            notes = notes + merged + ((c.note,) if c.note else ())
        out.append(ThreadStack(c.tid, c.comm, c.state, names.frames(pid, pcs), notes))
    return out, took


def format_text(pid: int, threads) -> str:
    lines = []
    for t in threads:
        lines.append(f"Thread {pid}/{t.tid} {t.comm} "
                     f"({t.state} {STATES.get(t.state, '')})".rstrip() + ":")
        lines += [frame_line(f) for f in t.frames]
        lines += [f" ({note})" for note in t.notes]
        lines.append("")
    return "\n".join(lines) + "\n" if lines else ""


def _frame_json(f: Frame) -> dict:
    d = {"function": f.function, "module": f.module, "kind": f.kind or "native"}
    if f.kind not in SCRIPT_KINDS:
        d.update(addr=f"0x{f.addr:x}", offset=f.offset)
    if f.line:
        d.update(file=f.file, line=f.line)
    if f.inlined:
        d["inlined"] = True
    return d


def format_json(pid: int, threads, stopped_ns: int) -> str:
    return json.dumps({"pid": pid, "stopped_ns": stopped_ns, "threads": [
        {"tid": t.tid, "comm": t.comm, "state": t.state,
         "frames": [_frame_json(f) for f in t.frames], "notes": list(t.notes)}
        for t in threads]}, indent=1) + "\n"


FORMATS = ("text", "json")


def main(args) -> int:
    """`ustack dump` from its parsed arguments."""
    return run_dump(args.pid, symbol_options(args), args.format, args.output, sys.stderr)


def run_dump(pid: int, options: SymbolOptions, fmt: str | None, output: str | None,
             err) -> int:
    fmt = choose_format(fmt, output, {"text": None, "json": None})
    out = Output(output) if output else None     # refused before the process stops
    try:
        threads, took = dump(pid, options)
        text = (format_json(pid, threads, took) if fmt == "json"
                else format_text(pid, threads))
        if out is None:
            sys.stdout.write(text)
        else:
            try:
                out.file.write(text.encode())
            except OSError as e:
                raise UstackError(f"{out.label}: {e.strerror}") from None
            out.commit()
    finally:
        if out is not None:
            out.discard()
    err.write(f"ustack: process {pid} stopped for {format_duration(took)} "
              f"({len(threads)} threads)\n")
    return 0
