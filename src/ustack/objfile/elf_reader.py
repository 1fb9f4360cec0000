"""Where objfile.elf gets an ELF file's headers and section contents:
libelf (native.libelf), else pyelftools. Both give the ELF spec's numbers
(native.libelf's Section and Segment) and section bytes with the byte
order `order` to unpack them by; the symbol tables are then read from
those bytes by objfile.elf, the same way for both.

libelf reads libc's debug file in ~15 ms; pyelftools' header parsing
alone imports ~25 ms of modules and its symbol iteration took ~0.3 s."""
from __future__ import annotations

from .elf_headers import MACHINES, read_headers

_E_TYPES = {0: "ET_NONE", 1: "ET_REL", 2: "ET_EXEC", 3: "ET_DYN", 4: "ET_CORE"}


def open_reader(path: str, f):
    """A reader of the ELF file at `path` (`f`: it open, binary): libelf's
    when installed, else pyelftools'. Raises on a corrupt file."""
    from ..native import libelf     # its bindings: ~1 ms to import, more to load
    if libelf.available():
        return _LibelfReader(path, f.fileno())
    return _PyelftoolsReader(f)


def open_headers(path: str, f):
    """A reader of the file's headers alone (segments, sections,
    build_id(); no section bytes): objfile.elf_headers' for an ELF64
    little-endian file, which needs no libelf, else open_reader's."""
    return read_headers(f) or open_reader(path, f)


class _LibelfReader:
    """native.libelf's ElfFile; contents in this machine's byte order."""

    order = "="

    def __init__(self, path: str, fd: int):
        from ..native import libelf
        self._file = libelf.ElfFile(path, fd)
        self.e_type = _E_TYPES.get(self._file.e_type, self._file.e_type)
        self.machine = MACHINES.get(self._file.e_machine, self._file.e_machine)
        self.elfclass = self._file.elfclass
        self.little_endian = self._file.little_endian
        self.segments = self._file.segments
        self.sections = self._file.sections

    def data(self, section) -> bytes:
        """native.libelf's Section's bytes."""
        return self._file.data(section)

    def build_id(self) -> str | None:
        return self._file.build_id()

    def close(self) -> None:
        self._file.close()


class _PyelftoolsReader:
    """pyelftools' ELFFile; contents as the file holds them."""

    def __init__(self, f):
        from elftools.elf import enums
        from elftools.elf.elffile import ELFFile

        from ..native.libelf import Section, Segment
        f.seek(0)
        self._elf = elf = ELFFile(f)
        self.e_type = elf.header.e_type
        self.machine = elf.header.e_machine
        self.elfclass = elf.elfclass
        self.little_endian = elf.little_endian
        self.order = "<" if elf.little_endian else ">"
        sh_types = _numbers(enums, "ENUM_SH_TYPE_")
        p_types = _numbers(enums, "ENUM_P_TYPE_")
        self.segments = [Segment(p_types.get(s["p_type"], s["p_type"]), s["p_offset"],
                                 s["p_vaddr"], s["p_filesz"], s["p_flags"])
                         for s in elf.iter_segments()]
        self._raw = list(elf.iter_sections())
        self.sections = [Section(i, s.name, sh_types.get(s["sh_type"], s["sh_type"]),
                                 s["sh_flags"], s["sh_addr"], s["sh_offset"], s["sh_size"],
                                 s["sh_link"], s["sh_entsize"])
                         for i, s in enumerate(self._raw)]

    def data(self, section) -> bytes:
        if section.type == 8 or not section.size:       # SHT_NOBITS
            return b""
        return self._raw[section.index].data()

    def build_id(self) -> str | None:
        # sections when present; PT_NOTE for stripped-of-sections files
        containers = [s for s in self._raw if s["sh_type"] == "SHT_NOTE"]
        if not containers:
            containers = [s for s in self._elf.iter_segments() if s["p_type"] == "PT_NOTE"]
        for c in containers:
            for note in c.iter_notes():
                if note["n_type"] == "NT_GNU_BUILD_ID" and note["n_name"] == "GNU":
                    return note["n_desc"]
        return None

    def close(self) -> None:
        pass


def _numbers(enums, prefix: str) -> dict:
    """pyelftools' names of section or segment types -> their numbers."""
    out: dict = {}
    for name in dir(enums):
        if name.startswith(prefix):
            out.update((k, v) for k, v in getattr(enums, name).items()
                       if not k.startswith("_"))
    return out
