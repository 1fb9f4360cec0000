"""Kernel addresses -> Frames through /proc/kallsyms (text symbols only)."""
from __future__ import annotations

import bisect

from ..model import Frame

KALLSYMS = "/proc/kallsyms"
KERNEL_MODULE = "kernel"          # the [module] shown for kernel frames


class KernelSymbols:
    def __init__(self, path: str = KALLSYMS):
        syms = []
        try:
            with open(path) as f:
                for line in f:
                    addr, kind, name = line.split()[:3]
                    if kind in "tTwW":
                        syms.append((int(addr, 16), name))
        except OSError:
            pass
        syms.sort()
        # addresses are all 0 when kptr_restrict hides them: no names then
        self.starts = [a for a, _ in syms] if syms and syms[-1][0] else []
        self.names = [n for _, n in syms]

    def frame(self, addr: int) -> Frame:
        i = bisect.bisect_right(self.starts, addr) - 1
        if i < 0:
            return Frame(addr=addr, module=KERNEL_MODULE)
        start = self.starts[i]
        size = self.starts[i + 1] - start if i + 1 < len(self.starts) else 0
        return Frame(addr=addr, module=KERNEL_MODULE, function=self.names[i],
                     offset=addr - start, size=size)
