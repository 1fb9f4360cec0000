"""What to trace: an existing process (-p), a command we start (-c), or every
process (neither). A command is forked and held before execve until the
capture backend has opened its events, so it is traced from its first
instruction (the events are armed with enable_on_exec)."""
from __future__ import annotations

import functools
import os
import shlex
import signal
import time

from ..kernel import parent_death, procfs
from ..model import UstackError
from ..values import factory, value

# how long a -c command has to exit after the run's SIGINT before SIGKILL
FINISH_GRACE_S = 2.0


@value(frozen=False)
class Target:
    scope: str                        # 'pid' | 'command' | 'system' | 'recording'
    pid: int | None = None
    argv: list = factory(list)
    _go_fd: int = -1                  # write end of the child's start pipe
    exit_status: int | None = None
    interrupted: bool = False         # ustack ended the command, it did not fail
    pids: tuple = ()                  # system scope kept to these (-p 1,2,3)

    @property
    def description(self) -> str:
        if self.scope == "pid":
            return f"PID {self.pid}"
        if self.scope == "command":
            return f"{_quoted(shlex.join(self.argv))} (PID {self.pid})"
        if self.scope == "recording":
            return f"the recording {self.argv[0]}"
        if self.pids:
            return f"PIDs {', '.join(map(str, self.pids))}"
        return "all processes"

    def excluded_pids(self, include_idle: bool = False) -> frozenset:
        """What a system-wide run leaves out: ustack itself (tracing its
        own writes would feed back into itself) and the idle task (pid 0:
        no user stack) unless asked for."""
        if self.scope != "system":
            return frozenset()
        return frozenset((os.getpid(),) if include_idle else (os.getpid(), 0))

    # -- command targets ------------------------------------------------
    def release(self) -> None:
        """Let a held command run its execve."""
        if self._go_fd >= 0:
            os.write(self._go_fd, b"g")
            os.close(self._go_fd)
            self._go_fd = -1

    def resume(self) -> None:
        """Let a command held at its first instruction run (TracedCommand):
        others run from release() on."""

    def abort(self) -> None:
        """Make a held command exit without running (on setup errors)."""
        if self.scope != "command" or self.pid is None:
            return
        if self._go_fd >= 0:
            os.close(self._go_fd)   # the child reads EOF and exits
            self._go_fd = -1
        self.wait(block=True)

    def wait(self, block: bool = False) -> bool:
        """True when the command (or the -p process) has exited."""
        if self.exit_status is not None:
            return True
        if self.scope == "pid":
            return not procfs.process_exists(self.pid)
        if self.scope == "recording":
            return True                   # its processes ran when it was made
        if self.scope == "system" and self.pids:
            return not any(procfs.process_exists(p) for p in self.pids)
        if self.scope != "command":
            return False
        try:
            pid, status = os.waitpid(self.pid, 0 if block else os.WNOHANG)
        except ChildProcessError:
            self.exit_status = -1
            return True
        if pid == 0:
            return False
        self.exit_status = os.waitstatus_to_exitcode(status)
        return True

    def running_command(self) -> bool:
        """A -c command not known to have exited: the run's end ends it."""
        return self.scope == "command" and self.exit_status is None

    def finish(self, grace: float = FINISH_GRACE_S) -> None:
        """End the command at the end of the run and reap it: SIGINT, as
        Ctrl-C would, then SIGKILL if it is still there after `grace` s."""
        self.interrupt()
        deadline = time.monotonic() + grace
        while not self.wait():
            if time.monotonic() >= deadline:
                try:
                    os.kill(self.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.wait(block=True)
                return
            time.sleep(0.02)

    def interrupt(self) -> None:
        """End the command at the end of the run (-d, Ctrl-C)."""
        if self.scope == "command" and self.exit_status is None:
            self.interrupted = True
            try:
                os.kill(self.pid, signal.SIGINT)
            except ProcessLookupError:
                pass


def _quoted(command: str) -> str:
    """The command line in quotes a shell would take back: 'echo hi',
    "sh -c 'exit 3'"."""
    if "'" not in command:
        return f"'{command}'"
    if not any(c in command for c in '"$`\\'):
        return f'"{command}"'
    return shlex.quote(command)


def executable(argv: list) -> str | None:
    """The file a command line runs, as launch() finds it."""
    return which(argv[0]) if argv else None


def main_executable(target) -> str | None:
    """The program a -p or -c target runs; None for every process."""
    if target.scope == "pid":
        return f"/proc/{target.pid}/exe"
    return executable(target.argv) if target.scope == "command" else None


def command_executable(command: str) -> str | None:
    """The file a -c command line runs, or None if it cannot be told."""
    try:
        return executable(shlex.split(command))
    except ValueError:
        return None


@functools.lru_cache(maxsize=64)
def which(name: str) -> str | None:
    """shutil.which's answer for a command name (PATH searched unless it
    holds a /), without importing shutil: it imports bz2 and lzma, ~2 ms
    of every -c run's start-up. Asked ~7 times a run for the same name:
    the PATH search (a stat per directory) is done once."""
    if os.path.dirname(name):
        return name if _runnable(name) else None
    for directory in os.get_exec_path():
        path = os.path.join(directory, name)
        if _runnable(path):
            return path
    return None


def _runnable(path: str) -> bool:
    return os.path.exists(path) and os.access(path, os.X_OK) and not os.path.isdir(path)


def attach(pid: int) -> Target:
    state = procfs.process_state(pid) if pid > 0 else None
    if state is None or state == "X":
        raise UstackError(f"no such process: {pid}")
    if state == "Z":
        raise UstackError(f"PID {pid} is a zombie: it has exited and its parent "
                          "has not reaped it yet; there is nothing left to trace")
    denied = procfs.root_denied(pid)
    if denied:
        raise UstackError(f"cannot read the files of PID {pid} ({denied}): "
                          "ustack may not look into that process from here (a "
                          "user namespace of its own, or ptrace restrictions)")
    if procfs.is_kernel_thread(pid):
        raise UstackError(f"PID {pid} is a kernel thread: it has no user stack")
    return Target("pid", pid)


def everything(pids: tuple = ()) -> Target:
    """Every process, or (`pids`: -p 1,2,3) every process's events kept
    to these: the run ends when they have all exited."""
    for pid in pids:
        attach(pid)                    # each must exist and have a user stack
    return Target("system", pids=tuple(pids))


def recording(path: str) -> Target:
    """The processes of a recording, replayed: nothing runs, nothing to wait for."""
    return Target("recording", argv=[path])


def launch(command: str, before_exec=None, cls=Target) -> Target:
    """Fork the command, held before execve until Target.release();
    the child calls `before_exec()` (if given) just before execve."""
    try:
        argv = shlex.split(command)
    except ValueError as e:
        raise UstackError(f"cannot parse command {command!r}: {e}")
    if not argv:
        raise UstackError("empty command")
    exe = executable(argv)
    if exe is None:
        raise UstackError(f"no such command: {argv[0]}")
    read_fd, write_fd = os.pipe()
    parent, with_parent = os.getpid(), parent_death.forked_by_main_thread()
    pid = os.fork()
    if pid == 0:                          # child
        try:
            if with_parent:               # never left running untraced
                parent_death.die_with(parent)
            os.close(write_fd)
            if os.read(read_fd, 1) != b"g":
                os._exit(127)
            os.close(read_fd)
            if before_exec is not None:
                before_exec()
            os.execv(exe, argv)
        except BaseException:
            pass
        os._exit(127)
    os.close(read_fd)
    return cls("command", pid, argv, write_fd)
