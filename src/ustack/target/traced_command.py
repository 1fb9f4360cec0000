"""A command (-c) under ptrace, for backends without perf's in-band records
(tracefs): stopped right after its execve, before its first instruction,
so events can be switched on exactly then (perf's enable_on_exec), and
stopped again as it exits, while its memory map still exists, so the
mappings its stacks need can be read from /proc after it is gone.
Signals sent to it (Ctrl-C, its own) are passed on unchanged, and at once:
each one stops a traced process until its tracer lets it go, so the stops
are handled when SIGCHLD says one happened, not when the run next polls
(a program that signals itself 1,000 times ran 50 s instead of 10 ms)."""
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
    # called at the exit stop with the pid and the execs it made since the
    # first (the one that stopped it before its first instruction)
    on_exit: Callable[[int, int], None] | None = None
    execs: int = 0
    resumed: bool = False          # it has run past its exec stop
    _waiting: bool = False         # inside wait(): SIGCHLD's handler waits for it
    _old_sigchld = None            # the handler SIGCHLD had before resume()

    def release(self) -> None:
        """Let the command execve and wait until it stands at its first
        instruction (the exec SIGTRAP); resume() lets it run."""
        super().release()
        _, status = os.waitpid(self.pid, 0)
        if not os.WIFSTOPPED(status):      # execve failed: the child exited
            self.exit_status = os.waitstatus_to_exitcode(status)
            return
        try:
            ptrace.trace_exec_and_exit(self.pid)
        except ProcessLookupError:
            pass    # killed meanwhile: wait() reports it

    def resume(self) -> None:
        if self.exit_status is None:
            self.resumed = True
            self._hear_stops()
            _cont(self.pid)

    def _hear_stops(self) -> None:
        """Handle each stop as SIGCHLD reports it. ptrace requests come
        from the thread that started the command, the main thread, where
        Python runs signal handlers; from another thread, the polls do."""
        try:
            self._old_sigchld = signal.signal(signal.SIGCHLD, self._on_sigchld)
        except ValueError:              # not the main thread
            self._old_sigchld = None

    def _on_sigchld(self, _signum, _frame) -> None:
        if not self._waiting:
            self.wait()

    def _stop_hearing(self) -> None:
        if self._old_sigchld is not None:
            signal.signal(signal.SIGCHLD, self._old_sigchld)
            self._old_sigchld = None

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
        self._waiting = True
        try:
            return self._wait(block)
        finally:
            self._waiting = False
            if self.exit_status is not None:
                self._stop_hearing()

    def _wait(self, block: bool) -> bool:
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
            event = ptrace.event_stop(status)
            if event == ptrace.PTRACE_EVENT_EXEC:
                self.execs += 1
            elif event == ptrace.PTRACE_EVENT_EXIT and self.on_exit is not None:
                try:
                    self.on_exit(self.pid, self.execs)
                except Exception:   # noqa: BLE001 - what it reads is a bonus:
                    pass            # the command must go on to its exit whatever it met
            # an event stop is ours; any other stop holds a signal for it
            _cont(self.pid, 0 if event else os.WSTOPSIG(status))
        return True


def launch_traced(command: str) -> TracedCommand:
    return launch(command, before_exec=ptrace.traceme, cls=TracedCommand)
