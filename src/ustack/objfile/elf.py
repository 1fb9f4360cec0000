"""One ELF file as ustack needs it: function symbols, address lookup, and the
vaddr <-> file offset translation through PT_LOAD segments.

Everything is read once at open(): headers and section bytes through
libelf, else pyelftools (objfile.elf_reader), the symbol tables unpacked
from their bytes here (pyelftools' per-symbol parsing took ~0.3 s for
libc's debug file, this ~15 ms). The results are kept in plain lists and
cached per file identity for the whole process, and on disk: a file seen
before is not parsed again, its facts are read back from the cache."""
from __future__ import annotations

import bisect
import fnmatch
import json
import os
import struct
from array import array
from collections import OrderedDict, namedtuple

from ustack.kernel.proc_root import lasting_path
from ustack.model import UstackError

from . import cache as objcache
from .demangle import demangle, is_mangled, plain_name
from ..values import value

# the ELF spec's numbers (elf.h)
_STT_NOTYPE, _STT_FUNC, _STT_GNU_IFUNC = 0, 2, 10
# without STT_GNU_IFUNC libc's strlen, memcpy@@GLIBC_2.14 and the like are invisible
_FUNC_TYPES = (_STT_FUNC, _STT_GNU_IFUNC)
_BIND_NAMES = {0: "STB_LOCAL", 1: "STB_GLOBAL", 2: "STB_WEAK", 10: "STB_GNU_UNIQUE"}
_SHT_PROGBITS, _SHT_SYMTAB, _SHT_RELA, _SHT_NOBITS, _SHT_DYNSYM = 1, 2, 4, 8, 11
_SHT_GNU_VERSYM = 0x6FFFFFFF
_SYMBOL_TABLES = (_SHT_SYMTAB, _SHT_DYNSYM)
_SHN_UNDEF = 0
_SHF_EXECINSTR = 0x4
_PT_LOAD = 1
# flags of a raw function entry
IFUNC = 1          # the address is a resolver; calls go to what it returns
COMPAT = 2         # an old, non-default symbol version (memcpy@GLIBC_2.2.5)
_VERSYM_HIDDEN = 0x8000
# Which alias names a shared address in lookup(): exported names read best
# (glibc's public names are often weak: getpid over __getpid).
_BIND_RANK = {"STB_GLOBAL": 0, "STB_WEAK": 0, "STB_GNU_UNIQUE": 0, "STB_LOCAL": 1}
_LABEL = "LABEL"        # the binding recorded for untyped symbols in code
_LABEL_RANK = 3
_BIND_RANK[_LABEL] = _LABEL_RANK
_GO_SECTIONS = (".go.buildinfo", ".gopclntab")
_PLT_SECTIONS = (".plt", ".plt.sec", ".plt.got")
_JMP_RIP = b"\xff\x25"   # jmp *disp32(%rip): how every x86-64 PLT stub leaves
_SHF_COMPRESSED = 0x800
_ELFCOMPRESS_ZLIB = 1
# Images that keep a file descriptor open for read(): bounded, so a
# system-wide profile touching hundreds of objects stays far from the fd limit.
_MAX_OPEN_FDS = 64
_STATE_VERSION = "v6"    # of the cached image layout (_state/_restore); v6: framed (cache.py)
_open_fds: "OrderedDict[ElfImage, int]" = OrderedDict()


class Symbol(namedtuple("Symbol", "name address size")):
    """A function (`name`, `address`, `size`): a tuple, ~3x cheaper to make
    than a frozen dataclass (libc's debug file holds 6.6 k of them, made on
    every run)."""
    __slots__ = ()


@value
class _Load:
    vaddr: int
    offset: int
    filesz: int
    flags: int


