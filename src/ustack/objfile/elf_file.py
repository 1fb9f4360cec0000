"""One ELF file's layout and bytes: the header facts, the PT_LOAD segments
(vaddr <-> file offset), the sections, their bytes (inflated when
SHF_COMPRESSED), through one descriptor kept open per file."""
from __future__ import annotations

import os
import struct
from collections import OrderedDict

from ustack.model import UstackError

from ..values import value

_SHT_SYMTAB, _SHT_NOBITS = 2, 8
_SHF_COMPRESSED = 0x800
_ELFCOMPRESS_ZLIB = 1
_PT_LOAD = 1
_GO_SECTIONS = (".go.buildinfo", ".gopclntab")

# files kept open for reading; the least recently read are closed beyond this
_MAX_OPEN_FDS = 64
_open_fds: "OrderedDict[ElfFile, int]" = OrderedDict()


@value
class _Load:
    vaddr: int
    offset: int
    filesz: int
    flags: int


class ElfFile:
    """The layout facts (as `layout()` lists them, for the cache) and the
    readers of one file's bytes."""

    def __init__(self, path: str, layout: dict):
        self.path = path
        self._fd: int | None = None   # opened by the first read, see _pread
        self.e_type = layout["e_type"]
        self.is_pie = self.e_type == "ET_DYN"  # PIE executable or shared library
        self.machine = layout["machine"]
        self._loads = [_Load(*l) for l in layout["loads"]]
        self.section_names = frozenset(layout["section_names"])
        # name -> (address, file offset, size) of sections with file bytes
        self.sections = {k: tuple(v) for k, v in layout["sections"].items()}
        self._compressed = frozenset(layout["compressed"])
        self.little_endian = bool(layout["little_endian"])
        self._elfclass = layout["elfclass"]
        self.build_id = layout["build_id"]
        self.has_symtab = bool(layout["has_symtab"])
        # a Go binary: by its sections, else by runtime.main among its
        # symbols (set by the parse); go_error: why its .gopclntab is unusable
        self.is_go = bool(layout.get("is_go", self.section_names & set(_GO_SECTIONS)))
        self.go_error = layout.get("go_error")

    @classmethod
    def from_reader(cls, path: str, reader) -> "ElfFile":
        """The layout through an objfile.elf_reader reader."""
        sections = reader.sections
        return cls(path, {
            "e_type": reader.e_type, "machine": reader.machine,
            "loads": [(s.vaddr, s.offset, s.filesz, s.flags)
                      for s in reader.segments if s.type == _PT_LOAD],
            "section_names": [s.name for s in sections],
            "sections": {s.name: (s.addr, s.offset, s.size)
                         for s in sections if s.type != _SHT_NOBITS},
            "compressed": [s.name for s in sections if s.flags & _SHF_COMPRESSED],
            "little_endian": reader.little_endian, "elfclass": reader.elfclass,
            "build_id": reader.build_id(),
            "has_symtab": any(s.type == _SHT_SYMTAB for s in sections)})

    def layout(self) -> dict:
        """The facts __init__ takes, as plain data (the cache's JSON)."""
        return {
            "e_type": self.e_type, "machine": self.machine,
            "loads": [[l.vaddr, l.offset, l.filesz, l.flags] for l in self._loads],
            "section_names": sorted(self.section_names),
            "sections": self.sections, "compressed": sorted(self._compressed),
            "little_endian": self.little_endian, "elfclass": self._elfclass,
            "build_id": self.build_id, "has_symtab": self.has_symtab,
            "is_go": self.is_go, "go_error": self.go_error,
        }

    # --- segments ---------------------------------------------------------

    def file_offset(self, vaddr: int) -> int | None:
        for seg in self._loads:
            if seg.vaddr <= vaddr < seg.vaddr + seg.filesz:
                return vaddr - seg.vaddr + seg.offset
        return None

    def executable(self, vaddr: int) -> bool:
        """Whether vaddr lies in a PT_LOAD segment mapped executable (PF_X)."""
        return any(seg.vaddr <= vaddr < seg.vaddr + seg.filesz and seg.flags & 1
                   for seg in self._loads)

    def executable_segments(self) -> list:
        """(vaddr, file offset, filesz) of each PT_LOAD mapped executable."""
        return [(s.vaddr, s.offset, s.filesz) for s in self._loads if s.flags & 1]

    def vaddr_of_file_offset(self, off: int) -> int | None:
        for seg in self._loads:
            if seg.offset <= off < seg.offset + seg.filesz:
                return off - seg.offset + seg.vaddr
        return None

    def segments(self) -> list:
        """(vaddr, file offset, file size, writable) of each PT_LOAD."""
        return [(s.vaddr, s.offset, s.filesz, bool(s.flags & 2)) for s in self._loads]

    def read(self, vaddr: int, size: int) -> bytes:
        """File bytes at vaddr, cut short at the end of its segment."""
        for seg in self._loads:
            if seg.vaddr <= vaddr < seg.vaddr + seg.filesz:
                size = min(size, seg.vaddr + seg.filesz - vaddr)
                return self._pread(size, vaddr - seg.vaddr + seg.offset)
        return b""

    # --- sections ---------------------------------------------------------

    def section_bytes(self, name: str) -> bytes | None:
        """The contents of section `name` (inflated if SHF_COMPRESSED), or
        None when the file has no such section with file bytes."""
        data = self.section_file_bytes(name)
        return None if data is None else self.inflated(name, data)

    def section_file_bytes(self, name: str) -> bytes | None:
        """Section `name` as the file holds it (compressed or not), or None
        when the file has no such section with file bytes."""
        sec = self.sections.get(name)
        if sec is None:
            return None
        _addr, offset, size = sec
        return self._pread(size, offset)

    def is_compressed(self, name: str) -> bool:
        return name in self._compressed

    @property
    def elfclass(self) -> int:
        """32 or 64."""
        return self._elfclass

    def file_bytes(self, offset: int, size: int) -> bytes:
        """`size` bytes of the file at `offset` (fewer at its end)."""
        return self._pread(size, offset)

    def inflated(self, name: str, data: bytes) -> bytes:
        """Section `name`'s contents from its file bytes `data`
        (section_file_bytes): inflated if SHF_COMPRESSED, else `data`."""
        if name not in self._compressed:
            return data
        import zlib     # rare on the start path (~0.6 ms to import)
        start, size = self.compression_header(name, data)
        try:
            return zlib.decompressobj().decompress(memoryview(data)[start:], size)
        except zlib.error as e:
            raise UstackError(f"{self.path}: corrupt compressed section {name}: {e}") from None

    def compression_header(self, name: str, data: bytes) -> tuple:
        """(where the zlib stream starts, the size it inflates to) in the
        file bytes `data` of the SHF_COMPRESSED section `name`."""
        # Elf64_Chdr: ch_type, reserved, ch_size, ch_addralign (Elf32: 3 words)
        end = "<" if self.little_endian else ">"
        hdr = struct.Struct(end + ("IIQQ" if self._elfclass == 64 else "III"))
        if len(data) < hdr.size:
            raise UstackError(f"{self.path}: corrupt compressed section {name}")
        fields = hdr.unpack_from(data)
        ch_type, ch_size = fields[0], fields[-2]
        if ch_type != _ELFCOMPRESS_ZLIB:
            raise UstackError(f"{self.path}: section {name} uses compression "
                              f"type {ch_type}, which ustack cannot read")
        return hdr.size, ch_size

    def _pread(self, size: int, offset: int) -> bytes:
        """Bytes of the file, through one descriptor kept open per file
        (the least recently used ones are closed beyond _MAX_OPEN_FDS)."""
        fd = self._fd
        try:
            if fd is None:
                fd = self._fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
                _open_fds[self] = fd
                if len(_open_fds) > _MAX_OPEN_FDS:
                    old, old_fd = _open_fds.popitem(last=False)
                    old._fd = None
                    os.close(old_fd)
            elif _open_fds and next(reversed(_open_fds)) is not self:
                _open_fds.move_to_end(self)
            # a corrupt header's size or offset may lie far past the end
            # (a buffer of its size would not fit in memory)
            end = os.fstat(fd).st_size
            if not 0 <= offset < end:
                return b""
            return os.pread(fd, max(0, min(size, end - offset)), offset)
        except OSError as e:
            raise UstackError(f"{self.path}: {e.strerror}") from None
