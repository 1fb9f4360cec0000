"""The one owner of a BPF run's kernel objects: its maps, programs, links
and rings are kept here as they are made and closed here, in one place and
one order; the programs' error counters are read here, by name."""
from __future__ import annotations

import os
import struct

_U64 = struct.Struct("<Q")


class RunObjects:
    """What one run made in the kernel. close() takes the links (and
    events the programs hang on) away first, so nothing runs a program
    whose maps are going, then the programs, the rings, the maps."""

    def __init__(self):
        self.links: list = []           # fds: links, raw tracepoint attachments
        self.programs: list = []        # program fds
        self.rings: list = []           # bpf.RingBuf
        self.maps: list = []            # bpf_syscall.Map, or a set of them with close()
        self._errors: list = []         # (map, {name: slot})

    def map(self, m):
        self.maps.append(m)
        return m

    def program(self, fd: int) -> int:
        self.programs.append(fd)
        return fd

    def link(self, fd: int) -> int:
        self.links.append(fd)
        return fd

    def ring(self, r):
        self.rings.append(r)
        return r

    def error_counters(self, m, slots: dict):
        """`m` counts a program's errors in the slots of its C enum
        (`slots`: name -> index, as bpf_object.enum gives it; the enum's
        last name, ..._SLOTS, is its size); read by errors()."""
        self._errors.append((m, {name: i for name, i in slots.items()
                                 if not name.endswith("_SLOTS") and i < m.max_entries}))
        return m

    def errors(self) -> dict:
        """Every error counter of the run by its C name (ERR_STACKS_FULL,
        UW_RING_FULL, LAT_TOO_DEEP, OFF_START_FULL...) -> its count."""
        out: dict = {}
        for m, slots in self._errors:
            for name, i in slots.items():
                raw = m.lookup(i.to_bytes(4, "little"))
                out[name] = _U64.unpack(raw)[0] if raw is not None else 0
        return out

    def close(self) -> None:
        for fd in self.links + self.programs:
            os.close(fd)
        self.links.clear()
        self.programs.clear()
        for r in self.rings:
            r.close()
        self.rings.clear()
        for m in self.maps:
            m.close()
        self.maps.clear()
        self._errors.clear()
