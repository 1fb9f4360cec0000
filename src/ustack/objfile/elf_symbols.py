"""An ELF file's functions as ustack asks for them: the function at an
address (lookup: one bisect over flattened ranges), by name (find, match,
overloads; demangled names indexed on first use) and the IFUNC/COMPAT
flags. Built from objfile.elf_symtab's raw functions, or read back lazily
from the image cache (objfile.elf_state)."""
from __future__ import annotations

import bisect
import fnmatch
import json
import struct
import threading
from array import array
from collections import namedtuple

from .demangle import demangle, is_mangled, plain_name
from .elf_symtab import COMPAT, IFUNC, LABEL

# Which alias names a shared address in lookup(): exported names read best
# (glibc's public names are often weak: getpid over __getpid).
_BIND_RANK = {"STB_GLOBAL": 0, "STB_WEAK": 0, "STB_GNU_UNIQUE": 0, "STB_LOCAL": 1}
_LABEL_RANK = 3
_BIND_RANK[LABEL] = _LABEL_RANK


class Symbol(namedtuple("Symbol", "name address size")):
    """A function (`name`, `address`, `size`): a tuple, ~3x cheaper to make
    than a frozen dataclass (libc's debug file holds 6.6 k of them, made on
    every run)."""
    __slots__ = ()


