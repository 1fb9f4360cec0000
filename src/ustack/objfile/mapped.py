"""Where an address of a process lies in an object file: the first step
the DWARF unwinder (CFI is looked up by the object's vaddr) and the
symbolizer share. An address is in a Mapping; the mapping names the file to
read and the address's offset in it; ElfImage.vaddr_of_file_offset turns
that into the object's own address."""
from __future__ import annotations


from ..model import Mapping
from .vdso import vdso_path


def object_path(m: Mapping) -> str | None:
    """The file to read for mapping m: the mapped file as this host opens
    it, or ustack's copy of the vDSO. None for memory without one ([heap],
    [anon:…], perf's //anon for JIT code, a vDSO unlike ours)."""
    if m.path == "[vdso]":
        return vdso_path(m)
    if not m.path.startswith("/") or m.path == "//anon":
        return None
    return m.open_path


def file_offset(m: Mapping, addr: int) -> int:
    """The offset in m's file of the byte mapped at addr."""
    return addr - m.start + m.pgoff
