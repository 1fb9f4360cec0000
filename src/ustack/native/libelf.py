"""ELF files through elfutils' libelf (libelf.so.1, which libdw and
elfutils depend on), called with ctypes: the headers, the sections and
their contents, which libelf checks against the file's size and converts
to this machine's byte order. objfile.elf reads symbol tables from them:
~15 ms for libc's debug file where pyelftools takes ~0.3 s.

Without libelf.so.1, available() is False and objfile.elf uses pyelftools.
It lives in kernel/, the layer that holds every foreign call."""
from __future__ import annotations

import ctypes
import os
from collections import namedtuple

from . import clib

_EV_CURRENT = 1
_ELF_C_READ_MMAP = 8
_ELF_K_ELF = 3
_ELF_T_NHDR = 19
_NT_GNU_BUILD_ID = 3
_SHT_NOTE, _SHT_NOBITS = 7, 8
_PT_NOTE = 4


class _Ehdr(ctypes.Structure):
    """GElf_Ehdr (= Elf64_Ehdr)."""
    _fields_ = [("e_ident", ctypes.c_ubyte * 16), ("e_type", ctypes.c_uint16),
                ("e_machine", ctypes.c_uint16), ("e_version", ctypes.c_uint32),
                ("e_entry", ctypes.c_uint64), ("e_phoff", ctypes.c_uint64),
                ("e_shoff", ctypes.c_uint64), ("e_flags", ctypes.c_uint32),
                ("e_ehsize", ctypes.c_uint16), ("e_phentsize", ctypes.c_uint16),
                ("e_phnum", ctypes.c_uint16), ("e_shentsize", ctypes.c_uint16),
                ("e_shnum", ctypes.c_uint16), ("e_shstrndx", ctypes.c_uint16)]


class _Shdr(ctypes.Structure):
    """GElf_Shdr (= Elf64_Shdr)."""
    _fields_ = [("sh_name", ctypes.c_uint32), ("sh_type", ctypes.c_uint32),
                ("sh_flags", ctypes.c_uint64), ("sh_addr", ctypes.c_uint64),
                ("sh_offset", ctypes.c_uint64), ("sh_size", ctypes.c_uint64),
                ("sh_link", ctypes.c_uint32), ("sh_info", ctypes.c_uint32),
                ("sh_addralign", ctypes.c_uint64), ("sh_entsize", ctypes.c_uint64)]


class _Phdr(ctypes.Structure):
    """GElf_Phdr (= Elf64_Phdr)."""
    _fields_ = [("p_type", ctypes.c_uint32), ("p_flags", ctypes.c_uint32),
                ("p_offset", ctypes.c_uint64), ("p_vaddr", ctypes.c_uint64),
                ("p_paddr", ctypes.c_uint64), ("p_filesz", ctypes.c_uint64),
                ("p_memsz", ctypes.c_uint64), ("p_align", ctypes.c_uint64)]


class _Data(ctypes.Structure):
    """Elf_Data of libelf.h."""
    _fields_ = [("d_buf", ctypes.c_void_p), ("d_type", ctypes.c_int),
                ("d_version", ctypes.c_uint), ("d_size", ctypes.c_size_t),
                ("d_off", ctypes.c_int64), ("d_align", ctypes.c_size_t)]


class _Nhdr(ctypes.Structure):
    """GElf_Nhdr."""
    _fields_ = [("n_namesz", ctypes.c_uint32), ("n_descsz", ctypes.c_uint32),
                ("n_type", ctypes.c_uint32)]


class Section(namedtuple("Section", "index name type flags addr offset size link entsize")):
    """A section header, by the ELF spec's numbers (name a str)."""
    __slots__ = ()


class Segment(namedtuple("Segment", "type offset vaddr filesz flags")):
    """A program header."""
    __slots__ = ()


_lib = None            # the loaded libelf, False when it cannot be had


def library():
    """libelf.so.1 with the functions ustack calls typed, None without it
    (native.libdw opens in-memory images through it too)."""
    global _lib
    if _lib is None:
        P, size, D = ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(_Data)
        psize = ctypes.POINTER(size)
        lib = clib.bind("libelf.so.1", (
                ("elf_version", ctypes.c_uint, [ctypes.c_uint]),
                ("elf_begin", P, [ctypes.c_int, ctypes.c_int, P]),
                ("elf_memory", P, [P, size]),
                ("elf_end", ctypes.c_int, [P]),
                ("elf_kind", ctypes.c_int, [P]),
                ("gelf_getclass", ctypes.c_int, [P]),
                ("gelf_getehdr", P, [P, ctypes.POINTER(_Ehdr)]),
                ("elf_getphdrnum", ctypes.c_int, [P, psize]),
                ("gelf_getphdr", P, [P, ctypes.c_int, ctypes.POINTER(_Phdr)]),
                ("elf_getshdrnum", ctypes.c_int, [P, psize]),
                ("elf_getshdrstrndx", ctypes.c_int, [P, psize]),
                ("elf_getscn", P, [P, size]),
                ("gelf_getshdr", P, [P, ctypes.POINTER(_Shdr)]),
                ("elf_strptr", ctypes.c_char_p, [P, size, size]),
                ("elf_getdata", D, [P, P]),
                ("elf_getdata_rawchunk", D, [P, ctypes.c_int64, size, ctypes.c_int]),
                ("gelf_getnote", size, [D, size, ctypes.POINTER(_Nhdr), psize, psize]),
                ("elf_errno", ctypes.c_int, []),
                ("elf_errmsg", ctypes.c_char_p, [ctypes.c_int])))
        if lib is not None:
            lib.elf_version(_EV_CURRENT)         # before any other libelf call
        _lib = lib or False
    return _lib or None


