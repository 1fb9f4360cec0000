"""An ELF file's code and the function starts it states, read from the file
itself: its headers, symbol tables, CFI and bytes. What decides where a
probe may go reads here, never the image cache (objfile/cache.py), which
may be stale or edited: the cache can name a candidate, this file says
whether it holds.

Everything is read on first use in a run and kept for the run (keyed by the
file's identity): a glob of thousands of probes reads each table once."""
from __future__ import annotations

import bisect
import os
import struct

from ..model import UstackError
from . import fde as fdes

_PT_LOAD, _PF_X = 1, 1
_SHT_SYMTAB, _SHT_DYNSYM, _SHT_NOBITS = 2, 11, 8
_STT_FUNC, _STT_GNU_IFUNC = 2, 10
_SHF_COMPRESSED = 0x800
_SYM64 = 24                       # sizeof(Elf64_Sym); st_value at byte 8
_CHDR64 = struct.Struct("<IIQQ")

_memo: dict = {}


class OnDisk:
    """One ELF file as it is on disk now. Use OnDisk.of(path)."""

    @classmethod
    def of(cls, path: str) -> "OnDisk":
        try:
            st = os.stat(path)
        except OSError as e:
            raise UstackError(f"{path}: {e.strerror}") from None
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        found = _memo.get(key)
        if found is None:
            found = _memo[key] = cls(path)
        return found

    @classmethod
    def read_all(cls, paths: list, threads: int = 8) -> None:
        """OnDisk.of each of `paths` (those unreadable skipped), by a few
        threads at once: with the page cache cold each file's headers are
        two or three disk reads, which wait outside the GIL (a
        whole-machine run's ~120 objects: 0.4 s one by one at load 5)."""
        todo = list(dict.fromkeys(paths))

        def read() -> None:
            while todo:
                try:
                    path = todo.pop()
                except IndexError:              # another thread took the last
                    return
                try:
                    cls.of(path)
                except UstackError:
                    pass
        import threading
        workers = [threading.Thread(target=read, daemon=True)
                   for _ in range(min(threads, len(todo) - 1))]
        for w in workers:
            w.start()
        read()
        for w in workers:
            w.join()

    def __init__(self, path: str):
        from .elf_reader import open_headers
        self.path = path
        try:
            with open(path, "rb") as f:
                reader = open_headers(path, f)
                try:
                    self.elfclass, self.machine = reader.elfclass, reader.machine
                    self.loads = [(s.vaddr, s.offset, s.filesz, s.flags)
                                  for s in reader.segments if s.type == _PT_LOAD]
                    self.sections = {s.name: s for s in reader.sections}
                    self.build_id = reader.build_id()
                finally:
                    reader.close()
        except UstackError:
            raise
        except OSError as e:
            raise UstackError(f"{path}: {e.strerror}") from None
        except Exception as e:          # libelf and pyelftools raise many types
            raise UstackError(f"{path}: corrupt ELF: {e}") from None
        self._tables = None             # symbol tables' bytes, see has_function
        self._sections: dict = {}       # name -> section(name)
        self._fde_ranges: dict = {}     # section -> (sorted ranges, their starts)
        self._fde_positions: dict = {}  # section -> {FDE start: entry position}
        self._entry_rows: dict = {}     # FDE start -> fde.entry_cfa row
        self._hdr = None                # .eh_frame_hdr's table, read once

    # --- bytes ---------------------------------------------------------------

    def _pread(self, size: int, offset: int) -> bytes:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as e:
            raise UstackError(f"{self.path}: {e.strerror}") from None
        try:
            # a damaged header's offset or size may pass any file's end
            # (pread takes neither past 2**63): what the file has there
            end = os.fstat(fd).st_size
            if not 0 <= offset < end:
                return b""
            return os.pread(fd, max(0, min(size, end - offset)), offset)
        finally:
            os.close(fd)

    def file_offset(self, vaddr: int) -> int | None:
        """Where vaddr's byte is in the file, when an executable segment holds it."""
        for seg_vaddr, offset, filesz, flags in self.loads:
            if flags & _PF_X and seg_vaddr <= vaddr < seg_vaddr + filesz:
                return vaddr - seg_vaddr + offset
        return None

    def code(self, start: int, end: int) -> bytes:
        """The file's bytes for [start, end) of one executable segment (cut
        at its end)."""
        for seg_vaddr, offset, filesz, flags in self.loads:
            if flags & _PF_X and seg_vaddr <= start < seg_vaddr + filesz:
                end = min(end, seg_vaddr + filesz)
                return self._pread(end - start, start - seg_vaddr + offset)
        return b""

    def read(self, vaddr: int, size: int) -> bytes:
        """The file's bytes for [vaddr, vaddr + size) of any loaded segment
        (cut at its end): a switch table in .rodata, say."""
        for seg_vaddr, offset, filesz, _flags in self.loads:
            if seg_vaddr <= vaddr < seg_vaddr + filesz:
                size = min(size, seg_vaddr + filesz - vaddr)
                return self._pread(size, vaddr - seg_vaddr + offset)
        return b""

    def fde_ranges(self) -> list:
        """(start, end) of every FDE of .eh_frame, else .debug_frame, sorted."""
        return self._ranges(".eh_frame")[0] or self._ranges(".debug_frame")[0]

    def fde_before(self, start: int) -> tuple | None:
        """(start, end) of the FDE that begins last before `start`."""
        for name in (".eh_frame", ".debug_frame"):
            ranges, starts = self._ranges(name)
            i = bisect.bisect_left(starts, start)
            if i:
                return ranges[i - 1]
        return None

    def section(self, name: str) -> tuple | None:
        """(bytes, address) of a section (inflated if compressed), or None."""
        if name not in self._sections:
            self._sections[name] = self._read_section(name)
        return self._sections[name]

    def _read_section(self, name: str) -> tuple | None:
        sec = self.sections.get(name)
        if sec is None or sec.type == _SHT_NOBITS or not sec.size:
            return None
        data = self._pread(sec.size, sec.offset)
        if sec.flags & _SHF_COMPRESSED:
            import zlib
            if len(data) < _CHDR64.size or _CHDR64.unpack_from(data)[0] != 1:
                return None
            try:
                data = zlib.decompress(data[_CHDR64.size:])
            except zlib.error:
                return None
        return data, sec.addr

    # --- function starts -------------------------------------------------------

    def has_function(self, address: int) -> bool:
        """Whether a symbol table of the file has a function at `address`."""
        if self._tables is None:
            self._tables = [self._pread(s.size, s.offset) for s in self.sections.values()
                            if s.type in (_SHT_SYMTAB, _SHT_DYNSYM)]
        if self.elfclass != 64:
            return False
        needle = struct.pack("<Q", address)
        for table in self._tables:
            at = table.find(needle)
            while at >= 0:
                entry = at - 8
                if entry % _SYM64 == 0 and table[entry + 4] & 0xf in (_STT_FUNC, _STT_GNU_IFUNC) \
                        and table[entry + 6:entry + 8] != b"\0\0":     # defined here
                    return True
                at = table.find(needle, at + 1)
        return False

    def fde(self, vaddr: int) -> tuple | None:
        """(start, end) of the FDE that covers vaddr, from .eh_frame (found
        through .eh_frame_hdr when there is one) or .debug_frame."""
        hdr = self.section(".eh_frame_hdr")
        eh = self.section(".eh_frame")
        if hdr is not None and eh is not None:
            data, base = eh
            try:            # a damaged header or FDE: the scan below decides
                at = self._hdr_lookup(hdr, vaddr)
                found = (fdes.fde_range(data, at - base, True, base)
                         if at is not None and base <= at < base + len(data) else None)
            except (IndexError, struct.error, ValueError, OverflowError):
                found = None
            if found is not None and found[0] <= vaddr < found[1]:
                return found
        for name in (".eh_frame", ".debug_frame"):
            ranges, starts = self._ranges(name)
            found = fdes.covering(ranges, starts, vaddr)
            if found is not None:
                return found
        return None

    def _ranges(self, name: str) -> tuple:
        hit = self._fde_ranges.get(name)
        if hit is None:
            sec = self.section(name)
            ranges = fdes.all_ranges(sec[0], sec[1], name == ".eh_frame") if sec else []
            hit = self._fde_ranges[name] = (ranges, [r[0] for r in ranges])
        return hit

    def _hdr_lookup(self, hdr: tuple, vaddr: int) -> int | None:
        """fde.hdr_lookup with the header's table read once per run."""
        if self._hdr is None:
            self._hdr = fdes.hdr_table(hdr[0], hdr[1]) or ()
        if not self._hdr:
            return None
        starts, found = self._hdr
        i = bisect.bisect_right(starts, vaddr - hdr[1])
        return (hdr[1] + found[i - 1]) & 0xffffffffffffffff if i else None

    def entry_row(self, start: int) -> tuple | None:
        """fde.entry_cfa of the FDE that begins at `start` (from .eh_frame,
        through .eh_frame_hdr when there is one, or .debug_frame), None when
        no FDE begins there or its first row cannot be read."""
        if start not in self._entry_rows:
            self._entry_rows[start] = self._entry_row(start)
        return self._entry_rows[start]

    def _entry_row(self, start: int) -> tuple | None:
        hdr = self.section(".eh_frame_hdr")
        eh = self.section(".eh_frame")
        if hdr is not None and eh is not None:
            data, base = eh
            try:
                at = self._hdr_lookup(hdr, start)
            except (IndexError, struct.error, ValueError, OverflowError):
                at = None
            if at is not None and base <= at < base + len(data):
                row = fdes.entry_cfa(data, at - base, True, base)
                if row is not None and row[0] == start:
                    return row
        for name in (".eh_frame", ".debug_frame"):
            sec = self.section(name)
            if sec is None:
                continue
            positions = self._fde_positions.get(name)
            if positions is None:
                positions = self._fde_positions[name] = fdes.entry_positions(
                    sec[0], sec[1], name == ".eh_frame")
            if start in positions:
                row = fdes.entry_cfa(sec[0], positions[start], name == ".eh_frame", sec[1])
                if row is not None and row[0] == start:
                    return row
        return None
