"""A command (-c) under ptrace, for backends without perf's in-band records
(tracefs): stopped right after its execve, before its first instruction,
so events can be switched on exactly then (perf's enable_on_exec), and
stopped again as it exits, while its memory map still exists, so the
mappings its stacks need can be read from /proc after it is gone.
Signals sent to it (Ctrl-C) are passed on unchanged."""
from __future__ import annotations

import ctypes
import os
import signal
from typing import Callable, Optional

from .process import Target, launch

PTRACE_TRACEME, PTRACE_CONT, PTRACE_SETOPTIONS = 0, 7, 0x4200
PTRACE_O_TRACEEXIT = 0x40
PTRACE_EVENT_EXIT = 6

_libc = ctypes.CDLL(None, use_errno=True)
_libc.ptrace.argtypes = (ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p)
_libc.ptrace.restype = ctypes.c_long


def _ptrace(req: int, pid: int, data: int = 0) -> None:
    _libc.ptrace(req, pid, None, ctypes.c_void_p(data))


def _traceme() -> None:
    _ptrace(PTRACE_TRACEME, 0)


class TracedCommand(Target):
    on_exit: Optional[Callable[[int], None]] = None   # called at the exit stop

    def release(self) -> None:
        """Let the command execve and wait until it stands at its first
        instruction (the exec SIGTRAP); resume() lets it run."""
        super().release()
        _, status = os.waitpid(self.pid, 0)
        if not os.WIFSTOPPED(status):      # execve failed: the child exited
            self.exit_status = os.waitstatus_to_exitcode(status)
            return
        _ptrace(PTRACE_SETOPTIONS, self.pid, PTRACE_O_TRACEEXIT)

    def resume(self) -> None:
        if self.exit_status is None:
            _ptrace(PTRACE_CONT, self.pid, 0)

    def wait(self, block: bool = False) -> bool:
        while self.exit_status is None:
            try:
                pid, status = os.waitpid(self.pid, 0 if block else os.WNOHANG)
            except ChildProcessError:
                self.exit_status = -1
                break
            if pid == 0:
                return False
            if not os.WIFSTOPPED(status):
                self.exit_status = os.waitstatus_to_exitcode(status)
                break
            sig = os.WSTOPSIG(status)
            if sig == signal.SIGTRAP and status >> 16 == PTRACE_EVENT_EXIT:
                if self.on_exit is not None:
                    self.on_exit(self.pid)
                sig = 0
            elif sig == signal.SIGTRAP:
                sig = 0
            _ptrace(PTRACE_CONT, self.pid, sig)
        return True


def launch_traced(command: str) -> TracedCommand:
    return launch(command, before_exec=_traceme, cls=TracedCommand)