class ElfImage:
    """Read-only facts about one ELF file. Use ElfImage.open(path)."""

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
        self._fd: int | None = None   # opened by the first read, see _pread
        try:
            with open(self.path, "rb") as f:
                if f.read(4) != b"\x7fELF":
                    raise UstackError(f"{path}: not an ELF file")
                # the key of what this very file (fstat: not a replaced one) parsed to
                cache = objcache.identity_file("images", os.fstat(f.fileno()),
                                               f"{_STATE_VERSION}.json")
                if self._restore(objcache.read(cache)):
                    return
                self._parse_file(f)
            objcache.write(cache, self._state())
        except UstackError:
            raise
        except OSError as e:
            raise UstackError(f"{path}: {e.strerror}") from None
        except Exception as e:  # pyelftools and struct raise many types on bad input
            why = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise UstackError(f"{path}: corrupt ELF: {why}") from None

    # --- parsing ---------------------------------------------------------

    def _state(self) -> bytes:
        """What _parse found, for _restore: the file's layout (a JSON line),
        its symbols (a JSON line) and the address lookup (packed numbers
        and names, _LookupTable); the cache holds data only, and _restore
        leaves the last two undecoded until asked."""
        index = {id(sym): i for i, sym in enumerate(self._named)}
        layout = json.dumps({
            "e_type": self.e_type, "machine": self.machine,
            "loads": [[l.vaddr, l.offset, l.filesz, l.flags] for l in self._loads],
            "section_names": sorted(self.section_names),
            "sections": self.sections, "compressed": sorted(self._compressed),
            "little_endian": self.little_endian, "elfclass": self._elfclass,
            "build_id": self.build_id, "has_symtab": self.has_symtab,
            "is_go": self.is_go, "go_error": self.go_error,
        })
        symbols = json.dumps({
            "named": [[s.name, s.address, s.size] for s in self._named],
            "functions": [index[id(s)] for s in self.functions],
            "flags": [[a, n, f] for (a, n), f in self._flags.items()],
        })
        return b"\n".join([layout.encode(), symbols.encode(),
                           _LookupTable.pack(self._starts, self._owners)])

    def _restore(self, blob: bytes | None) -> bool:
        """The layout facts of _state() back, the symbols kept for
        _restore_symbols; False when there are none to trust."""
        if not blob:
            return False
        layout, _, rest = blob.partition(b"\n")
        symbols, _, lookup = rest.partition(b"\n")
        try:
            d = json.loads(layout)
            self.e_type = d["e_type"]
            self.is_pie = self.e_type == "ET_DYN"
            self.machine = d["machine"]
            self._loads = [_Load(*l) for l in d["loads"]]
            self.section_names = frozenset(d["section_names"])
            self.sections = {k: tuple(v) for k, v in d["sections"].items()}
            self._compressed = frozenset(d["compressed"])
            self.little_endian = bool(d["little_endian"])
            self._elfclass = d["elfclass"]
            self.build_id = d["build_id"]
            self.has_symtab = bool(d["has_symtab"])
            self.is_go = bool(d["is_go"])
            self.go_error = d["go_error"]
        except (ValueError, TypeError, KeyError, IndexError, AttributeError):
            return False                # corrupt or of another layout: parsed again
        if not symbols or not lookup:
            return False
        self._saved_symbols = symbols
        self._saved_lookup = lookup
        return True

    # Decoding the symbols costs ~9 ms for libc's debug file: an object
    # opened only for its layout (build-id, segments: loading unwind rows
    # before a run starts) never pays it, one only asked to name addresses
    # reads its packed lookup table (~0.3 ms).
    _SYMBOL_FACTS = frozenset({"_named", "functions", "_flags", "_by_name", "_demangled"})
    _LOOKUP_FACTS = frozenset({"_starts", "_owners"})

    def __getattr__(self, name: str):
        if name in ("_by_name", "_demangled") and "functions" in self.__dict__:
            self._index_names()         # restored without them: lookup() needs none
            return getattr(self, name)
        if name in self._LOOKUP_FACTS:
            saved = self.__dict__.pop("_saved_lookup", None)
            if saved is None:
                raise AttributeError(name)
            table = _LookupTable.unpack(saved)
            if table:
                self._starts, self._owners = table
            else:
                self._reparse_symbols()
        elif name in self._SYMBOL_FACTS:
            saved = self.__dict__.pop("_saved_symbols", None)
            if saved is None:
                raise AttributeError(name)
            if not self._restore_symbols(saved):
                self._reparse_symbols()
        else:
            raise AttributeError(name)
        return getattr(self, name)

    def _restore_symbols(self, blob: bytes) -> bool:
        try:
            d = json.loads(blob)
            named = list(map(Symbol._make, d["named"]))
            self._named = named
            self.functions = [named[i] for i in d["functions"]]
            self._flags = {(a, n): f for a, n, f in d["flags"]}
        except (ValueError, TypeError, KeyError, IndexError, AttributeError):
            return False
        return True

    def _reparse_symbols(self) -> None:
        """A cache whose symbol half is corrupt: the file parsed anew."""
        try:
            with open(self.path, "rb") as f:
                self._parse_file(f)
        except Exception as e:          # as __init__: pyelftools raises many types
            why = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise UstackError(f"{self.path}: corrupt ELF: {why}") from None

    def _parse_file(self, f) -> None:
        """Everything from the open file `f`, through libelf or pyelftools
        (objfile.elf_reader)."""
        from .elf_reader import open_reader     # libelf's bindings: ~1 ms, only to parse
        reader = open_reader(self.path, f)
        try:
            self._parse(reader)
        finally:
            reader.close()

    def _parse(self, reader) -> None:
        """Everything from the file through an objfile.elf_reader reader."""
        ElfImage.parsed_files += 1
        self.e_type = reader.e_type
        self.is_pie = self.e_type == "ET_DYN"  # PIE executable or shared library
        self.machine = reader.machine
        self._loads = [_Load(s.vaddr, s.offset, s.filesz, s.flags)
                       for s in reader.segments if s.type == _PT_LOAD]
        sections = reader.sections
        self.section_names = frozenset(s.name for s in sections)
        # name -> (address, file offset, size) of sections with file bytes
        self.sections = {s.name: (s.addr, s.offset, s.size)
                         for s in sections if s.type != _SHT_NOBITS}
        self._compressed = frozenset(s.name for s in sections
                                     if s.flags & _SHF_COMPRESSED)
        self.little_endian = reader.little_endian
        self._elfclass = reader.elfclass
        self.build_id = reader.build_id()
        raw = self._cached_raw_functions(reader)
        self.has_symtab = any(s.type == _SHT_SYMTAB for s in sections)
        self.is_go = (bool(self.section_names & set(_GO_SECTIONS))
                      or any(n == "runtime.main" for _a, n in raw))
        self.go_error = None            # why a Go binary's .gopclntab is unusable
        if self.is_go and not self.has_symtab:
            raw = dict(raw)
            raw.update(self._go_functions())
        named = self._fill_sizes(raw, sections)
        # PLT stubs and code labels name addresses but are not probe
        # targets or list rows
        self.functions = [s for s in named if not s.name.endswith("@plt")
                          and raw[(s.address, s.name)][1] != _LABEL]
        self._build_indexes(raw, named)
        self._flags = {key: v[3] for key, v in raw.items() if v[3]}

    def is_ifunc(self, sym: Symbol) -> bool:
        """An IFUNC: `sym` is the resolver, calls run what it returns."""
        return bool(self._flags.get((sym.address, sym.name), 0) & IFUNC)

    def is_compat(self, sym: Symbol) -> bool:
        """An old symbol version only (memcpy@GLIBC_2.2.5), not the default."""
        return bool(self._flags.get((sym.address, sym.name), 0) & COMPAT)

    def _go_functions(self) -> dict:
        """A stripped Go binary's functions, from .gopclntab (which -s -w keeps)."""
        from .gopclntab import PclntabError, go_table
        try:
            table = go_table(self)
        except PclntabError as e:
            self.go_error = str(e)
            return {}
        return {(entry, name): (end - entry, "STB_GLOBAL", None, 0)
                for name, entry, end in table.functions()} if table else {}

    def _cached_raw_functions(self, reader) -> dict:
        """_raw_functions, read back from the cache by build-id when it was
        computed before (~30 ms for libc's debug file).
        An object and its debug file (or a stripped copy) share the
        build-id, not the symbol tables: the tables' sizes name the entry."""
        signature = ";".join(f"{s.name}:{s.size}" for s in reader.sections
                             if s.type in _SYMBOL_TABLES or s.name in _PLT_SECTIONS)
        try:
            tables = objcache.digest(signature.encode())[:16]
            cache = objcache.cache_file("symbols", self.path, os.stat(self.path),
                                        self.build_id, f"{tables}.v4.json")
        except OSError:
            return self._raw_functions(reader)
        blob = objcache.read(cache)
        if blob:
            try:
                entry = json.loads(blob)
                if entry["signature"] == signature:
                    return {(a, n): (size, bind, shndx, flags)
                            for a, n, size, bind, shndx, flags in entry["functions"]}
            except (ValueError, KeyError, TypeError):
                pass                    # corrupt: rebuilt below
        raw = self._raw_functions(reader)
        objcache.write(cache, json.dumps({
            "signature": signature,
            "functions": [[a, n, *v] for (a, n), v in raw.items()]}).encode())
        return raw

    @staticmethod
    def _raw_functions(reader) -> dict:
        """(address, name) -> (size, binding, section index, flags) over both
        tables and the PLT stubs (a sample can stop in one: perf names it
        foo@plt); flags: IFUNC, COMPAT."""
        sections = reader.sections
        tables = {s.index: _symbols(reader, s) for s in sections if s.type in _SYMBOL_TABLES}
        found = _plt_functions(reader, tables)
        for sec in sections:
            if sec.type not in _SYMBOL_TABLES:
                continue
            hidden = _hidden_versions(reader, sec)
            for index, (sym_name, addr, size, info, shndx) in enumerate(tables[sec.index]):
                if addr == 0 or shndx == _SHN_UNDEF or not sym_name:
                    continue
                kind = info & 0xF
                bind = _BIND_NAMES.get(info >> 4, f"STB_{info >> 4}")
                if kind == _STT_NOTYPE and _in_code(sections, shndx):
                    bind = _LABEL           # assembly entry points: ld.so's _start
                elif kind not in _FUNC_TYPES:
                    continue
                # a debug file's .symtab spells versions in: memcpy@@GLIBC_2.14
                name, at, version = sym_name.partition("@")
                flags = IFUNC if kind == _STT_GNU_IFUNC else 0
                if index in hidden or (at and not version.startswith("@")):
                    flags |= COMPAT
                key = (addr, name)
                old = found.get(key)
                # .symtab and .dynsym repeat each other; keep the sized one.
                if old is None or (old[0] == 0 and size):
                    found[key] = (size, bind, shndx, flags)
        return found

    @staticmethod
    def _fill_sizes(raw: dict, sections) -> list:
        """Sorted Symbols; zero sizes extended to the next function start,
        capped at the end of the symbol's section (assembly often omits .size)."""
        starts = sorted({addr for addr, _ in raw})
        out = []
        for (addr, name), (size, _bind, shndx, _flags) in sorted(raw.items()):
            if size == 0:
                i = bisect.bisect_right(starts, addr)
                end = starts[i] if i < len(starts) else None
                if isinstance(shndx, int) and 0 < shndx < len(sections):
                    sh = sections[shndx]
                    sec_end = sh.addr + sh.size
                    if sh.addr <= addr < sec_end:
                        end = sec_end if end is None else min(end, sec_end)
                size = end - addr if end is not None else 0
            out.append(Symbol(name, addr, size))
        return out

    def _index_names(self) -> None:
        by_name: dict = {}
        for sym in self.functions:
            by_name.setdefault(sym.name, []).append(sym)
        self._by_name = by_name
        self._demangled = None

    def _build_indexes(self, raw: dict, named: list) -> None:
        self._named = named
        self._index_names()
        # One preferred symbol per start address ...
        best: dict = {}
        for sym in named:
            size0, bind, _, _ = raw[(sym.address, sym.name)]
            underscores = len(sym.name) - len(sym.name.lstrip("_"))
            rank = (size0 == 0, _BIND_RANK.get(bind, 2), underscores, sym.name)
            if sym.address not in best or rank < best[sym.address][0]:
                best[sym.address] = (rank, sym)
        # ... then flattened into non-overlapping ranges, innermost symbol
        # winning, so lookup() is a single bisect.
        ranked = [best[a] for a in sorted(best)]
        self._starts, self._owners = flatten_ranges(
            [sym for rank, sym in ranked if rank[1] < _LABEL_RANK])
        # code labels only where no function claims the address: inside a
        # function a label would rename the rest of it
        labels = [sym for rank, sym in ranked
                  if rank[1] == _LABEL_RANK and self.lookup(sym.address) is None]
        if labels:
            self._starts, self._owners = flatten_ranges(sorted(
                [sym for rank, sym in ranked if rank[1] < _LABEL_RANK] + labels,
                key=lambda sym: sym.address))

    # --- queries ---------------------------------------------------------

    def lookup(self, vaddr: int) -> Symbol | None:
        i = bisect.bisect_right(self._starts, vaddr) - 1
        return self._owners[i] if i >= 0 else None

    def find(self, name: str) -> list:
        """Functions by linker name, else by demangled name (`leaf(long)`),
        else by plain name (`leaf`, `ns::f`) when only one function has it."""
        found = self._by_name.get(name)
        if found is None:
            demangled = self._demangled_index()
            found = demangled[0].get(name) or demangled[1].get(name, ())
            if len({s.address for s in found}) > 1 and name not in demangled[0]:
                found = ()              # an overloaded plain name: ambiguous
        return list(found)

    def match(self, pattern: str) -> list:
        # Go names contain glob characters: a literal name wins.
        if self.find(pattern):
            return self.find(pattern)
        names = set(fnmatch.filter(self._by_name, pattern))
        full = self._demangled_index()[0]
        names.update(s.name for n in fnmatch.filter(full, pattern) for s in full[n])
        return [s for s in self.functions if s.name in names]

    def overloads(self, name: str) -> list:
        """The demangled names sharing the plain name `name` (C++ overloads)."""
        return sorted({demangle(s.name) for s in self._demangled_index()[1].get(name, ())})

    def _demangled_index(self) -> tuple:
        """(demangled name -> Symbols, plain name -> Symbols) of the
        mangled C++/Rust functions; built on first use."""
        if self._demangled is None:
            full: dict = {}
            plain: dict = {}
            for sym in self.functions:
                if is_mangled(sym.name):
                    d = demangle(sym.name)
                    full.setdefault(d, []).append(sym)
                    p = plain_name(d)
                    if p != d:
                        plain.setdefault(p, []).append(sym)
            self._demangled = (full, plain)
        return self._demangled

    def file_offset(self, vaddr: int) -> int | None:
        for seg in self._loads:
            if seg.vaddr <= vaddr < seg.vaddr + seg.filesz:
                return vaddr - seg.vaddr + seg.offset
        return None

    def executable(self, vaddr: int) -> bool:
        """Whether vaddr lies in a PT_LOAD segment mapped executable (PF_X)."""
        return any(seg.vaddr <= vaddr < seg.vaddr + seg.filesz and seg.flags & 1
                   for seg in self._loads)

    def executable_segments(self) -> list:
        """(vaddr, file offset, filesz) of each PT_LOAD mapped executable."""
        return [(s.vaddr, s.offset, s.filesz) for s in self._loads if s.flags & 1]

    def vaddr_of_file_offset(self, off: int) -> int | None:
        for seg in self._loads:
            if seg.offset <= off < seg.offset + seg.filesz:
                return off - seg.offset + seg.vaddr
        return None

    def segments(self) -> list:
        """(vaddr, file offset, file size, writable) of each PT_LOAD."""
        return [(s.vaddr, s.offset, s.filesz, bool(s.flags & 2)) for s in self._loads]

    def read(self, vaddr: int, size: int) -> bytes:
        """File bytes at vaddr, cut short at the end of its segment."""
        for seg in self._loads:
            if seg.vaddr <= vaddr < seg.vaddr + seg.filesz:
                size = min(size, seg.vaddr + seg.filesz - vaddr)
                return self._pread(size, vaddr - seg.vaddr + seg.offset)
        return b""

    def section_bytes(self, name: str) -> bytes | None:
        """The contents of section `name` (inflated if SHF_COMPRESSED), or
        None when the file has no such section with file bytes."""
        data = self.section_file_bytes(name)
        return None if data is None else self.inflated(name, data)

    def section_file_bytes(self, name: str) -> bytes | None:
        """Section `name` as the file holds it (compressed or not), or None
        when the file has no such section with file bytes."""
        sec = self.sections.get(name)
        if sec is None:
            return None
        _addr, offset, size = sec
        return self._pread(size, offset)

    def is_compressed(self, name: str) -> bool:
        return name in self._compressed

    @property
    def elfclass(self) -> int:
        """32 or 64."""
        return self._elfclass

    def file_bytes(self, offset: int, size: int) -> bytes:
        """`size` bytes of the file at `offset` (fewer at its end)."""
        return self._pread(size, offset)

    def inflated(self, name: str, data: bytes) -> bytes:
        """Section `name`'s contents from its file bytes `data`
        (section_file_bytes): inflated if SHF_COMPRESSED, else `data`."""
        if name not in self._compressed:
            return data
        import zlib     # rare on the start path (~0.6 ms to import)
        start, size = self.compression_header(name, data)
        try:
            return zlib.decompressobj().decompress(memoryview(data)[start:], size)
        except zlib.error as e:
            raise UstackError(f"{self.path}: corrupt compressed section {name}: {e}") from None

    def compression_header(self, name: str, data: bytes) -> tuple:
        """(where the zlib stream starts, the size it inflates to) in the
        file bytes `data` of the SHF_COMPRESSED section `name`."""
        # Elf64_Chdr: ch_type, reserved, ch_size, ch_addralign (Elf32: 3 words)
        end = "<" if self.little_endian else ">"
        hdr = struct.Struct(end + ("IIQQ" if self._elfclass == 64 else "III"))
        if len(data) < hdr.size:
            raise UstackError(f"{self.path}: corrupt compressed section {name}")
        fields = hdr.unpack_from(data)
        ch_type, ch_size = fields[0], fields[-2]
        if ch_type != _ELFCOMPRESS_ZLIB:
            raise UstackError(f"{self.path}: section {name} uses compression "
                              f"type {ch_type}, which ustack cannot read")
        return hdr.size, ch_size

    def _pread(self, size: int, offset: int) -> bytes:
        """Bytes of the file, through one descriptor kept open per image
        (the least recently used ones are closed beyond _MAX_OPEN_FDS)."""
        fd = self._fd
        try:
            if fd is None:
                fd = self._fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
                _open_fds[self] = fd
                if len(_open_fds) > _MAX_OPEN_FDS:
                    old, old_fd = _open_fds.popitem(last=False)
                    old._fd = None
                    os.close(old_fd)
            elif _open_fds and next(reversed(_open_fds)) is not self:
                _open_fds.move_to_end(self)
            # a corrupt header's size or offset may lie far past the end
            # (a buffer of its size would not fit in memory)
            end = os.fstat(fd).st_size
            if not 0 <= offset < end:
                return b""
            return os.pread(fd, max(0, min(size, end - offset)), offset)
        except OSError as e:
            raise UstackError(f"{self.path}: {e.strerror}") from None

    def __repr__(self) -> str:
        return f"ElfImage({self.path!r}, {len(self.functions)} functions)"


