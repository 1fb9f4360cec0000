"""Kernel frames: kernel addresses named from /proc/kallsyms (read by
kernel/kallsyms.py), shown as module `kernel`."""
from __future__ import annotations

import bisect

from ..kernel.kallsyms import KALLSYMS, text_symbols
from ..model import Frame

KERNEL_MODULE = "kernel"          # the [module] shown for kernel frames


class KernelSymbols:
    def __init__(self, path: str = KALLSYMS):
        syms = text_symbols(path)
        self.starts = [a for a, _ in syms]
        self.names = [n for _, n in syms]

    def frame(self, addr: int) -> Frame:
        i = bisect.bisect_right(self.starts, addr) - 1
        if i < 0:
            return Frame(addr=addr, module=KERNEL_MODULE)
        start = self.starts[i]
        size = self.starts[i + 1] - start if i + 1 < len(self.starts) else 0
        return Frame(addr=addr, module=KERNEL_MODULE, function=self.names[i],
                     offset=addr - start, size=size)
