"""file:line and inlined calls at an address of an ELF file with DWARF, as
`eu-addr2line -i -f` gives them: the one door symbols/ uses.

Sources, in this order:
1. a SymCache of the whole file on disk (objfile.symcache), built by
   symbolic and read in place: a warm lookup is a binary search;
2. libdw (native.libdw), elfutils' library, which reads only the unit
   holding an address: a cold run as fast as eu-addr2line. Its answers are
   kept (objfile.line_memo), so a run asking them again does not open the
   DWARF. Once libdw has answered BUILD_AFTER addresses of a file (in this
   run and kept from earlier ones), the next address it is asked builds the
   whole file's SymCache: a file symbolized that much pays for it, within
   the run and in every later run, for every address;
3. the SymCache built at once, when libdw cannot be used: not installed,
   or no .debug_aranges to find a unit by (clang's output);
4. pyelftools, one compilation unit at a time (objfile.dwarf_units), for
   what neither answers: symbolic missing or unable to read the file, dwz
   files (.gnu_debugaltlink: symbolic does not read those), code above
   4 GiB, addresses where the SymCache knows only a symbol (line rows
   outside any DWARF function, e.g. libc's xdr_uint32_t), corrupt units."""
from __future__ import annotations

import os

from . import cache as objcache
from . import content_key
from . import symcache
from .debuginfo import find_alt_file
from .elf import ElfImage
from .line_memo import VERSION as MEMO_VERSION, LineMemo
from .source_loc import SourceLoc

__all__ = ["LineTable", "SourceLoc", "has_dwarf"]

_MAX_ANSWERS = 1 << 18   # per-address answers kept in memory
# libdw answers of one file (this run's and kept ones) after which its
# SymCache is built: libdw costs ~0.06 ms an address, building libc's ~0.25 s
BUILD_AFTER = 2048


def has_dwarf(image: ElfImage) -> bool:
    names = image.file.section_names
    return bool({".debug_info", ".zdebug_info"} & names) and bool(
        {".debug_line", ".zdebug_line"} & names)


