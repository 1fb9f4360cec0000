"""An object's CFI looked up pc by pc through its .eh_frame_hdr, the
sorted index of its FDEs the linker writes for unwinders (libgcc's,
libunwind's): one FDE parsed per pc asked, where building the whole table
(cfi.UnwindTable) interprets every FDE first (node: 76,000 FDEs, ~1 s).
For the unwinder of a run that meets a big object before its table is
cached: a whole-machine run's deferred samples, while the table is built
for the in-kernel walk elsewhere.

lookup() answers as the whole table would: the FDE with the greatest
start at or below the pc (of equal starts, the last in the section, as
the table's stable sort keeps it), its row at the pc, None past its end.
An FDE the whole table would leave out (a CIE it cannot read, a zero
start or size, values that do not fit) is not guessed at: the whole table
is built and asked instead."""
from __future__ import annotations

import bisect
import struct
from array import array

from ..objfile.debuginfo import find_debug_file
from ..objfile.elf import ElfImage
from ..objfile.fde import hdr_table
from . import cfi

# .eh_frame bytes from which the unwinder, meeting an object whose table is
# not built yet, looks its pcs up through .eh_frame_hdr (libpython's: 290 KB,
# ~0.3 s to build whole; node's: 2.7 MB, ~1 s; bash's and libglib's ~110 KB,
# ~40 ms each, 0.2-1.0 s of a loaded whole-machine run's clock under its GIL)
INDEXED_FROM = 64 << 10


def for_unwinder(image: ElfImage, debug_dirs=()) -> tuple:
    """UnwindTable.for_image()'s answer, except for a big object whose
    table is not in memory: then (IndexedCfi, DebugLookup), which parses
    only the FDEs of the pcs asked: it does not wait for a table another
    thread or a child is building, and holds the .eh_frame (node: 2.7 MB)
    where the whole table read from disk holds 9 MB and costs ~50 ms to
    read."""
    held = cfi.UnwindTable.in_memory(image, debug_dirs)
    if held is not None:
        return held
    if indexed_by_unwinder(image, debug_dirs):
        indexed = IndexedCfi.of_image(
            image, lambda: cfi.UnwindTable.for_image(image, debug_dirs)[0])
        if indexed is not None:
            return indexed, find_debug_file(image, debug_dirs)
    return cfi.UnwindTable.for_image(image, debug_dirs)


def indexed_by_unwinder(image: ElfImage, debug_dirs=()) -> bool:
    """Whether for_unwinder() looks the object's pcs up one FDE at a time
    (a big .eh_frame, its only CFI) rather than through its whole table:
    the run's own unwinding then never needs that table built here."""
    sections = image.file.sections
    return (sections.get(".eh_frame", (0, 0, 0))[2] >= INDEXED_FROM
            and ".debug_frame" not in sections
            and find_debug_file(image, debug_dirs).path is None)


class IndexedCfi:
    """UnwindTable.lookup over the .eh_frame of an object, through its
    .eh_frame_hdr; `whole` builds the whole table when an FDE needs it."""

    def __init__(self, eh_frame: bytes, eh_vaddr: int, starts: array, fdes: array,
                 hdr_vaddr: int, whole):
        self._data, self._eh_vaddr = eh_frame, eh_vaddr
        self._starts, self._fdes, self._hdr_vaddr = starts, fdes, hdr_vaddr
        self._whole_table = whole
        self._whole = None
        self._cies: dict = {}
        self._programs: dict = {}
        self._parsed: dict = {}         # FDE offset -> (start, end, rows) | None

    @classmethod
    def of_image(cls, image: ElfImage, whole) -> "IndexedCfi | None":
        """None when the object has no usable .eh_frame_hdr."""
        sections = image.file.sections
        if ".eh_frame_hdr" not in sections or ".eh_frame" not in sections:
            return None
        hdr = image.file.section_bytes(".eh_frame_hdr")
        eh = image.file.section_bytes(".eh_frame")
        if not hdr or not eh:
            return None
        hdr_vaddr = sections[".eh_frame_hdr"][0]
        try:
            table = hdr_table(hdr, hdr_vaddr)
        except (ValueError, struct.error, IndexError):
            return None
        if table is None:
            return None
        return cls(eh, sections[".eh_frame"][0], *table, hdr_vaddr, whole)

    def __len__(self) -> int:
        return len(self._starts)

    def lookup(self, vaddr: int) -> tuple | None:
        if self._whole is not None:
            return self._whole.lookup(vaddr)
        i = bisect.bisect_right(self._starts, vaddr - self._hdr_vaddr) - 1
        if i < 0:
            return None
        first = i
        while first > 0 and self._starts[first - 1] == self._starts[i]:
            first -= 1
        offset = max(self._fdes[first:i + 1]) + self._hdr_vaddr - self._eh_vaddr
        fde = self._fde(offset)
        if fde is None or not cfi.fits(fde):
            self._whole = self._whole_table()
            return self._whole.lookup(vaddr)
        lo, hi, rows = fde
        if vaddr >= hi:
            return None
        found = None
        for off, row in rows:
            if lo + off > vaddr:
                break
            found = row
        if found is None or found[0] & 15 == cfi.NONE:
            return None
        k = found[0]
        return (k & 15, found[1], found[2], (k >> 4) & 3, found[3], found[4], k >> 6,
                found[5])

    def _fde(self, offset: int):
        if offset not in self._parsed:
            try:
                fde, _end = cfi.entry_at(self._data, offset, self._eh_vaddr, True,
                                         self._cies, self._programs)
            except (ValueError, struct.error, IndexError):
                fde = None
            self._parsed[offset] = fde
        return self._parsed[offset]
