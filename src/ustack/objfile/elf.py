"""One ELF file as ustack needs it, in three pieces by job: the file
(layout, segments, sections and their decompression: objfile.elf_file),
its functions (address lookup, search by name: objfile.elf_symbols, read
from the tables by objfile.elf_symtab, Go's from objfile.go_functions) and
the cache state (objfile.elf_state).

The layout is read at open(): headers and section bytes through libelf,
else pyelftools (objfile.elf_reader); the functions when first asked (an
object opened only to unwind through it, as the kernel's rows and the
unwinder do, never pays for them: ~1.4 s for node's 86,000). The results
are cached per file identity for the whole process, and on disk once the
functions are built: a file seen before is not parsed again, its facts are
read back from the cache."""
from __future__ import annotations

import os

from ustack.kernel.proc_root import lasting_path
from ustack.model import UstackError

from . import cache as objcache
from . import builders, elf_state, function_builder
from .built_once import BuiltOnce
from .elf_file import ElfFile
from .elf_symbols import ElfSymbols, Symbol, flatten_ranges      # noqa: F401 (their home)
from .elf_symtab import COMPAT, IFUNC, raw_functions             # noqa: F401
from .go_functions import go_functions

# what the facade answers from its file, and from its functions
_FILE_FACTS = frozenset({
    "e_type", "is_pie", "machine", "section_names", "sections", "little_endian",
    "elfclass", "build_id", "has_symtab", "is_go", "go_error", "file_offset",
    "executable", "executable_segments", "vaddr_of_file_offset", "segments",
    "read", "section_bytes", "section_file_bytes", "is_compressed", "file_bytes",
    "inflated", "compression_header"})
_SYMBOL_FACTS = frozenset({"functions", "lookup", "find", "match", "overloads",
                           "is_ifunc", "is_compat"})


