"""file:line and inlined calls at an address of an ELF file with DWARF, as
`eu-addr2line -i -f` gives them: the one door symbols/ uses.

Two sources, in this order:
1. a SymCache of the whole file (objfile.symcache): built once by symbolic
   (~0.2 s for libc's debug file), kept on disk by build-id, then read in
   place — a warm lookup is a binary search;
2. pyelftools, one compilation unit at a time (objfile.dwarf_units), for
   what the SymCache cannot answer: symbolic missing or unable to read the
   file, files that borrow from a dwz alt file (.gnu_debugaltlink: symbolic
   does not read those), code above 4 GiB, and addresses where the
   SymCache knows only a symbol (line rows outside any DWARF function,
   e.g. libc's xdr_uint32_t)."""
from __future__ import annotations

import os
from typing import Optional

from . import cache as objcache
from . import symcache
from .debuginfo import find_alt_file
from .dwarf_units import DwarfUnits, SourceLoc
from .elf import ElfImage

__all__ = ["LineTable", "SourceLoc", "has_dwarf"]

_MAX_ANSWERS = 1 << 18   # per-address answers kept in memory


def has_dwarf(image: ElfImage) -> bool:
    names = image.section_names
    return bool({".debug_info", ".zdebug_info"} & names) and bool(
        {".debug_line", ".zdebug_line"} & names)


class LineTable:
    """The source locations of one ELF file with DWARF. Use for_image()."""

    _memo: dict = {}
    built_symcaches = 0   # SymCaches built (not read back) in this process (tests, bench)

    @classmethod
    def for_image(cls, image: ElfImage) -> Optional["LineTable"]:
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
        """Forget the tables held in memory; the disk cache stays, so the
        next for_image() reads them back from it."""
        cls._memo.clear()

    def __init__(self, image: ElfImage, st: os.stat_result):
        self.path = image.path
        self._st = st
        self._build_id = image.build_id
        self._answers: dict = {}      # vaddr -> tuple of SourceLoc
        self.errors: list = []        # why some addresses gave nothing (corrupt DWARF)
        self._alt_path = None
        self._alt_missing = False
        # dwz: names and DIEs live partly in an alt file symbolic does not open
        self._symcache_tried = ".gnu_debugaltlink" in image.section_names
        if self._symcache_tried:
            found = find_alt_file(image)
            self._alt_path = found.path
            self._alt_missing = found.path is None
            self.errors.extend(found.refused)
        self._symcache: Optional[symcache.SymCache] = None
        self._units: Optional[DwarfUnits] = None

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
        table = self._table()
        if table is not None:
            chain = table.locate(vaddr)
            if chain is not None:
                return tuple(SourceLoc(*c) for c in chain)
        units = self._dwarf_units()
        found = units.locate(vaddr)
        if units.errors:
            self.errors.extend(units.errors)
            units.errors.clear()
        return found

    def _dwarf_units(self) -> DwarfUnits:
        if self._units is None:
            self._units = DwarfUnits(self.path, self._st, self._build_id, self._alt_path,
                                     store=not self._alt_missing)
        return self._units

    def _table(self) -> Optional[symcache.SymCache]:
        """The file's SymCache: from the disk cache, else built and stored;
        None when it cannot be had (then pyelftools answers)."""
        if not self._symcache_tried:
            self._symcache_tried = True         # one try per process
            cache = objcache.cache_file("lines", self.path, self._st, self._build_id,
                                        f"symcache{symcache.FORMAT_VERSION}")
            data = objcache.read_mapped(cache)
            if data is not None:
                try:
                    self._symcache = symcache.SymCache(data)
                except symcache.SymCacheError:
                    data = None                 # stale or damaged: built again
            if data is None:
                try:
                    blob = symcache.build(self.path)
                    self._symcache = symcache.SymCache(blob)
                except symcache.SymCacheError:
                    return None                 # pyelftools says what is wrong, if anything
                LineTable.built_symcaches += 1
                objcache.write(cache, blob)
        return self._symcache
