"""Interpreter frames' names as a recording kept them (recording/format.py's
I records), for the names tables whose frames are named per word part (a
Ruby pc, a JS bytecode offset, a Java bci: each has its own line): the
process is gone when the recording is read, so these answer first."""
from __future__ import annotations

import os
import threading

from ..model import Frame, printable


class RecordedNames:
    """(pid, *word parts) -> (function, file, line), at most `limit` kept
    (then forgotten at once: a recording asks each again as it comes)."""

    def __init__(self, limit: int):
        self.limit = limit
        self._lock = threading.Lock()
        self._names: dict = {}

    def add(self, key: tuple, function: str, file: str, line: int) -> None:
        with self._lock:
            if len(self._names) >= self.limit:
                self._names.clear()
            self._names[key] = (function, file, line)

    def get(self, key: tuple):
        """(function, file, line) of `key`, or None (at once when empty:
        a live run's case)."""
        return self._names.get(key) if self._names else None

    def script_frame(self, key: tuple, kind: str) -> Frame | None:
        """The Frame of `key` as an interpreter frame of `kind`, or None."""
        found = self.get(key)
        if found is None:
            return None
        function, file, line = found
        return Frame(addr=0, module=printable(os.path.basename(file)) if file else "",
                     function=printable(function), file=printable(file), line=line, kind=kind)
