"""A lock a forked child finds free.

A run closes its capture in a forked closer (closer.py). A lock some other
thread of the run held at the fork (the rows loader writing a map, the
harvest of JS functions) stays held in the child for ever: the thread
that would release it does not exist there, and the closer would wait on
it without end. Each ForkSafeLock is made anew in a forked child; what it
guarded is only closed there."""
from __future__ import annotations

import os
import threading
import weakref

_LOCKS: "weakref.WeakSet[ForkSafeLock]" = weakref.WeakSet()


class ForkSafeLock:
    """threading.Lock's acquire/release and `with`, free again in a child."""

    def __init__(self):
        self._lock = threading.Lock()
        _LOCKS.add(self)

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        return self._lock.acquire(blocking, timeout)

    def release(self) -> None:
        self._lock.release()

    def __enter__(self) -> "ForkSafeLock":
        self._lock.acquire()
        return self

    def __exit__(self, *_exc) -> None:
        self._lock.release()


def _renew_in_child() -> None:
    for lock in list(_LOCKS):
        lock._lock = threading.Lock()


os.register_at_fork(after_in_child=_renew_in_child)
