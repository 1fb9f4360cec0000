"""The functions an ELF file's symbol tables (.symtab, .dynsym) and PLT
stubs name, unpacked from their bytes (pyelftools' per-symbol parsing took
~0.3 s for libc's debug file, this ~15 ms), and cached by a hash of those
bytes."""
from __future__ import annotations

import json
import struct
import sys
from itertools import compress, count
from operator import itemgetter

from . import cache as objcache
from . import content_key

# the ELF spec's numbers (elf.h)
STT_NOTYPE, _STT_FUNC, _STT_GNU_IFUNC = 0, 2, 10
# without STT_GNU_IFUNC libc's strlen, memcpy@@GLIBC_2.14 and the like are invisible
FUNC_TYPES = (_STT_FUNC, _STT_GNU_IFUNC)
_BIND_NAMES = {0: "STB_LOCAL", 1: "STB_GLOBAL", 2: "STB_WEAK", 10: "STB_GNU_UNIQUE"}
_SHT_PROGBITS, _SHT_SYMTAB, _SHT_RELA, _SHT_DYNSYM = 1, 2, 4, 11
_SHT_GNU_VERSYM = 0x6FFFFFFF
SYMBOL_TABLES = (_SHT_SYMTAB, _SHT_DYNSYM)
_SHN_UNDEF = 0
SHF_EXECINSTR = 0x4
# flags of a raw function entry
IFUNC = 1          # the address is a resolver; calls go to what it returns
COMPAT = 2         # an old, non-default symbol version (memcpy@GLIBC_2.2.5)
_VERSYM_HIDDEN = 0x8000
LABEL = "LABEL"         # the binding recorded for untyped symbols in code
_PLT_SECTIONS = (".plt", ".plt.sec", ".plt.got")
_JMP_RIP = b"\xff\x25"   # jmp *disp32(%rip): how every x86-64 PLT stub leaves
_PUSH_RIP = b"\xff\x35"  # pushq disp32(%rip): how PLT0 (the lazy-binding resolver stub) starts
_NATIVE_ORDERS = ("=", "<" if sys.byteorder == "little" else ">")


def raw_functions(reader, keep: bool = True) -> dict:
    """(address, name) -> (size, binding, section index, flags) of every
    function (_raw_functions), read back from the cache when it was computed
    before from the same bytes (~30 ms for libc's debug file); `keep`: write
    it there. The entry is named by a hash of the symbol tables, their
    strings, versions, PLT and relocations and of the section headers, all
    read once here and parsed from what was hashed: a copy with the same
    build-id and renamed functions has another key."""
    reader = ReadOnce(reader)
    try:
        key = _tables_key(reader)
    except Exception:          # as ElfImage: a corrupt file raises many types
        return _raw_functions(reader)
    cache = objcache.cache_file("symbols", key, "v5.json")
    blob = objcache.read(cache)
    if blob:
        try:
            entry = json.loads(blob)
            if entry["key"] == key:
                return {(a, n): (size, bind, shndx, flags)
                        for a, n, size, bind, shndx, flags in entry["functions"]}
        except (ValueError, KeyError, TypeError):
            pass                    # corrupt: rebuilt below
    raw = _raw_functions(reader)
    if not keep:
        return raw
    objcache.write(cache, json.dumps({
        "key": key,
        "functions": [at + value for at, value in raw.items()]}).encode())
    return raw


class ReadOnce:
    """A reader whose section bytes are read once: the bytes parsed are
    the bytes hashed, even if the file changes meanwhile."""

    def __init__(self, reader):
        self._reader = reader
        self._data: dict = {}
        self.sections = reader.sections
        self.elfclass = reader.elfclass
        self.order = reader.order

    def data(self, section) -> bytes:
        data = self._data.get(section.index)
        if data is None:
            data = self._data[section.index] = self._reader.data(section)
        return data


