"""ptrace(2) through ctypes (os has no ptrace): the few requests a traced
command needs. Each raises OSError with the kernel's errno on failure."""
from __future__ import annotations

import ctypes
import os
import signal

PTRACE_TRACEME, PTRACE_CONT, PTRACE_SETOPTIONS = 0, 7, 0x4200
PTRACE_GETREGS, PTRACE_DETACH = 12, 17
PTRACE_SEIZE, PTRACE_INTERRUPT = 0x4206, 0x4207
WALL = 0x40000000               # __WALL: wait for threads, not only children
PTRACE_O_TRACEEXEC, PTRACE_O_TRACEEXIT = 0x10, 0x40
PTRACE_EVENT_EXEC = 4           # status >> 16 at the stop after an execve
PTRACE_EVENT_EXIT = 6           # status >> 16 at the stop before an exit

_libc = ctypes.CDLL(None, use_errno=True)
_libc.ptrace.argtypes = (ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p)
_libc.ptrace.restype = ctypes.c_long


# struct user_regs_struct (x86-64), in order
_REGS = ("r15 r14 r13 r12 bp bx r11 r10 r9 r8 ax cx dx si di orig_ax ip cs flags "
         "sp ss fs_base gs_base ds es fs gs").split()


def _ptrace(request: int, pid: int, data: int = 0) -> None:
    if _libc.ptrace(request, pid, None, ctypes.c_void_p(data)) == -1:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def traceme() -> None:
    """Called by a child before execve: its parent becomes its tracer (and
    the execve stops it with SIGTRAP)."""
    _ptrace(PTRACE_TRACEME, 0)


def trace_exec_and_exit(pid: int) -> None:
    """Stop the stopped tracee at each later execve with an event stop of
    its own (PTRACE_EVENT_EXEC: not a SIGTRAP, so a SIGTRAP the program
    gets is its own) and just before it exits (PTRACE_EVENT_EXIT), while
    its memory map still exists."""
    _ptrace(PTRACE_SETOPTIONS, pid, PTRACE_O_TRACEEXEC | PTRACE_O_TRACEEXIT)


def cont(pid: int, sig: int = 0) -> None:
    """Resume a stopped tracee, delivering signal `sig` (0: none)."""
    _ptrace(PTRACE_CONT, pid, sig)


def event_stop(status: int) -> int:
    """The PTRACE_EVENT_* of a waitpid status that is an event stop (one
    trace_exec_and_exit() asked for), else 0: a signal for the tracee."""
    if os.WIFSTOPPED(status) and os.WSTOPSIG(status) == signal.SIGTRAP:
        return status >> 16
    return 0


def seize(tid: int) -> None:
    """Become the tracer of thread `tid` without stopping it (no signal is
    sent; PTRACE_SEIZE leaves its group-stop and signals alone)."""
    _ptrace(PTRACE_SEIZE, tid)


def interrupt(tid: int) -> None:
    """Ask a seized thread to stop; waitpid(tid, WALL) sees the stop."""
    _ptrace(PTRACE_INTERRUPT, tid)


def detach(tid: int) -> None:
    """Let a stopped tracee go on as it was (no signal delivered)."""
    _ptrace(PTRACE_DETACH, tid)


def registers(tid: int) -> dict:
    """The stopped tracee's general registers by perf's names (ip, sp, bp,
    ...) and fs_base (pthread_self() on x86-64 glibc)."""
    buf = (ctypes.c_ulonglong * len(_REGS))()
    if _libc.ptrace(PTRACE_GETREGS, tid, None, ctypes.cast(buf, ctypes.c_void_p)) == -1:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return dict(zip(_REGS, buf))
