"""Values built once per key in a process, even when threads ask for the
same key at once (the row loader's thread and the unwinder open the same
object): the first builds, the others wait for it and take its value.
The same thread asking again while it builds (a signal handler run in the
middle of the build: SIGCHLD's reads the exiting command's interpreter
facts, which opens the object being opened) builds a value of its own
rather than wait for itself for ever."""
from __future__ import annotations

import threading


class BuiltOnce:
    def __init__(self):
        self.values: dict = {}          # key -> value, once built
        self._locks: dict = {}          # key -> the lock its builder holds
        self._lock = threading.Lock()

    def get(self, key, build):
        """The value of `key`, built by build() if no thread built it."""
        value = self.values.get(key)
        if value is not None:
            return value
        with self._lock:
            lock = self._locks.setdefault(key, threading.RLock())
        with lock:
            value = self.values.get(key)
            if value is None:
                value = self.values[key] = build()
        return value

    def clear(self) -> None:
        self.values.clear()