def _in_code(sections, shndx) -> bool:
    return 0 < shndx < len(sections) and bool(sections[shndx].flags & _SHF_EXECINSTR)


def _symbols(reader, table) -> list:
    """(name, value, size, info, section index) of each entry of the
    symbol table section `table`, read from its bytes."""
    data = reader.data(table)
    sections = reader.sections
    strtab = reader.data(sections[table.link]) if 0 < table.link < len(sections) else b""
    if reader.elfclass == 64:
        layout = struct.Struct(reader.order + "IBBHQQ")
        entries = ((n, v, sz, info, sh) for n, info, _o, sh, v, sz
                   in layout.iter_unpack(data[:len(data) - len(data) % layout.size]))
    else:
        layout = struct.Struct(reader.order + "IIIBBH")
        entries = ((n, v, sz, info, sh) for n, v, sz, info, _o, sh
                   in layout.iter_unpack(data[:len(data) - len(data) % layout.size]))
    out = []
    for n, address, size, info, shndx in entries:
        end = strtab.find(b"\0", n)
        # latin-1 as pyelftools decoded them: names in the caches stay the same
        name = strtab[n:end if end >= 0 else len(strtab)].decode("latin-1")
        out.append((name, address, size, info, shndx))
    return out


def _hidden_versions(reader, symtab) -> frozenset:
    """Indexes of `symtab`'s symbols whose version is hidden: `name@VER`, an
    old version kept for old binaries, which new links never bind to."""
    if symtab.type != _SHT_DYNSYM:
        return frozenset()
    for sec in reader.sections:
        if sec.type == _SHT_GNU_VERSYM:
            data = reader.data(sec)
            words = struct.iter_unpack(reader.order + "H", data[:len(data) & ~1])
            return frozenset(i for i, (v,) in enumerate(words) if v & _VERSYM_HIDDEN)
    return frozenset()


