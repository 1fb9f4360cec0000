"""LEB128 variable-length integers, as DWARF (CFI, line tables) and Go's
pclntab (its "varint" is unsigned LEB128) encode them. Hot in the CFI
parser: keep them plain loops."""
from __future__ import annotations


def uleb128(data, i: int) -> tuple:
    """(value, index after it) of the unsigned LEB128 at data[i]; IndexError
    when the data ends inside it."""
    result = shift = 0
    while True:
        b = data[i]
        i += 1
        result |= (b & 0x7f) << shift
        if b < 0x80:
            return result, i
        shift += 7


def sleb128(data, i: int) -> tuple:
    """(value, index after it) of the signed LEB128 at data[i]."""
    result = shift = 0
    while True:
        b = data[i]
        i += 1
        result |= (b & 0x7f) << shift
        shift += 7
        if b < 0x80:
            if b & 0x40:
                result -= 1 << shift
            return result, i
