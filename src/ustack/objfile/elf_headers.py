"""An ELF64 little-endian file's headers (segments, sections, build-id)
read with struct, for OnDisk: what objfile.elf_reader's libelf reader
gives of them, without importing and loading libelf (~2 ms of a short run
whose one stripped frame is placed by its FDE). Other files (32-bit,
big-endian, extended section numbering) go to objfile.elf_reader.

Only a file whose headers are whole is read here: a table, section or
segment past the file's end, a name table that is not there, an odd
header: the file is libelf's (open_reader), which says what is wrong
with it as it always did."""
from __future__ import annotations

import os
import struct
from collections import namedtuple

# e_machine's names as pyelftools spells them, which the image cache and its
# users keep (elf_reader's readers give them too)
MACHINES = {2: "EM_SPARC", 3: "EM_386", 8: "EM_MIPS", 20: "EM_PPC", 21: "EM_PPC64",
             22: "EM_S390", 40: "EM_ARM", 43: "EM_SPARCV9", 62: "EM_X86_64",
             183: "EM_AARCH64", 243: "EM_RISCV", 258: "EM_LOONGARCH"}

_EHDR = struct.Struct("<16sHHIQQQIHHHHHH")
_PHDR = struct.Struct("<IIQQQQQQ")           # type, flags, offset, vaddr, paddr, filesz, ...
_SHDR = struct.Struct("<IIQQQQIIQQ")         # name, type, flags, addr, offset, size, link, ...
_NHDR = struct.Struct("<III")                # namesz, descsz, type
_SHT_STRTAB, _SHT_NOTE, _SHT_NOBITS, _PT_NOTE = 3, 7, 8, 4
_NT_GNU_BUILD_ID = 3
_SHN_XINDEX, _PN_XNUM = 0xFFFF, 0xFFFF

# the fields of native.libelf's Section and Segment that OnDisk reads
Section = namedtuple("Section", "index name type flags addr offset size link entsize")
Segment = namedtuple("Segment", "type offset vaddr filesz flags")


class ElfHeaders:
    """The headers of the ELF file open as `fd`; use read_headers()."""

    elfclass = 64

    def __init__(self, fd: int, size: int, ehdr: tuple):
        self._fd, self._size = fd, size
        (_ident, _type, machine, _version, _entry, phoff, shoff, _flags, _ehsize,
         phentsize, phnum, shentsize, shnum, shstrndx) = ehdr
        self.machine = MACHINES.get(machine, machine)
        self.segments = [Segment(t, off, vaddr, filesz, flags) for t, flags, off, vaddr, _p,
                         filesz, _m, _a in self._table(phoff, phnum, phentsize, _PHDR)]
        heads = self._table(shoff, shnum, shentsize, _SHDR)
        if any(p.offset + p.filesz > size for p in self.segments) or any(
                h[1] != _SHT_NOBITS and h[4] + h[5] > size for h in heads[1:]) or (
                heads and shstrndx >= len(heads)):
            raise _NotWhole
        table = heads[shstrndx] if heads else None
        # names only from a string table, as libelf's elf_strptr gives them
        names = (self._bytes(table[4], table[5]) or b"") if table and table[1] == _SHT_STRTAB \
            else b""
        self.sections = [Section(i, _name(names, h[0]) if i else "", h[1], h[2], h[3], h[4],
                                 h[5], h[6], h[9]) for i, h in enumerate(heads)]
        self._aligns = [h[8] for h in heads]

    def _table(self, offset: int, count: int, entsize: int, entry: struct.Struct) -> list:
        if not count:
            return []
        if entsize != entry.size or offset + count * entsize > self._size:
            raise _NotWhole
        data = os.pread(self._fd, count * entsize, offset)
        return [entry.unpack_from(data, i * entsize) for i in range(count)]

    def _bytes(self, offset: int, size: int) -> bytes | None:
        """The file's bytes there, None when they are not all in the file."""
        if offset + size > self._size:
            return None
        return os.pread(self._fd, size, offset) if size else b""

    def build_id(self) -> str | None:
        """NT_GNU_BUILD_ID's bytes in hex, from the note sections, else
        (no section headers) the PT_NOTE segments."""
        if self.sections:
            chunks = [(s.offset, s.size, self._aligns[s.index]) for s in self.sections
                      if s.type == _SHT_NOTE]
        else:
            chunks = [(p.offset, p.filesz, 4) for p in self.segments if p.type == _PT_NOTE]
        for offset, size, align in chunks:
            data = self._bytes(offset, size)
            found = _gnu_build_id(data, 8 if align == 8 else 4) if data else None
            if found is not None:
                return found
        return None

    def close(self) -> None:
        """Nothing to let go: the caller owns the file."""


class _NotWhole(Exception):
    """Headers this reader leaves to libelf."""


def read_headers(f) -> ElfHeaders | None:
    """The headers of the ELF file open as `f` (binary), or None when it is
    not a whole ELF64 little-endian file (objfile.elf_reader's then)."""
    fd = f.fileno()
    size = os.fstat(fd).st_size
    head = os.pread(fd, _EHDR.size, 0)
    if len(head) < _EHDR.size or head[:4] != b"\x7fELF" or head[4:7] != b"\x02\x01\x01":
        return None                 # not ELF64, little-endian, version 1
    ehdr = _EHDR.unpack(head)
    shoff, phnum, shnum, shstrndx = ehdr[6], ehdr[10], ehdr[12], ehdr[13]
    if phnum == _PN_XNUM or shstrndx == _SHN_XINDEX or (shnum == 0 and shoff):
        return None                 # numbers kept in section 0
    try:
        return ElfHeaders(fd, size, ehdr)
    except _NotWhole:
        return None


def _name(table: bytes, offset: int) -> str:
    end = table.find(b"\0", offset)
    return os.fsdecode(table[offset:end]) if 0 <= offset < len(table) and end >= 0 else ""


def _gnu_build_id(data: bytes, align: int) -> str | None:
    """The GNU build-id note's descriptor in hex, among the notes of `data`."""
    pad = align - 1
    pos = 0
    while pos + _NHDR.size <= len(data):
        namesz, descsz, ntype = _NHDR.unpack_from(data, pos)
        name_at = pos + _NHDR.size
        desc_at = name_at + ((namesz + pad) & ~pad)
        end = desc_at + ((descsz + pad) & ~pad)
        if desc_at + descsz > len(data):
            return None
        if ntype == _NT_GNU_BUILD_ID and data[name_at:name_at + namesz] == b"GNU\0":
            return data[desc_at:desc_at + descsz].hex()
        pos = end
    return None