class ElfImage:
    """One opened ELF file: `file` (an ElfFile) and `symbols` (an
    ElfSymbols). A thin facade besides: the pieces' methods and facts are
    answered by name too (image.lookup is image.symbols.lookup), so code
    written against the one object keeps working. Use ElfImage.open(path)."""

    _images = BuiltOnce()   # memo key -> ElfImage: one parse per file across threads
    parsed_files = 0      # files parsed (not read back from the disk cache) in this process

    @classmethod
    def open(cls, path: str) -> "ElfImage":
        try:
            st = os.stat(path)
        except FileNotFoundError:
            raise UstackError(f"no such binary: {path}") from None
        except OSError as e:
            raise UstackError(f"{path}: {e.strerror}") from None
        except ValueError:              # a NUL byte (read from a trace file)
            raise UstackError(f"no such binary: {path!r}") from None
        return cls._images.get(objcache.memo_key(st), lambda: cls(path))

    @classmethod
    def clear_cache(cls) -> None:
        """Forget every image opened so far: the next open() of a path
        reads the file (and the on-disk symbol cache) again."""
        cls._images.clear()

    def __init__(self, path: str):
        self.path = lasting_path(path)     # /proc/PID/exe outlives PID
        self._layout_read = False          # the layout from the cache, the file unparsed
        try:
            with open(self.path, "rb") as f:
                if f.read(4) != b"\x7fELF":
                    raise UstackError(f"{path}: not an ELF file")
                # the key of what this very file (fstat: not a replaced one) parsed to
                st = os.fstat(f.fileno())
                cache = objcache.identity_file("images", st, f"{elf_state.STATE_VERSION}.json")
                saved = elf_state.unpack(self.path, objcache.read(cache), self._reparse,
                                         reread=lambda: objcache.read(cache))
                if saved:
                    self.file, self.symbols = saved
                    return
                self._cache_file = cache
                layout = objcache.identity_file("layouts", st, f"{elf_state.STATE_VERSION}.json")
                # no image kept (its functions never asked): the layout kept
                # alone; an image kept but not believed is parsed anew
                self.file = None if os.path.lexists(cache) else \
                    elf_state.unpack_layout(self.path, objcache.read(layout))
                if self.file is not None:
                    self._layout_read = True
                    self.symbols = ElfSymbols.deferred(self._build_deferred, self._reparse)
                else:
                    self.file, self.symbols = self._parse_file(f)
                    if self.symbols.pending:
                        self._save_layout(layout)
            if not self.symbols.pending:
                self._save()
            else:
                function_builder.start(self)    # big tables: built apart from now on
        except UstackError:
            raise
        except OSError as e:
            raise UstackError(f"{path}: {e.strerror}") from None
        except Exception as e:  # pyelftools and struct raise many types on bad input
            raise UstackError(f"{path}: corrupt ELF: {_why(e)}") from None

    def __getattr__(self, name: str):
        if name in _FILE_FACTS:
            return getattr(self.__dict__["file"], name)
        if name in _SYMBOL_FACTS:
            return getattr(self.__dict__["symbols"], name)
        raise AttributeError(name)

    def function_at(self, vaddr: int):
        """symbols.lookup(vaddr), without waiting for a child still building
        the whole table: objfile/symbol_scan.py answers as it would, and
        goes on answering once the child is done (reading node's table
        back costs ~17 MB read and unpacked, the scan ~40 us an address)."""
        symbols = self.symbols
        if not symbols.pending:
            return symbols.lookup(vaddr)
        scan = self.__dict__.get("_scan")
        if scan is None and not self.file.is_go and (function_builder.running(self.path)
                                                      or function_builder.start_shared(self)):
            from .symbol_scan import SymbolScan
            try:
                scan = SymbolScan(self.path)
            except Exception:           # as _functions_of_file: the whole table decides
                scan = False
            else:
                function_builder.nothing_waits(self.path)
            self._scan = scan
        return scan.lookup(vaddr) if scan else symbols.lookup(vaddr)

    def _save(self) -> None:
        objcache.write(self._cache_file, elf_state.pack(self.file, self.symbols))

    def _save_layout(self, where: str) -> None:
        """The layout alone, for an image whose functions wait until asked:
        a run that never asks them (ld.so's, libm's in most runs) saves no
        image, and each run parsed the file again (loading libelf: ~3.5 ms)."""
        try:
            objcache.write(where, elf_state.pack_layout(self.file))
        except OSError:
            pass                        # parsed again next run

    def _reparse(self) -> ElfSymbols:
        """A cache whose symbol half is corrupt: the file parsed anew."""
        ElfImage.parsed_files += 1
        return self._functions_of_file()

    def _functions_of_file(self) -> ElfSymbols:
        try:
            with open(self.path, "rb") as f:
                from .elf_reader import open_reader
                reader = open_reader(self.path, f)
                try:
                    return self._functions(self.file, reader)
                finally:
                    reader.close()
        except Exception as e:          # as __init__: pyelftools raises many types
            raise UstackError(f"{self.path}: corrupt ELF: {_why(e)}") from None

    def _build_deferred(self) -> ElfSymbols:
        """The functions of a file whose layout was parsed at open(), now
        that they are asked for; the image cache written with them."""
        function_builder.wait(self.path)
        cache = self._cache_file
        saved = elf_state.unpack(self.path, objcache.read(cache), self._reparse,
                                 reread=lambda: objcache.read(cache))
        if saved:                       # a child built them
            self.symbols = saved[1]
            return saved[1]
        if self._layout_read:           # parsed now, for its functions
            ElfImage.parsed_files += 1
        symbols = self._functions_of_file()
        self.symbols = symbols
        try:
            self._save()
        except OSError:
            pass                        # a cache not written is rebuilt next run
        return symbols

    def _parse_file(self, f) -> tuple:
        """(ElfFile, ElfSymbols) from the open file `f`, through libelf or
        pyelftools (objfile.elf_reader); the ElfSymbols deferred unless the
        file may be Go's (its functions decide is_go)."""
        from .elf_reader import open_reader     # libelf's bindings: ~1 ms, only to parse
        reader = open_reader(self.path, f)
        try:
            ElfImage.parsed_files += 1
            file = ElfFile.from_reader(self.path, reader)
            # a Go binary without Go's sections is known by its functions
            if file.is_go or _names_runtime_main(reader):
                return file, self._functions(file, reader)
            return file, ElfSymbols.deferred(self._build_deferred, self._reparse)
        finally:
            reader.close()

    def _functions(self, file: ElfFile, reader) -> ElfSymbols:
        # the by-content cache of raw functions serves another copy of the
        # same symbol tables; a builder skips writing it (~0.15 s of node's): the image cache
        # it writes is what is read
        raw = raw_functions(reader, keep=not builders.in_builder)
        file.is_go = file.is_go or any(n == "runtime.main" for _a, n in raw)
        if file.is_go and not file.has_symtab:
            raw = dict(raw)
            raw.update(go_functions(file))
        return ElfSymbols.built(raw, reader.sections, self._reparse)

    def __repr__(self) -> str:
        return f"ElfImage({self.path!r}, {len(self.symbols.functions)} functions)"


def _names_runtime_main(reader) -> bool:
    """Whether a symbol table's strings hold "runtime.main", through the
    reader open at parse time: ~1 ms, where naming every function costs ~1 s
    (and reading through the ElfFile would hold a descriptor per image)."""
    for sec in reader.sections:
        if sec.type in (2, 11) and 0 < sec.link < len(reader.sections):   # SYMTAB, DYNSYM
            if b"\0runtime.main\0" in reader.data(reader.sections[sec.link]):
                return True
    return False


def _why(e: Exception) -> str:
    return str(e).splitlines()[0] if str(e) else type(e).__name__
