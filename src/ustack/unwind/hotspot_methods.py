"""A HotSpot Method's name, source file and line table, read from its
JVM's memory with the layout of its libjvm's vmStructs tables
(hotspot_runtime.Layout): Method -> ConstMethod -> ConstantPool -> holder
class, each checked by what points back (the class's constant pool must
be the method's pool), so that a pointer to anything else (a freed
method's memory) gives None, never another method's name."""
from __future__ import annotations

import struct

_MAX_LINES = 1 << 12            # line table entries read at most


def read_method(f: dict, mem, method: int) -> tuple | None:
    """(name "pkg.Class.method", source file, ((bci, line), ...)) of the
    Method* `method`, or None; `f`: the layout (Layout.as_dict())."""
    word = mem.word
    if not pointer(method):
        return None
    const = word(method + f["method_const"])
    if not pointer(const):
        return None
    pool = word(const + f["const_constants"])
    if not pointer(pool):
        return None
    holder = word(pool + f["pool_holder"])
    if not pointer(holder) or word(holder + f["klass_constants"]) != pool:
        return None                 # not a class and its pool: not a method
    u2 = lambda addr: struct.unpack("<H", mem.read(addr, 2))[0]  # noqa: E731
    entries = pool + f["constant_pool"]         # the pool's entries follow it
    name = read_symbol(f, mem, word(entries + 8 * u2(const + f["const_name_index"])))
    klass = read_symbol(f, mem, word(holder + f["klass_name"]))
    if not name or not klass:
        return None
    source, lines = "", ()
    if "const_flags" in f:
        at = u2(pool + f["pool_source_file"])
        if at:
            source = read_symbol(f, mem, word(entries + 8 * at)) or ""
        # a u2 or a u4 (little-endian: the flag bit in its low half)
        if u2(const + f["const_flags"]) & f["has_line_table"]:
            # the compressed table follows the bytecodes
            lines = line_table(mem, const + f["const_method"] + u2(const + f["const_code_size"]),
                               int_reader(f))
    return f"{klass.replace('/', '.')}.{name}", source, lines


def read_symbol(f: dict, mem, symbol: int) -> str | None:
    """A Symbol's text (its length, then its bytes: modified UTF-8)."""
    if not pointer(symbol):
        return None
    length = struct.unpack("<H", mem.read(symbol + f["symbol_length"], 2))[0]
    if not 0 < length <= 1024:
        return None
    return mem.read(symbol + f["symbol_body"], length).decode("utf-8", "replace")


def pointer(v: int) -> bool:
    """Whether v may be a metadata pointer (aligned, in the user range)."""
    return 0x1000 <= v < 1 << 47 and not v & 7


def read_int(data: bytes, at: int) -> tuple:
    """(value, next offset) of an UNSIGNED5 int (HotSpot's
    CompressedReadStream::read_int): bytes below 192 end it, each adding
    6 more bits."""
    b = data[at]
    if b < 192:
        return b, at + 1
    total = b
    for i in range(1, 5):
        b = data[at + i]
        total += b << (6 * i)
        if b < 192 or i == 4:
            return total, at + i + 1
    return total, at + 5


def read_uint5(data: bytes, at: int) -> tuple:
    """(value, next offset) of an int of JDK 20-'s UNSIGNED5 (no zero
    byte: each byte less one; bytes below 192 end it)."""
    b = data[at]
    if b < 192:
        return b - 1, at + 1
    total = b - 1
    for i in range(1, 5):
        b = data[at + i]
        total += (b - 1) << (6 * i)
        if b < 192 or i == 4:
            return total, at + i + 1
    return total, at + 5


def int_reader(f: dict):
    """The reader of the compressed ints of the JVM of layout f."""
    return read_uint5 if f.get("unsigned5") else read_int


def _signed(v: int) -> int:
    return (v >> 1) ^ -(v & 1)


def line_table(mem, at: int, read=read_int) -> tuple:
    """((bci, line), ...) of a compressed line number table (HotSpot's
    CompressedLineNumberReadStream: a byte of bci delta << 3 | line delta,
    or 0xFF and two signed UNSIGNED5 deltas; 0 ends it)."""
    data = mem.read(at, 256)
    out = []
    bci = line = 0
    i = 0
    while len(out) < _MAX_LINES:
        if i + 11 > len(data):
            data += mem.read(at + len(data), 256)
        b = data[i]
        i += 1
        if b == 0:
            break
        if b == 0xFF:
            d, i = read(data, i)
            bci += _signed(d)
            d, i = read(data, i)
            line += _signed(d)
        else:
            bci += b >> 3
            line += b & 7
        out.append((bci, line))
    return tuple(out)
