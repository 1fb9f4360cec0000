"""Names from ELF objects: the object's symbol table, else its separate
debug file's (a stripped libc with libc6-dbg installed); with --lines and
--inlines, the DWARF file:line and inlined calls of the object or its debug
file. Also the opened images, for the Go source."""
from __future__ import annotations

from collections.abc import Callable

from ..model import Frame, Mapping, UstackError, printable
from ..objfile.debuginfo import debug_lookup
from ..objfile.elf import ElfImage
from ..objfile.on_disk import OnDisk
from .lines import inlined_frames, real_line

_MAX_CACHED = 1 << 20  # distinct (file, offset) pairs kept; bounds memory
# -v: what a debug file found each way is called
_DEBUG_SOURCE = {"build-id": "debug file by build-id", "debuglink": "debug file by debuglink",
                 "debuginfod": "debuginfod", "minidebuginfo": "MiniDebugInfo (.gnu_debugdata)"}


class ElfSource:
    """`name` turns a linkage name into the one shown (demangled or not);
    debug files refused are appended to `warnings`, one sentence each."""

    def __init__(self, options, name: Callable[[str], str], warnings: list):
        self.options = options
        self._name = name
        self._warnings = warnings
        self._images: dict = {}        # path -> ElfImage | None (failed)
        self._symbols: dict = {}       # (path, file offset) -> (vaddr, Symbol | None)
        self._debug_images: dict = {}  # image path -> debug ElfImage | None
        self._line_tables: dict = {}   # image path -> LineTable | None
        self._starts: dict = {}        # (path, vaddr) -> its FDE's start | None
        # debug files asked of debuginfod servers: a memo of "none" lasts
        # until one arrives (the thread counts arrivals)
        self.fetcher = None
        if options.debuginfod:          # imported only when servers are configured
            from ..objfile import debuginfod
            self.fetcher = debuginfod.fetcher(
                debuginfod.server_urls(options.debuginfod),
                options.lines or options.inlines, options.debug_dirs)
        self._arrivals = 0
        self._fetching: dict = {}      # image path -> build-id: named without the file asked for
        self._debug_how: dict = {}     # image path -> how its debug file was found
        self.named_by: dict = {}       # image path -> what named its frames (-v)
        self._wait_until = None        # time.monotonic() past which no fetch is waited for

    def resolve(self, path: str, file_off: int) -> tuple:
        """(vaddr, Symbol) at file_off in the object at path; either may be
        None (not in a loaded segment, no symbol there)."""
        key = (path, file_off)
        hit = self._symbols.get(key)
        if hit is None:
            hit = (None, None)
            image = self.image(path)
            if image is not None:
                vaddr = image.file.vaddr_of_file_offset(file_off)
                if vaddr is not None:
                    sym = None
                    debug = self._debug(image)
                    if debug is not None:       # full symtab, local functions too
                        sym = debug.function_at(vaddr)
                    if sym is not None:
                        self._named(path, _DEBUG_SOURCE.get(self._debug_how.get(image.path), ""))
                    else:
                        sym = image.function_at(vaddr)
                        if sym is not None:
                            self._named(path, ".symtab" if image.file.has_symtab
                                        else ".dynsym")
                    hit = (vaddr, sym)
            if len(self._symbols) >= _MAX_CACHED:
                self._symbols.clear()
            self._symbols[key] = hit
        return hit

    def frames(self, m: Mapping, path: str, module: str, addr: int, back: int,
               vaddr: int | None, sym) -> list:
        """The frame of (vaddr, sym) from resolve(), with its source
        location and inlined calls as asked."""
        locs = ()
        if vaddr is not None and (self.options.lines or self.options.inlines):
            locs = self._source_locs(path, vaddr)
        file, line = real_line(locs, self.options.lines)
        file = printable(file)
        if sym is None:
            start = self._code_start(path, vaddr) if vaddr is not None else None
            self._named(path, "FDE starts" if start is not None else "no name, addresses")
            f = Frame(addr=addr, module=module, path=m.path, file=file, line=line,
                      offset=vaddr + back - start if start is not None else 0,
                      objaddr=vaddr + back if vaddr is not None else 0,
                      objstart=start or 0)
        else:
            f = Frame(addr=addr, module=module, function=self._name(sym.name),
                      offset=vaddr + back - sym.address, size=sym.size, path=m.path,
                      file=file, line=line)
        if self.options.inlines and len(locs) > 1:
            return inlined_frames(f, locs, self.options.lines, self._name) + [f]
        return [f]

    def _named(self, path: str, source: str) -> None:
        if self.options.name_sources:
            self.named_by.setdefault(path, {})[source] = None    # in the order met

    def name_source_notes(self) -> list:
        """-v: one line an object: what named its frames."""
        return [f"names of {path}: {', '.join(sources)}"
                for path, sources in sorted(self.named_by.items())]

    def _code_start(self, path: str, vaddr: int) -> int | None:
        """Where the code holding vaddr starts by the object's CFI (its FDE),
        for an unnamed frame: a stripped object's functions stay apart."""
        key = (path, vaddr)
        if key not in self._starts:
            found = None
            try:
                fde = OnDisk.of(path).fde(vaddr)
                found = fde[0] if fde is not None else None
            except UstackError:                     # the file is gone
                pass
            if len(self._starts) >= _MAX_CACHED:
                self._starts.clear()
            self._starts[key] = found
        return self._starts[key]

    def image(self, path: str) -> ElfImage | None:
        if path not in self._images:
            try:
                self._images[path] = ElfImage.open(path)
            except UstackError:
                self._images[path] = None  # unnamed frames, not a failed run
        return self._images[path]

    def _source_locs(self, path: str, vaddr: int) -> tuple:
        """The DWARF SourceLocs at vaddr (objfile.dwarf_lines), innermost
        inlined call first; () without DWARF."""
        table = self._line_table(path)
        if table is None:
            return ()
        locs = table.locate(vaddr)
        if table.errors:                        # corrupt DWARF: said once
            self._warnings.extend(table.errors)
            table.errors.clear()
        return locs

    def _debug(self, image: ElfImage) -> ElfImage | None:
        """The separate debug file of a stripped object (e.g. libc6-dbg)."""
        if image.file.has_symtab:
            return None
        return self._debug_file(image)

    def _debug_file(self, image: ElfImage) -> ElfImage | None:
        if image.path not in self._debug_images:
            debug, found = debug_lookup(image, self.options.debug_dirs)
            self._debug_images[image.path] = debug
            self._debug_how[image.path] = found.how
            self._warnings.extend(found.refused)
            if self.fetcher is not None and found.how in ("", "minidebuginfo"):
                build_id = image.file.build_id
                self.fetcher.ask(build_id, image.path)
                if self._waited_for(build_id):       # a report's: now in the cache
                    debug, found = debug_lookup(image, self.options.debug_dirs)
                    self._debug_images[image.path] = debug
                    self._debug_how[image.path] = found.how
                else:
                    self._fetching[image.path] = build_id
        return self._debug_images[image.path]

    def _waited_for(self, build_id: str) -> bool:
        """Whether build_id's debug file arrived while naming waited for it:
        only when asked to wait (fetch_wait_s, a report's), for as long in
        all."""
        if self.options.fetch_wait_s <= 0:
            return False
        import time
        if self._wait_until is None:
            self._wait_until = time.monotonic() + self.options.fetch_wait_s
        return self.fetcher.wait_for(build_id, self._wait_until)

    def refresh(self) -> bool:
        """Forget what was named without debug files, once one arrived from
        a debuginfod server: whether names may have changed."""
        fetcher = self.fetcher
        if fetcher is None or fetcher.arrivals == self._arrivals:
            return False
        self._arrivals = fetcher.arrivals
        self._debug_images.clear()
        self._symbols.clear()
        self._line_tables.clear()
        self._fetching.clear()
        return True

    def fetch_notes(self) -> list:
        """What the user should hear of debuginfod: refused files, objects
        whose frames are not named yet."""
        if self.fetcher is None:
            return []
        return self.fetcher.notes + self.fetcher.not_named_notes(self._fetching)

    def _line_table(self, path: str):
        """DWARF lines of the object itself, else of its debug file (a
        LineTable, or None)."""
        if path not in self._line_tables:
            # imported with --lines or --inlines only (~1 ms of modules)
            from ..objfile.dwarf_lines import LineTable, has_dwarf
            table = None
            image = self.image(path)
            if image is not None:
                source = image if has_dwarf(image) else self._debug_file(image)
                table = LineTable.for_image(source) if source is not None else None
            self._line_tables[path] = table
        return self._line_tables[path]
