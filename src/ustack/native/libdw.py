"""file:line and inlined calls at an address through elfutils' libdw (the
library eu-addr2line is built on), called with ctypes: nothing is read up
front. .debug_aranges says which compilation unit holds an address, and
libdw reads only that unit's line program and DIEs, so a first answer costs
milliseconds where a whole-file table (objfile.symcache) costs ~0.2 s.

The chain is put together the way `eu-addr2line -i -f` does it
(elfutils src/addr2line.c): the scopes at the address (dwarf_getscopes),
innermost first; each function named by its linkage name when DWARF has
one, else its name; the innermost at the line table's row, each enclosing
one at the DW_AT_call_file/DW_AT_call_line of the call it inlined.

A compressed debug file is read from an image of the sections needed,
inflated in memory by objfile.dwarf_image (dwarf_begin_elf on elf_memory):
libdw's own dwarf_begin would inflate every section with zlib first.

libdw is found as libdw.so.1 (Debian's libdw1, which elfutils depends on);
without it, available() is False and callers use another source. It lives
in kernel/, the layer that holds every foreign call (as dynlink.py does),
so the rest of ustack stays plain Python."""
from __future__ import annotations

import ctypes
import os

from . import clib, libelf

_TAG_ENTRY_POINT, _TAG_INLINED, _TAG_SUBPROGRAM = 0x03, 0x1D, 0x2E
_AT_LINKAGE_NAME, _AT_MIPS_LINKAGE_NAME = 0x6E, 0x2007
_AT_CALL_FILE, _AT_CALL_LINE, _AT_COMP_DIR = 0x58, 0x59, 0x1B
_FUNCTIONS = (_TAG_INLINED, _TAG_ENTRY_POINT, _TAG_SUBPROGRAM)
_DWARF_C_READ = 0
_E_NOERROR, _E_NO_MATCH = 0, 37        # libdwP.h's DWARF_E_NOERROR, DWARF_E_NO_MATCH


class _Die(ctypes.Structure):
    """Dwarf_Die of libdw.h: filled in by libdw, opaque here."""
    _fields_ = [("addr", ctypes.c_void_p), ("cu", ctypes.c_void_p),
                ("abbrev", ctypes.c_void_p), ("padding", ctypes.c_long)]


class _Attribute(ctypes.Structure):
    """Dwarf_Attribute of libdw.h."""
    _fields_ = [("code", ctypes.c_uint), ("form", ctypes.c_uint),
                ("valp", ctypes.c_void_p), ("cu", ctypes.c_void_p)]


_lib = None            # the loaded libdw, False when it cannot be had


def _load():
    global _lib
    if _lib is None:
        P, D, A = ctypes.c_void_p, ctypes.POINTER(_Die), ctypes.POINTER(_Attribute)
        u64, cstr = ctypes.c_uint64, ctypes.c_char_p
        elf = libelf.library()                   # libdw's own dependency
        libc = clib.bind(None, (("free", None, [P]),))
        lib = elf and libc and clib.bind("libdw.so.1", (
                ("dwarf_begin", P, [ctypes.c_int, ctypes.c_int]),
                ("dwarf_begin_elf", P, [P, ctypes.c_int, P]),
                ("dwarf_end", ctypes.c_int, [P]),
                ("dwarf_setalt", None, [P, P]),
                ("dwarf_addrdie", D, [P, u64, D]),
                ("dwarf_getsrc_die", P, [D, u64]),
                ("dwarf_linesrc", cstr, [P, P, P]),
                ("dwarf_lineno", ctypes.c_int, [P, ctypes.POINTER(ctypes.c_int)]),
                ("dwarf_getscopes", ctypes.c_int, [D, u64, ctypes.POINTER(D)]),
                ("dwarf_getscopes_die", ctypes.c_int, [D, ctypes.POINTER(D)]),
                ("dwarf_tag", ctypes.c_int, [D]),
                ("dwarf_attr", A, [D, ctypes.c_uint, A]),
                ("dwarf_attr_integrate", A, [D, ctypes.c_uint, A]),
                ("dwarf_formstring", cstr, [A]),
                ("dwarf_formudata", ctypes.c_int, [A, ctypes.POINTER(u64)]),
                ("dwarf_diename", cstr, [D]),
                ("dwarf_getsrcfiles", ctypes.c_int, [D, ctypes.POINTER(P), P]),
                ("dwarf_filesrc", cstr, [P, ctypes.c_size_t, P, P]),
                ("dwarf_errmsg", cstr, [ctypes.c_int]),
                ("dwarf_errno", ctypes.c_int, [])))
        if lib is not None:
            lib.elf_memory, lib.elf_end, lib.free = elf.elf_memory, elf.elf_end, libc.free
        _lib = lib or False
    return _lib


