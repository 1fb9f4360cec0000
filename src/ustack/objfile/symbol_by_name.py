"""A few named symbols of an ELF file (an ElfFile: its layout), without
indexing all its functions: the dynamic symbol table's GNU hash
(.gnu.hash, as ld.so looks a symbol up), else a scan of a symbol table for
the string's offset where the name is among its strings. For finding one
interpreter's _PyRuntime among the objects a whole machine maps: ~1 ms
an object, where pyelftools'
import alone costs ~55 ms and indexing node's functions ~1 s."""
from __future__ import annotations

import struct

_SHN_UNDEF = 0
_STT_FUNC, _STT_GNU_IFUNC = 2, 10
_SYM64 = struct.Struct("<IBBHQQ")       # name, info, other, shndx, value, size
# symbol tables and the string tables they use, by the names linkers give them
_TABLES = ((".dynsym", ".dynstr"), (".symtab", ".strtab"))


def gnu_hash(name: bytes) -> int:
    h = 5381
    for c in name:
        h = (h * 33 + c) & 0xFFFFFFFF
    return h


def addresses(file, names: tuple) -> dict:
    """{name: ELF address} of those of `names` the file defines (64-bit
    little-endian ELF: other files give {})."""
    if file.elfclass != 64 or not file.little_endian:
        return {}
    found = _hashed(file, names)
    for table, strings in _TABLES:
        missing = [n for n in names if n not in found]
        if not missing:
            break
        found.update(_scanned(file, table, strings, missing))
    return found


def functions_named(file, name: str) -> dict:
    """{(symbol name, ELF address): size} of the functions called `name`
    or `name.SUFFIX` (the parts gcc splits off: .cold, .part.N) in the
    file's symbol tables, found by their names' string offsets as
    _scanned() finds them (a name stored as the tail of a longer string is
    not seen: {} then, and the caller asks the whole index)."""
    if file.elfclass != 64 or not file.little_endian:
        return {}
    want = b"\0" + name.encode()
    found = {}
    for table, strings in _TABLES:
        text = file.section_bytes(strings)
        if not text:
            continue
        offsets = {}
        at = text.find(want)
        while at >= 0:
            full = _string(text, at + 1)
            if full == want[1:] or full.startswith(want[1:] + b"."):
                offsets[at + 1] = full.decode()
            at = text.find(want, at + 1)
        if not offsets:
            continue
        data = file.section_bytes(table) or b""
        for string_at, named in offsets.items():
            # the symbols naming it: its offset as a symbol's first field
            # (bytes.find, not 13 k symbols unpacked in Python: ~2 ms)
            needle = struct.pack("<I", string_at)
            at = data.find(needle)
            while at >= 0:
                if at % _SYM64.size == 0 and at + _SYM64.size <= len(data):
                    _n, info, _o, shndx, value, size = _SYM64.unpack_from(data, at)
                    if shndx != _SHN_UNDEF and info & 0xF in (_STT_FUNC, _STT_GNU_IFUNC):
                        found[(named, value)] = size
                at = data.find(needle, at + 1)
    return found


def _hashed(file, names: tuple) -> dict:
    hashed = file.section_bytes(".gnu.hash")
    dynsym = file.section_bytes(".dynsym")
    dynstr = file.section_bytes(".dynstr")
    if not hashed or not dynsym or not dynstr or len(hashed) < 16:
        return {}
    nbuckets, symoffset, bloom_size, _shift = struct.unpack_from("<IIII", hashed)
    buckets_at = 16 + 8 * bloom_size
    chain_at = buckets_at + 4 * nbuckets
    if nbuckets == 0 or chain_at > len(hashed):
        return {}
    found = {}
    for name in names:
        want = name.encode()
        h = gnu_hash(want)
        index = struct.unpack_from("<I", hashed, buckets_at + 4 * (h % nbuckets))[0]
        while index >= symoffset:
            at = chain_at + 4 * (index - symoffset)
            if at + 4 > len(hashed) or (index + 1) * _SYM64.size > len(dynsym):
                break
            chained = struct.unpack_from("<I", hashed, at)[0]
            if chained | 1 == h | 1:
                st_name, _i, _o, shndx, value, _s = _SYM64.unpack_from(dynsym, index * _SYM64.size)
                if _string(dynstr, st_name) == want and shndx != _SHN_UNDEF:
                    found[name] = value
                    break
            if chained & 1:
                break
            index += 1
    return found


def _scanned(file, table: str, strings: str, names: list) -> dict:
    """The named symbols of `table`, found by their names' string offsets
    (only where a name is among the table's strings)."""
    text = file.section_bytes(strings)
    if not text:
        return {}
    offsets = {}
    for name in names:
        at = text.find(b"\0" + name.encode() + b"\0")
        while at >= 0:
            offsets[at + 1] = name
            at = text.find(b"\0" + name.encode() + b"\0", at + 1)
    if not offsets:
        return {}
    data = file.section_bytes(table) or b""
    found = {}
    for st_name, _i, _o, shndx, value, _s in _SYM64.iter_unpack(
            data[:len(data) - len(data) % _SYM64.size]):
        name = offsets.get(st_name)
        if name is not None and shndx != _SHN_UNDEF and name not in found:
            found[name] = value
    return found


def _string(strings: bytes, at: int) -> bytes:
    end = strings.find(b"\0", at)
    return strings[at:end if end >= 0 else len(strings)]