def _plt_functions(reader, tables: dict) -> dict:
    """`name@plt` for each PLT stub, found the way objdump does: the stub's
    `jmp *GOT(%rip)` names a GOT slot, and the slot's relocation names the
    symbol. Lazy-binding .plt, IBT's .plt.sec and .plt.got all work so;
    the resolver stub PLT0 jumps through no relocated slot and stays unnamed.
    `tables`: section index -> _symbols() of each symbol table."""
    sections = reader.sections
    rela = struct.Struct(reader.order + ("QQq" if reader.elfclass == 64 else "IIi"))
    shift = 32 if reader.elfclass == 64 else 8
    slots = {}
    for sec in sections:
        if sec.type != _SHT_RELA or not sec.link:
            continue
        symbols = tables.get(sec.link)
        if symbols is None:
            continue
        data = reader.data(sec)
        for offset, info, _addend in rela.iter_unpack(data[:len(data) - len(data) % rela.size]):
            index = info >> shift
            if 0 < index < len(symbols):
                name = symbols[index][0].split("@", 1)[0]
                if name:
                    slots[offset] = name
    found = {}
    for sec in sections:
        if sec.name not in _PLT_SECTIONS or sec.type != _SHT_PROGBITS:
            continue
        step = sec.entsize or 16
        data, base = reader.data(sec), sec.addr
        for start in range(0, len(data) - step + 1, step):
            at = data.find(_JMP_RIP, start, start + step)
            if at < 0 or at + 6 > len(data):
                continue
            disp = int.from_bytes(data[at + 2:at + 6], "little", signed=True)
            name = slots.get(base + at + 6 + disp)
            if name:
                found[(base + start, f"{name}@plt")] = (step, "STB_LOCAL", sec.index, 0)
    return found