class LineTable:
    """The source locations of one ELF file with DWARF. Use for_image()."""

    _memo: dict = {}
    built_symcaches = 0   # SymCaches built (not read back) in this process (tests, bench)
    libdw_lookups = 0     # addresses libdw was asked in this process (tests, bench)
    libdw_images = 0      # files libdw read from an image in memory (objfile.dwarf_image)

    @classmethod
    def for_image(cls, image: ElfImage) -> "LineTable" | None:
        """None when the file has no line information."""
        if not has_dwarf(image):
            return None
        try:
            st = os.stat(image.path)
        except OSError:
            return None
        key = objcache.memo_key(st)
        table = cls._memo.get(key)
        if table is None:
            table = cls._memo[key] = cls(image, st)
        return table

    @classmethod
    def clear_cache(cls) -> None:
        """Forget the tables held in memory, as a new process would; what
        they learnt is kept on disk, so the next for_image() reads it back."""
        for table in cls._memo.values():
            table.close()
        cls._memo.clear()

    def __init__(self, image: ElfImage, st: os.stat_result):
        self.path = image.path
        self._st = st
        self._image = image
        self._answers: dict = {}      # vaddr -> tuple of SourceLoc
        self.errors: list = []        # why some addresses gave nothing (corrupt DWARF)
        self._alt_path = None
        self._alt_missing = False
        names = image.file.section_names
        # dwz: names and DIEs live partly in an alt file symbolic does not open
        self._dwz = ".gnu_debugaltlink" in names
        if self._dwz:
            found = find_alt_file(image)
            self._alt_path = found.path
            self._alt_missing = found.path is None
            self.errors.extend(found.refused)
        self._symcache: symcache.SymCache | None = None
        self._symcache_read = False   # the disk cache was looked at
        self._symcache_built = self._dwz   # one try per process
        # without .debug_aranges libdw finds no unit (eu-addr2line neither);
        # whether libdw is installed is asked when the memo lacks an answer:
        # loading it (~2 ms) is wasted on a run the memo answers
        self._libdw_usable = bool({".debug_aranges", ".zdebug_aranges"} & names)
        self._libdw = None            # a native.libdw.Libdw once opened
        self._line_memo = LineMemo(self._cache(f"memo{MEMO_VERSION}.json"),
                                   store=not self._alt_missing)
        self._units = None            # DwarfUnits, made on first use

    def close(self) -> None:
        """Save what libdw answered, free libdw's copy of the DWARF."""
        self._line_memo.save()
        if self._libdw is not None:
            self._libdw.close()
            self._libdw = None

    def locate(self, vaddr: int) -> tuple:
        """SourceLocs at vaddr, innermost inlined call first and the real
        function last; () when DWARF says nothing about vaddr."""
        hit = self._answers.get(vaddr)
        if hit is None:
            hit = self._locate(vaddr)
            if len(self._answers) >= _MAX_ANSWERS:
                self._answers.clear()
            self._answers[vaddr] = hit
        return hit

    def _locate(self, vaddr: int) -> tuple:
        table = self._disk_symcache()
        if table is None:
            chain = self._from_libdw(vaddr)
            if chain is not None:
                return tuple(map(SourceLoc._make, chain))
            table = self._built_symcache()
        if table is not None:
            chain = table.locate(vaddr)
            if chain is not None:
                return tuple(map(SourceLoc._make, chain))
        units = self._dwarf_units()
        found = units.locate(vaddr)
        if units.errors:
            self.errors.extend(units.errors)
            units.errors.clear()
        return found

    def _from_libdw(self, vaddr: int) -> tuple | None:
        """libdw's answer (or the memo of one), None when libdw cannot give
        one: then the SymCache or pyelftools answers, or says what is wrong."""
        if not self._libdw_usable:
            return None
        chain = self._line_memo.get(vaddr)
        if chain is not None:
            return chain
        from ..native import libdw
        if self._libdw is None:
            if not libdw.available():
                self._libdw_usable = False
                return None
            try:
                self._libdw = self._open_libdw()
            except libdw.LibdwError:
                self._libdw_usable = False
                return None
        try:
            chain = self._libdw.locate(vaddr)
        except libdw.LibdwError:
            return None                  # this unit is unreadable
        LineTable.libdw_lookups += 1
        self._line_memo.put(vaddr, chain)
        if len(self._line_memo) >= BUILD_AFTER and not self._dwz:
            self._build_now()
        return chain

    def _open_libdw(self):
        """libdw on the file's DWARF sections inflated here, in memory
        (objfile.dwarf_image: faster than libdw's own inflating of every
        section), else on the file."""
        from ..native import libdw
        from . import dwarf_image
        image = dwarf_image.build(self._image)
        if image is not None:
            try:
                opened = libdw.Libdw(self.path, self._alt_path, image=image)
                LineTable.libdw_images += 1
                return opened
            except libdw.LibdwError:
                pass                     # the file itself says what is wrong
        return libdw.Libdw(self.path, self._alt_path)

    def _build_now(self) -> None:
        """Many addresses asked: the SymCache answers the rest of them."""
        if self._built_symcache() is not None:
            self._line_memo.forget()
            self.close()
            self._libdw_usable = False

    def _dwarf_units(self):
        if self._units is None:
            from .dwarf_units import DwarfUnits   # pyelftools: most runs never come here
            self._units = DwarfUnits(self.path, self._st, self._alt_path,
                                     store=not self._alt_missing)
        return self._units

    def _cache(self, suffix: str) -> str:
        return objcache.cache_file("lines", content_key.of_dwarf(self._st, self._alt_path), suffix)

    def _disk_symcache(self) -> symcache.SymCache | None:
        """The file's SymCache when a run before built it, else None."""
        if not self._symcache_read:
            self._symcache_read = True
            data = None if self._dwz else objcache.read_mapped(
                self._cache(f"symcache{symcache.FORMAT_VERSION}"))
            if data is not None:
                try:
                    self._symcache = symcache.SymCache(data)
                except symcache.SymCacheError:
                    pass                        # stale or damaged: built again
        return self._symcache

    def _built_symcache(self) -> symcache.SymCache | None:
        """The file's SymCache, built now and stored; None when it cannot
        be had (then pyelftools answers)."""
        if self._symcache is None and not self._symcache_built:
            self._symcache_built = True         # one try per process
            try:
                blob = symcache.build(self.path)
                self._symcache = symcache.SymCache(blob)
            except symcache.SymCacheError:
                return None                     # pyelftools says what is wrong, if anything
            LineTable.built_symcaches += 1
            objcache.write(self._cache(f"symcache{symcache.FORMAT_VERSION}"), blob)
        return self._symcache