def _tables_key(reader: ReadOnce) -> str:
    """The content key of everything _raw_functions reads."""
    sections = reader.sections
    hasher = content_key.Hasher("symbols")
    hasher.add(f"{reader.elfclass}{reader.order}")
    for sec in sections:
        hasher.add(f"{sec.index}:{sec.name}:{sec.type}:{sec.flags}:{sec.addr}:"
                   f"{sec.size}:{sec.link}:{sec.entsize}")
    tables = {s.index for s in sections if s.type in SYMBOL_TABLES}
    read = set(tables)
    read.update(s.link for s in sections if s.index in tables and 0 < s.link < len(sections))
    read.update(s.index for s in sections if s.type in (_SHT_RELA, _SHT_GNU_VERSYM)
                or (s.name in _PLT_SECTIONS and s.type == _SHT_PROGBITS))
    for sec in sections:
        if sec.index in read:
            hasher.add(reader.data(sec))
    return hasher.key()


def _raw_functions(reader) -> dict:
    """(address, name) -> (size, binding, section index, flags) over both
    tables and the PLT stubs (a sample can stop in one: perf names it
    foo@plt); flags: IFUNC, COMPAT."""
    sections = reader.sections
    tables = {s.index: _symbols(reader, s) for s in sections if s.type in SYMBOL_TABLES}
    found = plt_functions(reader, tables)
    for sec in sections:
        if sec.type not in SYMBOL_TABLES:
            continue
        hidden = hidden_versions(reader, sec)
        for index, entry in enumerate(tables[sec.index]):
            add_function(found, sections, hidden, index, *entry)
    return found


def add_function(found: dict, sections, hidden, index: int, sym_name: str, addr: int,
                 size: int, info: int, shndx: int) -> None:
    """Enter symbol table entry `index` in `found` if it names a function
    (or a code label); `hidden`: the table's hidden-version indexes. The
    one rule for the whole table and for objfile/symbol_scan's few
    addresses."""
    if addr == 0 or shndx == _SHN_UNDEF or not sym_name:
        return
    kind = info & 0xF
    bind = _BIND_NAMES.get(info >> 4, f"STB_{info >> 4}")
    if kind == STT_NOTYPE and _in_code(sections, shndx):
        bind = LABEL           # assembly entry points: ld.so's _start
    elif kind not in FUNC_TYPES:
        return
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


def _in_code(sections, shndx) -> bool:
    return 0 < shndx < len(sections) and bool(sections[shndx].flags & SHF_EXECINSTR)


def _symbols(reader, table) -> list:
    """(name, value, size, info, section index) of each entry of the
    symbol table section `table`, read from its bytes."""
    entries, strtab = symbol_entries(reader, table)
    # latin-1 as pyelftools decoded them (names in the caches stay the
    # same), and one byte a character: offsets into the text are the
    # table's. Most names start right after a NUL: one split names them all.
    text = strtab.decode("latin-1")
    starting: dict = {}
    at = 0
    for part in text.split("\0"):
        starting[at] = part
        at += len(part) + 1
    out = []
    for n, address, size, info, shndx in entries:
        name = starting.get(n)
        if name is None:               # a suffix of another name, or past the end
            name = name_at(text, n)
        out.append((name, address, size, info, shndx))
    return out


def symbol_entries(reader, table) -> tuple:
    """([(name offset, value, size, info, section index)] of the symbol
    table section `table`, its string table's bytes): names not decoded."""
    data = reader.data(table)
    sections = reader.sections
    strtab = reader.data(sections[table.link]) if 0 < table.link < len(sections) else b""
    # each entry's fields picked into that order by C calls (node's 185,000
    # entries: ~15 ms, where a comprehension unpacking them took ~60 ms)
    if reader.elfclass == 64:       # name, info, other, section, value, size
        layout, fields = struct.Struct(reader.order + "IBBHQQ"), itemgetter(0, 4, 5, 1, 3)
    else:                           # name, value, size, info, other, section
        layout, fields = struct.Struct(reader.order + "IIIBBH"), itemgetter(0, 1, 2, 3, 5)
    entries = list(map(fields, layout.iter_unpack(data[:len(data) - len(data) % layout.size])))
    return entries, strtab


