"""The shared objects a program will map before its main() runs: its
interpreter (PT_INTERP) and the DT_NEEDED closure, found as the dynamic
loader finds them (RPATH/RUNPATH with $ORIGIN, then the system's library
directories). Used to prepare per-object data before a launched command
maps anything; a library not found here is simply left out."""
from __future__ import annotations

import os

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

SYSTEM_DIRS = ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64",
               "/usr/lib64", "/lib", "/usr/lib", "/usr/local/lib")
MAX_OBJECTS = 256


def _dynamic(path: str) -> tuple:
    """(interpreter or None, needed names, search dirs from RPATH/RUNPATH)."""
    interp, needed, dirs = None, [], []
    with open(path, "rb") as f:
        elf = ELFFile(f)
        for seg in elf.iter_segments():
            if seg["p_type"] == "PT_INTERP":
                interp = seg.get_interp_name()
        dyn = elf.get_section_by_name(".dynamic")
        if dyn is not None:
            origin = os.path.dirname(os.path.realpath(path))
            for tag in dyn.iter_tags():
                if tag.entry.d_tag == "DT_NEEDED":
                    needed.append(tag.needed)
                elif tag.entry.d_tag in ("DT_RPATH", "DT_RUNPATH"):
                    text = tag.rpath if tag.entry.d_tag == "DT_RPATH" else tag.runpath
                    dirs += [d.replace("$ORIGIN", origin).replace("${ORIGIN}", origin)
                             for d in text.split(":") if d]
    return interp, needed, dirs


def load_closure(executable: str) -> list:
    """Paths of the executable, its interpreter and every library it needs,
    transitively (breadth first, each once)."""
    out, seen, todo = [], set(), [executable]
    while todo and len(out) < MAX_OBJECTS:
        path = todo.pop(0)
        real = os.path.realpath(path)
        if real in seen:
            continue
        seen.add(real)
        out.append(path)
        try:
            interp, needed, dirs = _dynamic(path)
        except (OSError, ELFError, ValueError):
            continue
        if interp:
            todo.append(interp)
        for name in needed:
            if "/" in name:
                todo.append(name)
                continue
            for d in dirs + list(SYSTEM_DIRS):
                candidate = os.path.join(d, name)
                if os.path.exists(candidate):
                    todo.append(candidate)
                    break
    return out
