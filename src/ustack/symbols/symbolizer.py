"""Runtime addresses -> Frames through the process's mappings and ELF symbols."""
from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Optional

from ustack.model import Frame, Mapping, UstackError
from ustack.objfile.debuginfo import debug_lookup
from ustack.objfile.demangle import demangle
from ustack.objfile.dwarf_lines import LineTable, has_dwarf
from ustack.objfile.elf import ElfImage
from ustack.objfile.gopclntab import PclntabError, go_table
from ustack.objfile.vdso import vdso_path

from .perfmap import PerfMap, perf_map_path

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
        self._perf_maps: dict = {}     # pid -> PerfMap (JIT code)
        self.warnings: list = []  # debug files refused, for the user

    def frames(self, pid: int, addrs, leaf_is_exact: bool = True) -> tuple:
        out = []
        for i, addr in enumerate(addrs):
            # Return addresses point after the call; addr-1 is still inside
            # the calling function even when the call is its last instruction.
            back = 0 if (i == 0 and leaf_is_exact) else 1
            out.extend(self.frames_at(pid, addr, back))
        return tuple(out)

    def frames_at(self, pid: int, addr: int, back: int = 0) -> list:
        """The frame of the function holding addr, preceded (with
        --inlines) by the calls inlined there, innermost first."""
        q = addr - back
        m = self.mappings.find(pid, q)
        if m is None:
            return [Frame(addr=addr, module="")]
        if m.path == "[vdso]":
            # every 64-bit process maps the same image: read our copy of it
            open_path, module = vdso_path(m), "vdso"
            if open_path is None:
                return [Frame(addr=addr, module=module, path=m.path)]
        elif not m.path.startswith("/") or m.path == "//anon":
            return [self._special(pid, m, addr, back)]
        else:
            open_path, module = m.open_path, os.path.basename(m.path)
        vaddr, sym = self._resolve(open_path, q - m.start + m.pgoff)
        opts = self.options
        if vaddr is not None and (sym is None or opts.lines or opts.inlines):
            go = self._go(open_path)
            if go is not None:
                return self._go_frames(go, m, module, addr, vaddr, back)
        if sym is None:
            f = Frame(addr=addr, module=module, path=m.path)
        else:
            f = Frame(addr=addr, module=module, function=self._name(sym.name),
                      offset=vaddr + back - sym.address, size=sym.size, path=m.path)
        if vaddr is not None and (opts.lines or opts.inlines):
            return self._source_frames(f, open_path, vaddr)
        return [f]

    def _source_frames(self, f: Frame, open_path: str, vaddr: int) -> list:
        """f with its DWARF file:line (--lines), after the calls inlined at
        that point as frames of their own (--inlines)."""
        table = self._line_table(open_path)
        if table is None:
            return [f]
        locs = table.locate(vaddr)
        if table.errors:                        # corrupt DWARF: said once
            self.warnings.extend(table.errors)
            table.errors.clear()
        out = expand(f, locs, self.options.lines, self.options.inlines)
        for i, g in enumerate(out[:-1]):        # inlined names are linkage names
            if g.function:
                out[i] = replace(g, function=self._name(g.function))
        return out

    def _name(self, name: str) -> str:
        return demangle(name) if self.options.demangle else name

    def _special(self, pid: int, m: Mapping, addr: int, back: int) -> Frame:
        """Anonymous memory from the JIT's /tmp/perf-PID.map; other
        [heap]-like mappings stay unnamed."""
        if m.path in ("", "//anon") or m.path.startswith("[anon"):
            perf_map = self._perf_maps.get(pid)
            if perf_map is None:
                perf_map = self._perf_maps[pid] = PerfMap(perf_map_path(pid))
            sym = perf_map.lookup(addr - back)
            if sym is not None:
                return Frame(addr=addr, module="JIT", function=self._name(sym.name),
                             offset=addr - sym.address, size=sym.size)
        return Frame(addr=addr, module=m.path, path=m.path)

    # --- Go: names, lines and inlined calls from .gopclntab -----------------

    def _go(self, path: str):
        image = self._image(path)
        if image is None or not image.is_go:
            return None
        try:
            return go_table(image)
        except PclntabError:
            return None                 # corrupt: ELF symbols only, no wrong names

    def _go_frames(self, go, m: Mapping, module: str, addr: int, vaddr: int,
                   back: int) -> list:
        func = go.find(vaddr)
        if func is None:
            return [Frame(addr=addr, module=module, path=m.path)]
        lines, inlines = self.options.lines, self.options.inlines
        # the last GoFrame is func itself, at the call site of what was
        # inlined into it: its file:line lies inside the function it names
        found = go.frames(vaddr) if (lines or inlines) else []
        out = [Frame(addr=addr, module=module, function=g.function, path=m.path,
                     file=g.file if lines else "", line=g.line if lines else 0,
                     inlined=True)
               for g in (found[:-1] if inlines else ())]
        own = found[-1] if lines and found else None
        out.append(Frame(addr=addr, module=module, function=func.name,
                         offset=vaddr + back - func.entry, size=func.end - func.entry,
                         path=m.path, file=own.file if own else "",
                         line=own.line if own else 0))
        return out

    def _resolve(self, open_path: str, file_off: int):
        key = (open_path, file_off)
        hit = self._symbols.get(key)
        if hit is None:
            hit = (None, None)
            image = self._image(open_path)
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
