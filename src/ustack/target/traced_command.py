"""A command (-c) under ptrace, for backends without perf's in-band records
(tracefs): stopped right after its execve, before its first instruction,
so events can be switched on exactly then (perf's enable_on_exec), and
stopped again as it exits, while its memory map still exists, so the
mappings its stacks need can be read from /proc after it is gone.
Signals sent to it (Ctrl-C) are passed on unchanged."""
from __future__ import annotations

import os
import signal
from collections.abc import Callable

from ..kernel import ptrace
from .process import Target, launch


def _cont(pid: int, sig: int = 0) -> None:
    try:
        ptrace.cont(pid, sig)
    except ProcessLookupError:
        pass        # killed meanwhile (SIGKILL): the next waitpid reports it


class TracedCommand(Target):
    on_exit: Callable[[int], None] | None = None   # called at the exit stop
    resumed: bool = False          # it has run past its exec stop

    def release(self) -> None:
        """Let the command execve and wait until it stands at its first
        instruction (the exec SIGTRAP); resume() lets it run."""
        super().release()
        _, status = os.waitpid(self.pid, 0)
        if not os.WIFSTOPPED(status):      # execve failed: the child exited
            self.exit_status = os.waitstatus_to_exitcode(status)
            return
        try:
            ptrace.trace_exit(self.pid)
        except ProcessLookupError:
            pass    # killed meanwhile: wait() reports it

    def resume(self) -> None:
        if self.exit_status is None:
            self.resumed = True
            _cont(self.pid)

    def interrupt(self) -> None:
        """Held at its exec stop (set-up failed after release), it never
        ran an instruction and a signal would stay pending for ever: end
        it with SIGKILL, the one signal a ptrace stop does not hold."""
        if self.exit_status is None and not self.resumed:
            self.interrupted = True
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            return
        super().interrupt()

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
            if ptrace.is_exit_stop(status) and self.on_exit is not None:
                self.on_exit(self.pid)
            if sig == signal.SIGTRAP:   # exec or exit stop: ours, not its
                sig = 0
            _cont(self.pid, sig)
        return True


def launch_traced(command: str) -> TracedCommand:
    return launch(command, before_exec=ptrace.traceme, cls=TracedCommand)