class _LookupTable:
    """ElfImage.lookup's boundaries and owners, packed for the image cache:
    the boundaries and each one's owner index as arrays, the distinct
    owners as arrays of addresses and sizes and their names NUL-joined.
    Read back with a few array copies and one split, where JSON and a
    Symbol per function cost ~9 ms for libc's debug file; the Symbol of a
    boundary is made when lookup() lands on it."""

    _HEADER = struct.Struct("=III")     # boundaries, owners, bytes of names

    def __init__(self, index, addresses, sizes, names):
        self._index, self._addresses, self._sizes, self._names = index, addresses, sizes, names

    def __len__(self) -> int:
        return len(self._index)

    def __getitem__(self, i: int) -> Symbol | None:
        j = self._index[i]
        if j < 0:
            return None
        return Symbol(self._names[j], self._addresses[j], self._sizes[j])

    @classmethod
    def pack(cls, starts: list, owners) -> bytes:
        slot: dict = {}
        index = array("i", (-1 if o is None else slot.setdefault(id(o), (len(slot), o))[0]
                            for o in owners))
        distinct = [o for _, o in slot.values()]
        names = "\0".join(o.name for o in distinct).encode("utf-8", "surrogatepass")
        return b"".join([cls._HEADER.pack(len(starts), len(distinct), len(names)),
                         array("Q", starts).tobytes(), index.tobytes(),
                         array("Q", (o.address for o in distinct)).tobytes(),
                         array("Q", (o.size for o in distinct)).tobytes(), names])

    @classmethod
    def unpack(cls, blob: bytes):
        """(boundaries, owners) for ElfImage.lookup, or False when `blob`
        is not a whole table."""
        try:
            n, owners, names_len = cls._HEADER.unpack_from(blob)
        except struct.error:
            return False
        view = memoryview(blob)[cls._HEADER.size:]
        sizes = (8 * n, 4 * n, 8 * owners, 8 * owners, names_len)
        if len(view) != sum(sizes):
            return False
        parts = []
        for typecode, size in zip("QiQQ", sizes):
            part = array(typecode)
            part.frombytes(view[:size])
            parts.append(part)
            view = view[size:]
        starts, index, addresses, sizes_ = parts
        try:
            names = bytes(view).decode("utf-8", "surrogatepass").split("\0") if owners else []
        except UnicodeDecodeError:
            return False
        if len(names) != owners or (n and max(index) >= owners):
            return False
        return starts, cls(index, addresses, sizes_, names)


def flatten_ranges(syms: list):
    """Sorted, possibly nested/overlapping ranges -> boundaries and owners.
    Each boundary starts a range owned by one Symbol (or None: a gap); the
    innermost symbol owns an address (how ElfImage.lookup answers)."""
    starts: list = []
    owners: list = []

    def emit(pos, owner):
        if starts and starts[-1] == pos:
            owners[-1] = owner
        elif not owners or owners[-1] is not owner:
            starts.append(pos)
            owners.append(owner)

    open_: list = []  # enclosing symbols, innermost last

    def close_until(pos):
        while open_ and open_[-1].address + open_[-1].size <= pos:
            end = open_[-1].address + open_[-1].size
            while open_ and open_[-1].address + open_[-1].size <= end:
                open_.pop()
            emit(end, open_[-1] if open_ else None)

    for sym in syms:
        if sym.size <= 0:
            continue
        close_until(sym.address)
        emit(sym.address, sym)
        open_.append(sym)
    close_until(float("inf"))
    return starts, owners
