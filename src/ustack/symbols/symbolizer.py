"""Runtime addresses -> Frames through the process's mappings and ELF symbols."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

from ustack.model import Frame, Mapping, UstackError
from ustack.objfile.debuginfo import debug_lookup
from ustack.objfile.dwarf_lines import LineTable, has_dwarf
from ustack.objfile.elf import ElfImage

from .lines import expand


_MAX_CACHED = 1 << 20  # distinct (file, offset) pairs kept; bounds memory


@dataclass(frozen=True)
class SymbolOptions:
    """What the user asked of names (the CLI's symbol flags)."""
    lines: bool = False            # --lines: file:line of each frame
    inlines: bool = False          # --inlines: inlined calls as frames of their own
    demangle: bool = True          # --no-demangle turns it off
    debug_dirs: tuple = ()         # --debug-dir: more places for debug files


class Symbolizer:
    """`mappings` is anything with find(pid, addr) -> Mapping | None."""

    def __init__(self, mappings, options: SymbolOptions = SymbolOptions()):
        self.mappings = mappings
        self.options = options
        self._images: dict = {}   # open_path -> ElfImage | None (failed)
        self._symbols: dict = {}  # (open_path, file offset) -> (vaddr, Symbol | None)
        self._debug_images: dict = {}  # image path -> debug ElfImage | None
        self._line_tables: dict = {}  # image path -> LineTable | None
        self.warnings: list = []  # debug files refused, for the user

    def frames(self, pid: int, addrs, leaf_is_exact: bool = True) -> tuple:
        out = []
        for i, addr in enumerate(addrs):
            # Return addresses point after the call; addr-1 is still inside
            # the calling function even when the call is its last instruction.
            back = 0 if (i == 0 and leaf_is_exact) else 1
            if self.options.lines or self.options.inlines:
                out.extend(self.source_frames(pid, addr, back))
            else:
                out.append(self.frame(pid, addr, back))
        return tuple(out)

    def source_frames(self, pid: int, addr: int, back: int = 0) -> list:
        """frame() with its file:line (--lines), after the calls inlined at
        that point as frames of their own (--inlines)."""
        f = self.frame(pid, addr, back)
        m = self.mappings.find(pid, addr - back)
        if m is None or not m.path.startswith("/"):
            return [f]
        vaddr, _sym = self._resolve(m, addr - back - m.start + m.pgoff)
        table = self._line_table(m.open_path) if vaddr is not None else None
        if table is None:
            return [f]
        locs = table.locate(vaddr)
        if table.errors:                        # corrupt DWARF: said once
            self.warnings.extend(table.errors)
            table.errors.clear()
        return expand(f, locs, self.options.lines, self.options.inlines)

    def frame(self, pid: int, addr: int, back: int = 0) -> Frame:
        q = addr - back
        m = self.mappings.find(pid, q)
        if m is None:
            return Frame(addr=addr, module="")
        if not m.path.startswith("/"):  # [vdso], [heap], anonymous
            return Frame(addr=addr, module=m.path, path=m.path)
        module = os.path.basename(m.path)
        vaddr, sym = self._resolve(m, q - m.start + m.pgoff)
        if sym is None:
            return Frame(addr=addr, module=module, path=m.path)
        return Frame(addr=addr, module=module, function=sym.name,
                     offset=vaddr + back - sym.address, size=sym.size, path=m.path)

    def _resolve(self, m: Mapping, file_off: int):
        key = (m.open_path, file_off)
        hit = self._symbols.get(key)
        if hit is None:
            hit = (None, None)
            image = self._image(m.open_path)
            if image is not None:
                vaddr = image.vaddr_of_file_offset(file_off)
                if vaddr is not None:
                    sym = None
                    debug = self._debug(image)
                    if debug is not None:       # full symtab, local functions too
                        sym = debug.lookup(vaddr)
                    hit = (vaddr, sym or image.lookup(vaddr))
            if len(self._symbols) >= _MAX_CACHED:
                self._symbols.clear()
            self._symbols[key] = hit
        return hit

    def _debug(self, image: ElfImage) -> Optional[ElfImage]:
        """The separate debug file of a stripped object (e.g. libc6-dbg)."""
        if image.has_symtab:
            return None
        return self._debug_file(image)

    def _debug_file(self, image: ElfImage) -> Optional[ElfImage]:
        if image.path not in self._debug_images:
            debug, found = debug_lookup(image, self.options.debug_dirs)
            self._debug_images[image.path] = debug
            self.warnings.extend(found.refused)
        return self._debug_images[image.path]

    def _line_table(self, path: str) -> Optional[LineTable]:
        """DWARF lines of the object itself, else of its debug file."""
        if path not in self._line_tables:
            table = None
            image = self._image(path)
            if image is not None:
                source = image if has_dwarf(image) else self._debug_file(image)
                table = LineTable.for_image(source) if source is not None else None
            self._line_tables[path] = table
        return self._line_tables[path]

    def _image(self, path: str) -> Optional[ElfImage]:
        if path not in self._images:
            try:
                self._images[path] = ElfImage.open(path)
            except UstackError:
                self._images[path] = None  # unnamed frames, not a failed run
        return self._images[path]
