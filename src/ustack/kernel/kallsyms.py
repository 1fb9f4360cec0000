"""/proc/kallsyms: the kernel's function symbols, to name kernel frames."""
from __future__ import annotations

KALLSYMS = "/proc/kallsyms"


def text_symbols(path: str = KALLSYMS) -> list:
    """(address, name) of the kernel's text symbols, sorted by address;
    empty when unreadable or when kptr_restrict shows every address as 0."""
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
    return syms if syms and syms[-1][0] else []
