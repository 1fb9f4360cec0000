"""The shared objects a program will map before its main() runs: its
interpreter (PT_INTERP) and the DT_NEEDED closure, found as the dynamic
loader finds them (RPATH/RUNPATH with $ORIGIN, then the system's library
directories). Used to prepare per-object data before a launched command
maps anything; a library not found here is simply left out."""
from __future__ import annotations

import json
import os

from . import cache as objcache

SYSTEM_DIRS = ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64",
               "/usr/lib64", "/lib", "/usr/lib", "/usr/local/lib")
MAX_OBJECTS = 256


def _dynamic(path: str) -> tuple:
    """(interpreter or None, needed names, search dirs from RPATH/RUNPATH),
    read back from the cache when this very file was read before: this runs
    before a launched command may start, and pyelftools costs ~25 ms to
    import and more to read libc."""
    with open(path, "rb") as f:
        cache = objcache.identity_file("needed", os.fstat(f.fileno()), "v1.json")
        found = None
        blob = objcache.read(cache)
        if blob:
            try:
                interp, needed, rpaths = json.loads(blob)
                found = interp, list(needed), list(rpaths)
            except (ValueError, TypeError):
                pass                          # corrupt: read again
        if found is None:
            found = _read_dynamic(f)
            objcache.write(cache, json.dumps(found).encode())
    interp, needed, rpaths = found
    # $ORIGIN is where this path lies, not a fact of the file: not cached
    origin = os.path.dirname(os.path.realpath(path))
    dirs = [d.replace("$ORIGIN", origin).replace("${ORIGIN}", origin)
            for text in rpaths for d in text.split(":") if d]
    return interp, needed, dirs


def _read_dynamic(f) -> tuple:
    """(PT_INTERP, DT_NEEDED names, DT_RPATH/DT_RUNPATH strings) of an ELF file."""
    from elftools.elf.elffile import ELFFile
    interp, needed, rpaths = None, [], []
    elf = ELFFile(f)
    for seg in elf.iter_segments():
        if seg["p_type"] == "PT_INTERP":
            interp = seg.get_interp_name()
    dyn = elf.get_section_by_name(".dynamic")
    if dyn is not None:
        for tag in dyn.iter_tags():
            if tag.entry.d_tag == "DT_NEEDED":
                needed.append(tag.needed)
            elif tag.entry.d_tag in ("DT_RPATH", "DT_RUNPATH"):
                rpaths.append(tag.rpath if tag.entry.d_tag == "DT_RPATH" else tag.runpath)
    return interp, needed, rpaths


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
        except Exception:         # OSError, or pyelftools' many on a bad file
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
