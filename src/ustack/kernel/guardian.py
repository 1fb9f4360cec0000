"""A run's guardian: a small process, forked before the run makes any
probe, that undoes the run when it dies without doing so itself (SIGKILL,
the OOM killer). Left alone, a killed tracefs run's instance keeps tracing
and its uprobes stay armed in every process that maps the probed files,
and a held -c command runs on.

The guardian holds the read end of a pipe whose write end only the run
has (and the run's closer, capture/closer.py, when the run leaves its
closing to one), so EOF means the run has ended. A run that ended well
writes DONE first and the guardian just exits; a run that left its
closing to a closer writes nothing, and the closer writes DONE when it
has removed everything. Otherwise it kills the -c command (by
pidfd: a reused pid is never hit), removes the run's ftrace instance and
uprobes (retrying while the dying run's perf events still hold them), then
the run's lock file (kernel/run_lock.py: it shares the run's lock, so no
other run judges the name dead before it is done). The run's perf and BPF fds
close by themselves when the run dies: the guardian keeps no fd but its
own three. It leaves the terminal's process group (Ctrl-C is the run's to
handle) and imports nothing after the fork."""
from __future__ import annotations

import os
import signal
import time

from ..model import UstackError
from . import credentials, run_lock
from .leftovers import remove_tracing
from .tracefs import TRACEFS

TRACEFS_DIRS = (TRACEFS, "/sys/kernel/debug/tracing")

DONE = b"d"
CLEAR_FOR_S = 5.0                   # retrying removals the kernel refuses (EBUSY)
RETRY_S = 0.01


class Guardian:
    """The run's side: done() once the run has removed its own tracing, or
    hand_over() when a closer it forked (capture/closer.py) removes it:
    the guardian then watches the closer, which says finished() at the
    end. A closer killed mid-work leaves the guardian its pipe's EOF, and
    the guardian removes what the closer did not."""

    def __init__(self, pid: int, write_fd: int, tracing: bool = True):
        self.pid = pid
        self._fd = write_fd
        self._tracing = tracing         # holds the run's lock

    def done(self) -> None:
        """Tell the guardian to exit untouched, reap it, drop the lock."""
        if self._fd < 0:
            return
        self.finished()
        os.close(self._fd)
        self._fd = -1
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass
        if self._tracing:
            run_lock.release()

    def finished(self) -> None:
        """Tell the guardian that the run's tracing is removed (in the
        closer: its copy of the pipe is the one left open)."""
        try:
            os.write(self._fd, DONE)
        except OSError:
            pass                        # it was killed: nothing to tell

    def hand_over(self) -> None:
        """The run ends while its closer, holding a copy of the pipe, still
        removes its tracing: close this process's end unsaid and unwaited
        (the guardian lives until the closer is done), drop the lock."""
        if self._fd < 0:
            return
        os.close(self._fd)
        self._fd = -1
        if self._tracing:
            run_lock.release()


def start(command_pid: int | None = None) -> Guardian | None:
    """Fork the guardian of this process's tracing (and of `command_pid`,
    a -c command it must end if the run dies). None if it cannot be had
    (no fork): the run goes on unguarded, as before."""
    name = run_lock.tracing_name()
    # a run without root makes no tracing: no lock, nothing to remove
    tracing = credentials.privileged()
    lock_fd = run_lock.hold() if tracing else None
    pidfd = -1
    if command_pid is not None:
        try:
            pidfd = os.pidfd_open(command_pid)
        except OSError:
            pass                        # exited already: nothing to end
    read_fd, write_fd = os.pipe()       # both close on exec
    try:
        pid = os.fork()
    except OSError:
        pid = -1
    if pid == 0:
        try:
            _guard(read_fd, name if tracing else None, lock_fd, pidfd)
        finally:
            os._exit(0)
    os.close(read_fd)
    if pidfd >= 0:
        os.close(pidfd)
    if pid < 0:
        os.close(write_fd)
        if tracing:
            run_lock.release()
        return None
    return Guardian(pid, write_fd, tracing)


def _guard(read_fd: int, name: str | None, lock_fd: int | None, pidfd: int) -> None:
    """The guardian's life: wait for the run's end, undo what it left
    (`name`: its tracing's, None for a run that makes none)."""
    try:
        os.setpgid(0, 0)
    except OSError:
        pass
    try:                                # the run's handlers are not ours
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    except ValueError:
        pass                            # forked from another thread
    _keep_only((read_fd, pidfd, -1 if lock_fd is None else lock_fd))
    while True:
        try:
            data = os.read(read_fd, 16)
        except InterruptedError:
            continue
        if DONE in data:
            return
        if not data:
            break                       # the run died
    if pidfd >= 0:
        try:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        except OSError:
            pass                        # gone already
    left = 0
    deadline = time.monotonic() + CLEAR_FOR_S
    while name is not None and _tracefs_mounted():      # (else the run made no tracing)
        try:
            gone, left = remove_tracing(name)
        except (OSError, UstackError):
            gone, left = 0, 1
        if gone:                        # the kernel frees the dead's events one by
            deadline = time.monotonic() + CLEAR_FOR_S     # one (~0.1 s each): wait on
        if not left or time.monotonic() >= deadline:
            break
        time.sleep(RETRY_S)
    if lock_fd is not None and not left:
        run_lock.forget(name, lock_fd)


def _tracefs_mounted() -> bool:
    """Without mounting it (tracefs_root would)."""
    return any(os.path.isdir(os.path.join(d, "events")) for d in TRACEFS_DIRS)


def _keep_only(keep: tuple) -> None:
    """Close every fd but `keep`'s, with /dev/null as stdin, stdout and
    stderr (a reader of the run's output must see its end when the run
    ends, not when the guardian does)."""
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        if null != fd:
            os.dup2(null, fd)
    low = 3
    for fd in sorted(k for k in keep if k >= 3):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, os.sysconf("SC_OPEN_MAX"))