class ElfSymbols:
    """The function indexes of one file. Made by `built` (from raw
    functions) or `saved` (from the cache's two blobs, decoded when first
    asked: an object opened only for its layout never pays ~9 ms for
    libc's debug file; one only asked to name addresses reads its packed
    lookup table, ~0.3 ms). `reparse` gives a freshly built ElfSymbols
    when a saved blob turns out corrupt."""

    _SYMBOL_FACTS = frozenset({"_named", "functions", "_flags", "_by_name", "_demangled"})
    _LOOKUP_FACTS = frozenset({"_starts", "_owners"})

    def __init__(self, reparse=None):
        self._reparse = reparse

    @classmethod
    def built(cls, raw: dict, sections, reparse=None, starts=None) -> "ElfSymbols":
        """From raw functions ((address, name) -> (size, binding, section
        index, flags)) and the reader's sections (for zero sizes); `starts`:
        the sorted start addresses of all the file's functions when `raw`
        holds only some (objfile/symbol_scan.py), else raw's."""
        self = cls(reparse)
        named = _fill_sizes(raw, sections, starts)
        # PLT stubs and code labels name addresses but are not probe
        # targets or list rows
        self.functions = [s for s in named if not s.name.endswith("@plt")
                          and raw[(s.address, s.name)][1] != LABEL]
        self._build_indexes(raw, named)
        self._flags = {key: v[3] for key, v in raw.items() if v[3]}
        return self

    @classmethod
    def deferred(cls, build, reparse) -> "ElfSymbols":
        """Built by build() (an ElfSymbols) when a fact is first asked, once,
        whichever thread asks; `reparse` as for saved() (build() may give a
        saved one: a builder child's)."""
        self = cls(reparse)
        self._deferred = build
        self._building = threading.Lock()
        return self

    @classmethod
    def saved(cls, symbols, lookup: bytes, reparse) -> "ElfSymbols":
        """From the cache's two blobs; `symbols` may be a callable that
        reads its blob again (None when it no longer can: parsed anew)."""
        self = cls(reparse)
        self._saved_symbols = symbols
        self._saved_lookup = lookup
        return self

    @property
    def pending(self) -> bool:
        """Made deferred() and not built yet."""
        return "_deferred" in self.__dict__

    def pack(self) -> tuple:
        """(symbols, lookup): the two blobs `saved` takes."""
        index = {id(sym): i for i, sym in enumerate(self._named)}
        symbols = json.dumps({
            "named": self._named,        # Symbols are tuples: JSON arrays as they are
            "functions": [index[id(s)] for s in self.functions],
            "flags": [[a, n, f] for (a, n), f in self._flags.items()],
        })
        return symbols.encode(), _LookupTable.pack(self._starts, self._owners)

    def __getattr__(self, name: str):
        if "_deferred" in self.__dict__ and (name in self._SYMBOL_FACTS
                                             or name in self._LOOKUP_FACTS):
            with self.__dict__["_building"]:
                if "_deferred" in self.__dict__:
                    self._take(self.__dict__["_deferred"]())
                    del self.__dict__["_deferred"]
            return getattr(self, name)
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
                self._take(self._reparse())
        elif name in self._SYMBOL_FACTS:
            saved = self.__dict__.pop("_saved_symbols", None)
            if saved is None:
                raise AttributeError(name)
            if callable(saved):         # a big list, read again from the cache
                saved = saved()
            if not self._restore_symbols(saved):
                self._take(self._reparse())
        else:
            raise AttributeError(name)
        return getattr(self, name)

    def _take(self, other: "ElfSymbols") -> None:
        """other's facts as they are: a saved one's blobs stay undecoded."""
        for key in ("_named", "functions", "_flags", "_starts", "_owners",
                    "_saved_symbols", "_saved_lookup"):
            if key in other.__dict__:
                self.__dict__[key] = other.__dict__[key]
            else:
                self.__dict__.pop(key, None)

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

    def is_ifunc(self, sym: Symbol) -> bool:
        """An IFUNC: `sym` is the resolver, calls run what it returns."""
        return bool(self._flags.get((sym.address, sym.name), 0) & IFUNC)

    def is_compat(self, sym: Symbol) -> bool:
        """An old symbol version only (memcpy@GLIBC_2.2.5), not the default."""
        return bool(self._flags.get((sym.address, sym.name), 0) & COMPAT)

    def _index_names(self) -> None:
        by_name: dict = {}
        for sym in self.functions:
            by_name.setdefault(sym.name, []).append(sym)
        self._by_name = by_name
        self._demangled = None

    def _build_indexes(self, raw: dict, named: list) -> None:
        self._named = named         # _by_name: indexed on first use (__getattr__)
        # One preferred symbol per start address (`named` is in address
        # order, so `best` is too; ranks are only compared for aliases) ...
        best: dict = {}
        for sym in named:
            other = best.get(sym.address)
            if other is None or _rank(raw, sym) < _rank(raw, other):
                best[sym.address] = sym
        functions, labels = [], []
        for sym in best.values():
            (labels if raw[(sym.address, sym.name)][1] == LABEL else functions).append(sym)
        # ... code labels only where no function claims the address: inside a
        # function a label would rename the rest of it ...
        labels = _outside(labels, functions)
        # ... then flattened into non-overlapping ranges, innermost symbol
        # winning, so lookup() is a single bisect.
        if labels:
            functions = sorted(functions + labels, key=lambda sym: sym.address)
        self._starts, self._owners = flatten_ranges(functions)

    def lookup(self, vaddr: int) -> Symbol | None:
        i = bisect.bisect_right(self._starts, vaddr) - 1
        return self._owners[i] if i >= 0 else None

    def starts_named(self, name: str) -> list:
        """The start addresses of the functions lookup() answers with the
        linker name `name`: read from the address table alone (a saved
        table's symbol list is not decoded: node's is 17 MB of JSON; no
        demangled index is built)."""
        index = self.__dict__.get("_owner_starts")
        if index is None:
            owners = self._owners
            if isinstance(owners, _LookupTable):
                index = owners.starts_by_name()
            else:
                index = {}
                for sym in owners:
                    if sym is not None:
                        index.setdefault(sym.name, set()).add(sym.address)
            self._owner_starts = index
        return sorted(index.get(name, ()))

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


_LAST_ADDRESS = (1 << 64) - 1


def _fill_sizes(raw: dict, sections, starts=None) -> list:
    """Sorted Symbols; zero sizes extended to the next function start,
    capped at the end of the symbol's section (assembly often omits .size)."""
    if starts is None:
        starts = sorted({addr for addr, _ in raw})
    out = []
    for addr, name in sorted(raw):
        size, _bind, shndx, _flags = raw[(addr, name)]
        if size == 0:
            i = bisect.bisect_right(starts, addr)
            end = starts[i] if i < len(starts) else None
            if isinstance(shndx, int) and 0 < shndx < len(sections):
                sh = sections[shndx]
                sec_end = sh.addr + sh.size
                if sh.addr <= addr < sec_end:
                    end = sec_end if end is None else min(end, sec_end)
            size = end - addr if end is not None else 0
        # a damaged size must not carry the end past the address space
        # (the lookup table packs ends as 64-bit words)
        size = min(size, _LAST_ADDRESS - addr)
        out.append(Symbol(name, addr, size))
    return out


