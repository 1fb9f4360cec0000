"""ptrace(2) through ctypes (os has no ptrace): the few requests a traced
command needs, and those that stop a running thread a moment to read its
registers (seize, interrupt, getregs, detach). Each raises OSError with the
kernel's errno on failure."""
from __future__ import annotations

import ctypes
import os
import signal

PTRACE_TRACEME, PTRACE_CONT, PTRACE_SETOPTIONS = 0, 7, 0x4200
PTRACE_O_TRACEEXEC, PTRACE_O_TRACEEXIT = 0x10, 0x40
PTRACE_EVENT_EXEC = 4           # status >> 16 at the stop after an execve
PTRACE_EVENT_EXIT = 6           # status >> 16 at the stop before an exit
PTRACE_GETREGS, PTRACE_DETACH = 12, 17
PTRACE_SEIZE, PTRACE_INTERRUPT = 0x4206, 0x4207
PTRACE_EVENT_STOP = 128         # status >> 16 at the stop PTRACE_INTERRUPT asked for
__WALL = 0x40000000             # waitpid: any thread, not only child processes

# struct user_regs_struct (x86-64, sys/user.h), in order
REG_NAMES = ("r15", "r14", "r13", "r12", "bp", "bx", "r11", "r10", "r9", "r8",
             "ax", "cx", "dx", "si", "di", "orig_ax", "ip", "cs", "flags", "sp",
             "ss", "fs_base", "gs_base", "ds", "es", "fs", "gs")

_libc = ctypes.CDLL(None, use_errno=True)
_libc.ptrace.argtypes = (ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p)
_libc.ptrace.restype = ctypes.c_long


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
    """Become thread tid's tracer without stopping it (and without the
    SIGSTOP PTRACE_ATTACH would send, which the program could see)."""
    _ptrace(PTRACE_SEIZE, tid)


def interrupt(tid: int) -> None:
    """Ask a seized thread to stop; wait_stop() sees it stopped."""
    _ptrace(PTRACE_INTERRUPT, tid)


def wait_stop(tid: int) -> tuple:
    """(stopped, signal to hand back at detach) once thread tid reported:
    stopped False when it exited instead. A signal-delivery stop holds the
    thread's signal, which detach() must deliver for the program to get it."""
    while True:
        try:
            _, status = os.waitpid(tid, __WALL)
        except InterruptedError:
            continue
        except ChildProcessError:
            return False, 0
        if os.WIFEXITED(status) or os.WIFSIGNALED(status):
            return False, 0
        if not os.WIFSTOPPED(status):
            continue
        if status >> 16:                # PTRACE_EVENT_STOP: our interrupt, or a group stop
            return True, 0
        return True, os.WSTOPSIG(status)


def getregs(tid: int) -> dict:
    """The stopped thread's general registers by REG_NAMES (ip, sp, bp,
    fs_base: the thread pointer, which is pthread_self())."""
    regs = (ctypes.c_ulonglong * len(REG_NAMES))()
    _ptrace(PTRACE_GETREGS, tid, ctypes.addressof(regs))
    return dict(zip(REG_NAMES, regs))


def detach(tid: int, sig: int = 0) -> None:
    """Let the thread go on as if never traced, delivering sig (0: none)."""
    _ptrace(PTRACE_DETACH, tid, sig)