def available() -> bool:
    return bool(_load())


class LibdwError(Exception):
    """libdw cannot read the file's DWARF."""


class Libdw:
    """The DWARF of one ELF file, open through libdw until close(). One
    thread at a time: lookups share ctypes buffers, and libdw 0.188 reads
    units lazily without locks."""

    def __init__(self, path: str, alt_path: str | None = None,
                 image=None):
        """`alt_path`: the dwz alt file the DWARF borrows names and DIEs
        from (objfile.debuginfo.find_alt_file), when it has one. `image`:
        a writable buffer (mmap, bytearray) holding an ELF image of path's
        DWARF sections (objfile.dwarf_image), read instead of the file;
        kept until close()."""
        lib = _load()
        if not lib:
            raise LibdwError("libdw.so.1 is not installed")
        self._lib = lib
        self._fds: list = []
        self._dwarfs: list = []
        self._elf = None
        self._image = None
        self._dwarf = self._begin(path) if image is None else self._begin_image(path, image)
        if alt_path is not None:
            alt = self._begin(alt_path)
            lib.dwarf_setalt(self._dwarf, alt)
        self._files: dict = {}      # unit DIE address -> Dwarf_Files pointer
        self._comp_dirs: dict = {}  # unit DIE address -> its DW_AT_comp_dir
        self._attr = _Attribute()
        self._word = ctypes.c_uint64()

    def _begin(self, path: str):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as e:
            raise LibdwError(f"{path}: {e.strerror}") from None
        self._fds.append(fd)
        return self._kept(path, self._lib.dwarf_begin(fd, _DWARF_C_READ))

    def _begin_image(self, path: str, image):
        self._image = (ctypes.c_char * len(image)).from_buffer(image)
        self._elf = self._lib.elf_memory(self._image, len(image))
        return self._kept(path, self._lib.dwarf_begin_elf(self._elf, _DWARF_C_READ, None)
                          if self._elf else None)

    def _kept(self, path: str, dwarf):
        """`dwarf` kept for close(); when libdw gave none, all closed and why raised."""
        if not dwarf:
            why = self._error()
            self.close()
            raise LibdwError(f"{path}: {why}")
        self._dwarfs.append(dwarf)
        return dwarf

    def _error(self, err: int = -1) -> str:
        msg = self._lib.dwarf_errmsg(err)      # -1: the last error
        return msg.decode(errors="replace") if msg else "no DWARF"

    def close(self) -> None:
        # the main file before its alt file: dwarf_end of the main one reads no alt
        for dwarf in self._dwarfs:
            self._lib.dwarf_end(dwarf)
        for fd in self._fds:
            os.close(fd)
        if self._elf:                   # after dwarf_end: libdw reads it until then
            self._lib.elf_end(self._elf)
        self._dwarfs, self._fds, self._elf, self._image = [], [], None, None

    def locate(self, vaddr: int) -> tuple:
        """[(function, file, line)] at vaddr, innermost inlined call first and
        the real function last ('' for a function DWARF does not name); ()
        when DWARF says nothing about vaddr."""
        lib = self._lib
        cu = _Die()
        lib.dwarf_errno()                       # clears the last error
        if not lib.dwarf_addrdie(self._dwarf, vaddr, ctypes.byref(cu)):
            err = lib.dwarf_errno()
            if err in (_E_NOERROR, _E_NO_MATCH):
                return ()                       # no unit covers vaddr
            raise LibdwError(self._error(err))  # a unit does, and is unreadable
        comp_dir = self._comp_dir(cu)
        file, line = "", 0
        row = lib.dwarf_getsrc_die(ctypes.byref(cu), vaddr)
        if row:
            number = ctypes.c_int()
            src = lib.dwarf_linesrc(row, None, None)
            if src is not None and lib.dwarf_lineno(row, ctypes.byref(number)) == 0 \
                    and number.value:           # line 0 is eu-addr2line's ??:0
                file, line = _joined(comp_dir, src), number.value
        scopes = ctypes.POINTER(_Die)()
        n = lib.dwarf_getscopes(ctypes.byref(cu), vaddr, ctypes.byref(scopes))
        if n < 0:
            raise LibdwError(self._error())
        if n == 0:
            return (("", file, line),) if line else ()
        try:
            # the innermost function: the first function scope at vaddr
            tags = [lib.dwarf_tag(ctypes.byref(scopes[i])) for i in range(n)]
            inner = next((scopes[i] for i in range(n)
                          if tags[i] in (_TAG_SUBPROGRAM, _TAG_INLINED)), None)
            chain = [(self._name(inner) if inner is not None else "", file, line)]
            m = 0
            if _TAG_INLINED in tags:
                # the calls it was inlined by: the concrete scopes holding the
                # innermost one (dwarf_getscopes gives the abstract origin's)
                outer = ctypes.POINTER(_Die)()
                m = lib.dwarf_getscopes_die(ctypes.byref(scopes[0]), ctypes.byref(outer))
        finally:
            lib.free(scopes)
        try:
            outer_tags = [lib.dwarf_tag(ctypes.byref(outer[i])) for i in range(max(m, 0))]
            for i in range(max(m, 0) - 1):
                if outer_tags[i] != _TAG_INLINED:
                    continue
                caller = next((outer[j] for j in range(i + 1, m)
                               if outer_tags[j] in _FUNCTIONS), None)
                chain.append((self._name(caller) if caller is not None else "",
                              *self._call_site(cu, comp_dir, outer[i])))
        finally:
            if m > 0:
                lib.free(outer)
        return tuple(chain)

    def _comp_dir(self, cu: _Die) -> bytes | None:
        if cu.addr in self._comp_dirs:
            return self._comp_dirs[cu.addr]
        attr = ctypes.byref(self._attr)
        found = None
        if self._lib.dwarf_attr(ctypes.byref(cu), _AT_COMP_DIR, attr):
            found = self._lib.dwarf_formstring(attr)
        self._comp_dirs[cu.addr] = found
        return found

    def _name(self, die: _Die) -> str:
        """The linkage name if DWARF has one, through abstract origins; else
        the name (addr2line.c's get_diename)."""
        lib, attr = self._lib, ctypes.byref(self._attr)
        ref = ctypes.byref(die)
        for code in (_AT_MIPS_LINKAGE_NAME, _AT_LINKAGE_NAME):
            if lib.dwarf_attr_integrate(ref, code, attr):
                name = lib.dwarf_formstring(attr)
                if name is not None:
                    return os.fsdecode(name)
        name = lib.dwarf_diename(ref)
        return os.fsdecode(name) if name is not None else ""

    def _udata(self, die: _Die, code: int) -> int | None:
        lib, attr, word = self._lib, ctypes.byref(self._attr), self._word
        if not lib.dwarf_attr(ctypes.byref(die), code, attr):
            return None
        if lib.dwarf_formudata(attr, ctypes.byref(word)) != 0:
            return None
        return word.value

    def _call_site(self, cu: _Die, comp_dir: bytes | None, die: _Die) -> tuple:
        """(file, line) of an inlined call, '' and 0 when unknown."""
        line = self._udata(die, _AT_CALL_LINE) or 0
        index = self._udata(die, _AT_CALL_FILE)
        if index is None:
            return "", line
        files = self._files.get(cu.addr)
        if files is None:
            files = ctypes.c_void_p()
            if self._lib.dwarf_getsrcfiles(ctypes.byref(cu), ctypes.byref(files), None) != 0:
                files = ctypes.c_void_p()
            self._files[cu.addr] = files
        if not files:
            return "", line
        src = self._lib.dwarf_filesrc(files, index, None, None)
        return (_joined(comp_dir, src) if src is not None else ""), line


def _joined(comp_dir: bytes | None, src: bytes) -> str:
    """A relative source path under the unit's DW_AT_comp_dir, joined as
    eu-addr2line joins them (its default --absolute): nothing cleaned."""
    if comp_dir is not None and not src.startswith(b"/"):
        src = comp_dir + b"/" + src
    return os.fsdecode(src)