class _LookupTable:
    """ElfSymbols.lookup's boundaries and owners, packed for the image cache:
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

    def starts_by_name(self) -> dict:
        """name -> {start address} of the distinct owners."""
        out: dict = {}
        for name, address in zip(self._names, self._addresses):
            out.setdefault(name, set()).add(address)
        return out

    @classmethod
    def pack(cls, starts: list, owners) -> bytes:
        slot: dict = {id(None): -1}
        distinct: list = []
        index = array("i")
        for o in owners:                # one pass, no call per boundary
            i = slot.get(id(o))         # by identity: one Symbol per (address, name)
            if i is None:
                i = slot[id(o)] = len(distinct)
                distinct.append(o)
            index.append(i)
        names = "\0".join(o.name for o in distinct).encode("utf-8", "surrogatepass")
        return b"".join([cls._HEADER.pack(len(starts), len(distinct), len(names)),
                         array("Q", starts).tobytes(), index.tobytes(),
                         array("Q", (o.address for o in distinct)).tobytes(),
                         array("Q", (o.size for o in distinct)).tobytes(), names])

    @classmethod
    def unpack(cls, blob: bytes):
        """(boundaries, owners) for ElfSymbols.lookup, or False when `blob`
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


def _rank(raw: dict, sym: Symbol) -> tuple:
    """Which of the names sharing an address lookup() gives: sized, then
    exported, then fewer leading underscores, then of local names the
    longest (as perf chooses: glibc's __memmove_avx512_unaligned_erms, not
    __memcpy_..., so the two tools' profiles agree; an exported name is
    one a caller wrote: mmap, not mmap64), then by name."""
    size0, bind, _, _ = raw[(sym.address, sym.name)]
    underscores = len(sym.name) - len(sym.name.lstrip("_"))
    longest = -len(sym.name) if bind == "STB_LOCAL" else 0
    return (size0 == 0, _BIND_RANK.get(bind, 2), underscores, longest, sym.name)


def _outside(labels: list, functions: list) -> list:
    """The labels whose address no sized function's range holds (both
    lists in address order)."""
    if not labels:
        return labels
    starts, reach, furthest = [], [], 0
    for sym in functions:
        if sym.size > 0:
            furthest = max(furthest, sym.address + sym.size)
            starts.append(sym.address)
            reach.append(furthest)
    out = []
    for sym in labels:
        i = bisect.bisect_right(starts, sym.address) - 1
        if i < 0 or reach[i] <= sym.address:
            out.append(sym)
    return out


def flatten_ranges(syms: list):
    """Sorted, possibly nested/overlapping ranges -> boundaries and owners.
    Each boundary starts a range owned by one Symbol (or None: a gap); the
    innermost symbol owns an address (how ElfSymbols.lookup answers).
    One loop without calls: ~0.2 s for node's 86,000 functions."""
    starts: list = []
    owners: list = []
    open_: list = []  # (end, symbol) of the enclosing symbols, innermost last

    for sym in (*syms, None):
        if sym is None:
            pos = float("inf")
        elif sym.size <= 0:
            continue
        else:
            pos = sym.address
        # close the symbols that end at or before pos
        while open_ and open_[-1][0] <= pos:
            end = open_[-1][0]
            while open_ and open_[-1][0] <= end:
                open_.pop()
            owner = open_[-1][1] if open_ else None
            if starts and starts[-1] == end:
                owners[-1] = owner
            elif not owners or owners[-1] is not owner:
                starts.append(end)
                owners.append(owner)
        if sym is None:
            break
        if starts and starts[-1] == pos:
            owners[-1] = sym
        elif not owners or owners[-1] is not sym:
            starts.append(pos)
            owners.append(sym)
        open_.append((pos + sym.size, sym))
    return starts, owners
