"""A child that dies with its parent: PR_SET_PDEATHSIG. The -c command
runs under ustack, and ustack's guardian kills it when ustack dies alone;
when both are killed (SIGKILL of the process group's leaders, the OOM
killer) nothing is left to do it, and the command ran on, untraced,
under init. The kernel sends the signal when the THREAD that forked the
child ends, not its process: only a child forked by the main thread
(whose end is the process's) may ask for it. It survives execve, but not
that of a set-user-ID binary or one with file capabilities."""
from __future__ import annotations

import ctypes
import os
import signal
import threading

PR_SET_PDEATHSIG = 1

_libc = ctypes.CDLL(None, use_errno=True)


def forked_by_main_thread() -> bool:
    """Whether a child forked now would have the main thread as its parent
    thread (call before fork)."""
    return threading.current_thread() is threading.main_thread()


def die_with(parent_pid: int) -> None:
    """In a child just forked by `parent_pid`'s main thread: be SIGKILLed
    when it ends; exit now if it ended already (before the request)."""
    if _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        return                          # kept alive: the guardian still ends it
    if os.getppid() != parent_pid:
        os._exit(127)
