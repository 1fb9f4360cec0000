"""Names for JIT-compiled code from /tmp/perf-PID.map, the file JITs (V8,
the JVM with perf-map-agent, LuaJIT, .NET, Python 3.12 -X perf) write for
perf: one `START SIZE name` line per function, START and SIZE in hex.

The file grows while the program runs: it is re-read when its size or
mtime changes. Later lines win for the same start (code was replaced)."""
from __future__ import annotations

import bisect
import os
from typing import Optional

from ..objfile.elf import Symbol


class PerfMap:
    def __init__(self, path: str):
        self.path = path
        self._stamp = None
        self._starts: list = []
        self._syms: list = []

    def lookup(self, addr: int) -> Optional[Symbol]:
        self._refresh()
        i = bisect.bisect_right(self._starts, addr) - 1
        if i >= 0:
            sym = self._syms[i]
            if addr < sym.address + sym.size:
                return sym
        return None

    def _refresh(self) -> None:
        try:
            st = os.stat(self.path)
        except OSError:
            self._stamp, self._starts, self._syms = None, [], []
            return
        stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
        if stamp == self._stamp:
            return
        self._stamp = stamp
        by_start: dict = {}
        try:
            with open(self.path, errors="replace") as f:
                for line in f:
                    parts = line.rstrip("\n").split(" ", 2)
                    if len(parts) != 3:
                        continue                # garbage or a half-written line
                    try:
                        start, size = int(parts[0], 16), int(parts[1], 16)
                    except ValueError:
                        continue
                    if size > 0 and parts[2]:
                        by_start[start] = Symbol(parts[2], start, size)
        except OSError:
            pass
        syms = sorted(by_start.values(), key=lambda s: s.address)
        self._syms = syms
        self._starts = [s.address for s in syms]


def perf_map_path(pid: int) -> str:
    """Where the JIT of process `pid` writes its map. A process in another
    mount namespace writes into its own /tmp, under its own pid; this
    reads the host's /tmp/perf-PID.map (perf's convention)."""
    return f"/tmp/perf-{pid}.map"
