"""(pid, address) -> what symbolization reads: the mapping the address is
in, the object file to open (None: memory without one), and the address's
offset in that file. The build-id is not known here without opening the
file; ElfImage (memoized by file identity) has it once opened."""
from __future__ import annotations


from ..objfile.mapped import file_offset, object_path


def is_anonymous(path: str) -> bool:
    """Whether a mapping's path is memory without a file that a JIT's code
    may be in (perf's //anon, /proc's "" or a named [anon:…])."""
    return path in ("", "//anon") or path.startswith("[anon")


def unnamed_jit(frame) -> bool:
    """Whether a frame is in such memory and no map named it."""
    return frame.function is None and is_anonymous(frame.module)


def normalize(mappings, pid: int, addr: int) -> tuple | None:
    """(mapping, object path or None, file offset), or None when no mapping
    of pid holds addr. A plain tuple: this runs once per frame.
    `mappings` is anything with find(pid, addr) -> Mapping | None."""
    m = mappings.find(pid, addr)
    if m is None:
        return None
    return m, object_path(m), file_offset(m, addr)
