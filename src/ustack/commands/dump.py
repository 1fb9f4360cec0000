"""`ustack dump -p PID`: every thread's stack once, native and Python, as
pstack, eu-stack or py-spy dump show it. No probe and no sampling: each
thread is stopped a moment with ptrace (seized, so the program sees no
signal), its registers and stack bytes are copied out, its Python frames
read, and every thread is let go before anything is unwound or named."""
from __future__ import annotations

import errno
import json
import os
import signal
import sys
import time
from dataclasses import dataclass, field

from ..kernel import procfs, ptrace
from ..model import SymbolOptions, UstackError
from ..report.json_stacks import frame_dicts
from ..report.output import open_output
from ..report.text import format_duration, format_stack
from ..symbols.python import PythonCode
from ..symbols.stacks import StackResolver
from ..target.mappings import MappingTracker
from ..unwind.python_frames import UNREADABLE, merge, thread_groups
from ..unwind.python_runtime import find_interpreter

MAX_STACK = 1 << 20            # stack bytes copied per thread (above sp)
# the signals that end ustack are held while threads are stopped, so a
# Ctrl-C lets every thread go before it takes effect
HELD = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT}


@dataclass
class ThreadCopy:
    """What is copied of one thread while it is stopped."""
    tid: int
    comm: str
    state: tuple                # ('S', 'sleeping'), as it was before the stop
    regs: dict
    stack: bytes
    groups: list = field(default_factory=list)    # Python frames (python_frames.py)
    notes: tuple = ()


def check_target(pid: int) -> None:
    """One line of refusal for a process ustack cannot or must not stop."""
    if pid == os.getpid():
        raise UstackError(f"process {pid} is ustack itself")
    if not procfs.process_exists(pid):
        raise UstackError(f"no such process: {pid}")
    if procfs.is_kernel_thread(pid):
        raise UstackError(f"process {pid} is a kernel thread: it has no user stack")
    if procfs.tgid(pid) != pid:
        raise UstackError(f"{pid} is a thread of process {procfs.tgid(pid)}: "
                          f"dump -p {procfs.tgid(pid)}")
    tracer = procfs.tracer_pid(pid)
    if tracer:
        raise _traced(pid, tracer)


def _traced(pid: int, tracer: int) -> UstackError:
    return UstackError(f"process {pid} is already traced by process {tracer} "
                       f"({procfs.comm(tracer) or '?'}): only one tracer at a time")


def copy_threads(pid: int, interp, python_code: PythonCode) -> tuple:
    """(ThreadCopy of each thread, nanoseconds the process was stopped).
    Every thread seized is detached, whatever happens in between."""
    states = {}
    held = {}                   # tid -> signal to hand back at detach
    copies = []
    try:
        mem = procfs.Memory(pid)
    except OSError as e:
        raise UstackError(f"cannot read process {pid}'s memory: {e.strerror}") from None
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, HELD)
    start = time.monotonic_ns()
    try:
        for batch in procfs.thread_batches(pid):
            seized, failure = _seize(pid, sorted(batch), states)
            for tid in seized:             # each waited for, so each can be detached
                stopped, sig = ptrace.wait_stop(tid)
                if stopped:
                    held[tid] = sig
            if failure:
                raise failure
        for tid in sorted(held):
            try:
                copies.append(_copy(pid, tid, states[tid], mem, interp, python_code))
            except ProcessLookupError:
                pass                            # killed (SIGKILL) while stopped
    finally:
        for tid, sig in held.items():
            try:
                ptrace.detach(tid, sig)
            except OSError:
                pass                            # exited while stopped (SIGKILL)
        stopped_ns = time.monotonic_ns() - start
        mem.close()
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)   # a Ctrl-C held is heard now
    return copies, stopped_ns


def _seize(pid: int, tids: list, states: dict) -> tuple:
    """(threads seized and asked to stop, the UstackError that ended the
    batch or None). A thread gone since the listing is left out."""
    seized = []
    for tid in tids:
        states[tid] = procfs.thread_state(pid, tid)
        try:
            ptrace.seize(tid)
        except OSError as e:
            if e.errno == errno.ESRCH:
                continue
            tracer = procfs.tracer_pid(pid)
            if tracer:                  # one came between the check and now
                return seized, _traced(pid, tracer)
            return seized, UstackError(f"cannot stop thread {tid}: {e.strerror}")
        seized.append(tid)
        try:
            ptrace.interrupt(tid)
        except OSError:
            pass                        # exited: wait_stop() sees it
    return seized, None


def _copy(pid: int, tid: int, state: tuple, mem, interp, python_code) -> ThreadCopy:
    regs = ptrace.getregs(tid)
    sp = regs["sp"]
    end = procfs.mapping_end(pid, sp)
    stack = mem.read_upto(sp, min(end - sp, MAX_STACK)) if end else b""
    copy = ThreadCopy(tid, procfs.comm(pid, tid) or "?", state, regs, stack)
    if interp is not None:
        try:
            copy.groups = thread_groups(mem.read, interp, regs["fs_base"])
        except OSError:
            copy.notes = (UNREADABLE,)
        for group in copy.groups:
            for code, _index in group:
                python_code.remember(pid, code, interp.version)
    return copy


def dump(pid: int, options: SymbolOptions = SymbolOptions(), fmt: str = "text",
         output: str | None = None, err=None) -> int:
    check_target(pid)
    tracker = MappingTracker()
    if not tracker.seed_from_proc(pid):
        raise UstackError(f"no such process: {pid}")
    interp = find_interpreter(procfs.executable_mappings(pid))
    python_code = PythonCode()
    copies, stopped_ns = copy_threads(pid, interp, python_code)
    tracker.seed_from_proc(pid)        # libraries mapped since (the stop holds them now)
    resolver = StackResolver(tracker, options, python_code=python_code)
    generation = tracker.generations.get(pid, 0)
    eval_ranges = interp.eval_ranges if interp is not None else ()
    threads = []
    for c in copies:
        pcs, notes = resolver.unwinder.dwarf.unwind(
            c.regs, c.stack, lambda addr: tracker.find(pid, addr))
        if interp is not None:
            pcs, py_notes = merge(pcs, c.groups, eval_ranges)
            notes = notes + c.notes + py_notes
        threads.append((c, resolver.stack_of((pid, generation, (pcs, notes), ()))))
    with open_output(output) as out:
        if fmt == "json":
            out.write(json.dumps(_json(pid, tracker.comm(pid, pid), stopped_ns, threads)) + "\n")
        else:
            for c, stack in threads:
                out.write(f"{c.comm} {pid}/{c.tid} {c.state[0]} ({c.state[1]})\n"
                          + format_stack(stack))
    err = err if err is not None else sys.stderr
    for warning in resolver.warnings:
        err.write(f"ustack: {warning}\n")
    err.write(f"stopped {len(copies)} thread{'s' if len(copies) != 1 else ''} of process {pid} for "
              f"{format_duration(stopped_ns)}\n")
    return 0


def _json(pid: int, comm: str, stopped_ns: int, threads: list) -> dict:
    """{"format": "ustack-dump", "version": 1, "pid", "comm", "stopped_ns",
    "threads": [{"tid", "comm", "state", "frames": [FRAME…], "notes"}]},
    FRAME as in json_stacks, innermost first."""
    return {"format": "ustack-dump", "version": 1, "pid": pid, "comm": comm,
            "stopped_ns": stopped_ns,
            "threads": [{"tid": c.tid, "comm": c.comm, "state": c.state[0],
                         "frames": frame_dicts(stack.frames), "notes": list(stack.notes)}
                        for c, stack in threads]}