def available() -> bool:
    return library() is not None


class ElfError(Exception):
    """libelf finds the file corrupt; the message says why."""


class ElfFile:
    """One ELF file open through libelf until close() (or `with`)."""

    def __init__(self, path: str, fd: int | None = None):
        """`fd`: the file already open (a copy of it is kept), else `path`
        is opened."""
        lib = library()
        if lib is None:
            raise ElfError("libelf.so.1 is not installed")
        self._lib = lib
        self._elf = None
        self._fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC) if fd is None else os.dup(fd)
        self._size = os.fstat(self._fd).st_size
        self._elf = lib.elf_begin(self._fd, _ELF_C_READ_MMAP, None)
        try:
            if not self._elf or lib.elf_kind(self._elf) != _ELF_K_ELF:
                raise ElfError(self._why("not an ELF file"))
            ehdr = _Ehdr()
            if not lib.gelf_getehdr(self._elf, ctypes.byref(ehdr)):
                raise ElfError(self._why("no ELF header"))
            self.e_type, self.e_machine = ehdr.e_type, ehdr.e_machine
            self.elfclass = 64 if ehdr.e_ident[4] == 2 else 32
            self.little_endian = ehdr.e_ident[5] == 1
            self.segments = self._segments()
            self.sections = self._sections(ehdr)
        except BaseException:
            self.close()
            raise

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        if self._elf:
            self._lib.elf_end(self._elf)
            self._elf = None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _why(self, default: str) -> str:
        """libelf's message for its last error (which this clears), else `default`."""
        err = self._lib.elf_errno()
        msg = self._lib.elf_errmsg(err) if err else None
        return msg.decode(errors="replace") if msg else default

    def _segments(self) -> list:
        lib, n = self._lib, ctypes.c_size_t()
        if lib.elf_getphdrnum(self._elf, ctypes.byref(n)) != 0:
            raise ElfError(self._why("bad program headers"))
        out, phdr = [], _Phdr()
        for i in range(n.value):
            if not lib.gelf_getphdr(self._elf, i, ctypes.byref(phdr)):
                raise ElfError(self._why(f"bad program header {i}"))
            out.append(Segment(phdr.p_type, phdr.p_offset, phdr.p_vaddr,
                               phdr.p_filesz, phdr.p_flags))
        return out

    def _sections(self, ehdr: _Ehdr) -> list:
        lib, n, strndx = self._lib, ctypes.c_size_t(), ctypes.c_size_t()
        if lib.elf_getshdrnum(self._elf, ctypes.byref(n)) != 0:
            raise ElfError(self._why("bad section headers"))
        if ehdr.e_shoff + max(n.value, ehdr.e_shnum) * ehdr.e_shentsize > self._size:
            raise ElfError("section headers past the end of the file")
        if n.value and lib.elf_getshdrstrndx(self._elf, ctypes.byref(strndx)) != 0:
            raise ElfError(self._why("no section name table"))
        out, shdr = [], _Shdr()
        for i in range(n.value):
            scn = lib.elf_getscn(self._elf, i)
            if not scn or not lib.gelf_getshdr(scn, ctypes.byref(shdr)):
                raise ElfError(self._why(f"bad section header {i}"))
            name = lib.elf_strptr(self._elf, strndx.value, shdr.sh_name) if i else b""
            out.append(Section(i, os.fsdecode(name or b""), shdr.sh_type, shdr.sh_flags,
                               shdr.sh_addr, shdr.sh_offset, shdr.sh_size, shdr.sh_link,
                               shdr.sh_entsize))
        return out

    def data(self, section: Section) -> bytes:
        """The section's contents in this machine's byte order (as file
        bytes for code and strings); b"" for SHT_NOBITS."""
        if section.type == _SHT_NOBITS or not section.size:
            return b""
        d = self._lib.elf_getdata(self._lib.elf_getscn(self._elf, section.index), None)
        if not d:
            raise ElfError(self._why(f"section {section.name or section.index} "
                                     "cannot be read"))
        d = d.contents
        return ctypes.string_at(d.d_buf, d.d_size) if d.d_buf else b""

    def build_id(self) -> str | None:
        """NT_GNU_BUILD_ID's bytes in hex, from the note sections, else
        (no section headers) the PT_NOTE segments."""
        lib = self._lib
        chunks = [lib.elf_getdata(lib.elf_getscn(self._elf, s.index), None)
                  for s in self.sections if s.type == _SHT_NOTE]
        if not self.sections:
            chunks = [lib.elf_getdata_rawchunk(self._elf, p.offset, p.filesz, _ELF_T_NHDR)
                      for p in self.segments if p.type == _PT_NOTE]
        nhdr, name_at, desc_at = _Nhdr(), ctypes.c_size_t(), ctypes.c_size_t()
        for data in chunks:
            if not data or not data.contents.d_buf:
                continue
            buf, pos = data.contents.d_buf, 0
            while True:
                pos = lib.gelf_getnote(data, pos, ctypes.byref(nhdr), ctypes.byref(name_at),
                                       ctypes.byref(desc_at))
                if pos == 0:
                    break
                name = ctypes.string_at(buf + name_at.value, nhdr.n_namesz)
                if nhdr.n_type == _NT_GNU_BUILD_ID and name == b"GNU\0":
                    return ctypes.string_at(buf + desc_at.value, nhdr.n_descsz).hex()
        return None
