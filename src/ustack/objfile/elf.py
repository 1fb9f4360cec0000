"""One ELF file as ustack needs it, in three pieces by job: the file
(layout, segments, sections and their decompression: objfile.elf_file),
its functions (address lookup, search by name: objfile.elf_symbols, read
from the tables by objfile.elf_symtab, Go's from objfile.go_functions) and
the cache state (objfile.elf_state).

Everything is read once at open(): headers and section bytes through
libelf, else pyelftools (objfile.elf_reader). The results are cached per
file identity for the whole process, and on disk: a file seen before is not
parsed again, its facts are read back from the cache."""
from __future__ import annotations

import os

from ustack.kernel.proc_root import lasting_path
from ustack.model import UstackError

from . import cache as objcache
from . import elf_state
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

    _cache: dict = {}
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
        key = objcache.memo_key(st)
        image = cls._cache.get(key)
        if image is None:
            image = cls(path)
            cls._cache[key] = image
        return image

    @classmethod
    def clear_cache(cls) -> None:
        """Forget every image opened so far: the next open() of a path
        reads the file (and the on-disk symbol cache) again."""
        cls._cache.clear()

    def __init__(self, path: str):
        self.path = lasting_path(path)     # /proc/PID/exe outlives PID
        try:
            with open(self.path, "rb") as f:
                if f.read(4) != b"\x7fELF":
                    raise UstackError(f"{path}: not an ELF file")
                # the key of what this very file (fstat: not a replaced one) parsed to
                cache = objcache.identity_file("images", os.fstat(f.fileno()),
                                               f"{elf_state.STATE_VERSION}.json")
                saved = elf_state.unpack(self.path, objcache.read(cache), self._reparse)
                if saved:
                    self.file, self.symbols = saved
                    return
                self.file, self.symbols = self._parse_file(f)
            objcache.write(cache, elf_state.pack(self.file, self.symbols))
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

    def _reparse(self) -> ElfSymbols:
        """A cache whose symbol half is corrupt: the file parsed anew."""
        try:
            with open(self.path, "rb") as f:
                return self._parse_file(f)[1]
        except Exception as e:          # as __init__: pyelftools raises many types
            raise UstackError(f"{self.path}: corrupt ELF: {_why(e)}") from None

    def _parse_file(self, f) -> tuple:
        """(ElfFile, ElfSymbols) from the open file `f`, through libelf or
        pyelftools (objfile.elf_reader)."""
        from .elf_reader import open_reader     # libelf's bindings: ~1 ms, only to parse
        reader = open_reader(self.path, f)
        try:
            ElfImage.parsed_files += 1
            file = ElfFile.from_reader(self.path, reader)
            raw = raw_functions(self.path, file.build_id, reader)
            file.is_go = file.is_go or any(n == "runtime.main" for _a, n in raw)
            if file.is_go and not file.has_symtab:
                raw = dict(raw)
                raw.update(go_functions(file))
            return file, ElfSymbols.built(raw, reader.sections, self._reparse)
        finally:
            reader.close()

    def __repr__(self) -> str:
        return f"ElfImage({self.path!r}, {len(self.symbols.functions)} functions)"


def _why(e: Exception) -> str:
    return str(e).splitlines()[0] if str(e) else type(e).__name__