def name_at(text: str, n: int) -> str:
    """The name at offset n of a string table decoded as latin-1."""
    end = text.find("\0", n)
    return text[n:end if end >= 0 else len(text)]


def hidden_versions(reader, symtab) -> frozenset:
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


def plt_functions(reader, tables: dict) -> dict:
    """`name@plt` for each PLT stub, found the way objdump does: the stub's
    `jmp *GOT(%rip)` names a GOT slot, and the slot's relocation names the
    symbol. Lazy-binding .plt, IBT's .plt.sec and .plt.got all work so;
    the resolver stub PLT0 jumps through no relocated slot and stays unnamed.
    `tables`: section index -> _symbols() of each symbol table (or what
    answers [index][0] with an entry's name, and len())."""
    sections = reader.sections
    stubs = []                          # (section, stub address, its GOT slot)
    for sec in sections:
        if sec.name not in _PLT_SECTIONS or sec.type != _SHT_PROGBITS:
            continue
        step = sec.entsize or 16
        data, base = reader.data(sec), sec.addr
        for start in range(0, len(data) - step + 1, step):
            if start == 0 and data.startswith(_PUSH_RIP):
                continue        # PLT0, the resolver stub: GOT[2] is the loader's, never relocated
            at = data.find(_JMP_RIP, start, start + step)
            if at < 0 or at + 6 > len(data):
                continue
            disp = int.from_bytes(data[at + 2:at + 6], "little", signed=True)
            stubs.append((sec, step, base + start, base + at + 6 + disp))
    slots = _slot_names(reader, tables, {slot for *_, slot in stubs})
    found = {}
    for sec, step, address, slot in stubs:
        name = slots.get(slot)
        if name:
            found[(address, f"{name}@plt")] = (step, "STB_LOCAL", sec.index, 0)
    return found


def _slot_names(reader, tables: dict, wanted: set) -> dict:
    """GOT slot -> the name its relocation gives, of the slots `wanted`
    (the later relocation of a slot wins). Read from the last relocation
    section back, each ending the search for the slots it names: .rela.plt
    follows .rela.dyn and names every lazy-binding slot, so chromium's
    1.1 M relocations of .rela.dyn (nearly all R_X86_64_RELATIVE) are not
    read when it has no other stubs; those read are picked out by offset
    at C speed."""
    sections = reader.sections
    rela = struct.Struct(reader.order + ("QQq" if reader.elfclass == 64 else "IIi"))
    offset_only = struct.Struct(reader.order + ("Q16x" if reader.elfclass == 64 else "I8x"))
    shift = 32 if reader.elfclass == 64 else 8
    slots: dict = {}
    wanted = set(wanted)
    for sec in reversed(sections):
        if not wanted:
            break
        if sec.type != _SHT_RELA or not sec.link:
            continue
        symbols = tables.get(sec.link)
        if symbols is None:
            continue
        data = reader.data(sec)
        data = data[:len(data) - len(data) % rela.size]
        if reader.elfclass == 64 and reader.order in _NATIVE_ORDERS:
            offsets = memoryview(data).cast("Q")[0::3]      # no tuple a relocation
        else:
            offsets = map(itemgetter(0), offset_only.iter_unpack(data))
        found = {}
        for i in compress(count(), map(wanted.__contains__, offsets)):
            offset, info, _addend = rela.unpack_from(data, i * rela.size)
            index = info >> shift
            if 0 < index < len(symbols):
                name = symbols[index][0].split("@", 1)[0]
                if name:
                    found[offset] = name        # the later one in the section wins
        slots.update(found)
        wanted.difference_update(found)
    return slots
