"""Where DWARF call frame information says functions begin: the [start, end)
of each FDE of .eh_frame and .debug_frame. A stripped binary keeps its
.eh_frame, so these are function starts that survive `strip -s`.

Only the FDE headers are read (the CFA programs are the unwinder's business,
unwind/cfi.py): .eh_frame_hdr's sorted table finds the FDE of an address
with a binary search when the file has one, else a section is scanned once."""
from __future__ import annotations

import bisect
import struct
import sys
from array import array

_U16, _U32, _U64 = struct.Struct("<H"), struct.Struct("<I"), struct.Struct("<Q")
_S16, _S32, _S64 = struct.Struct("<h"), struct.Struct("<i"), struct.Struct("<q")
_OMIT = 0xff
# DW_EH_PE_* value formats of a fixed size: absptr, udata2/4/8, sdata2/4/8
_FIXED_SIZE = {0x00: _U64, 0x02: _U16, 0x03: _U32, 0x04: _U64,
               0x0a: _S16, 0x0b: _S32, 0x0c: _S64}


def pointer(data, i: int, enc: int, base: int) -> tuple:
    """(value, next index) of an encoded pointer (DW_EH_PE_*) at data[i];
    `base`: the address of data[0] (pc-relative ones count from their field)."""
    fmt = enc & 0x0f
    fixed = _FIXED_SIZE.get(fmt)
    if fixed is not None:
        v, j = fixed.unpack_from(data, i)[0], i + fixed.size
    elif fmt == 0x01:
        from .leb128 import uleb128
        v, j = uleb128(data, i)
    elif fmt == 0x09:
        from .leb128 import sleb128
        v, j = sleb128(data, i)
    else:
        raise ValueError(f"pointer encoding {enc:#x}")
    if enc & 0x70 == 0x10:          # pcrel: relative to the field itself
        v += base + i
    return v & 0xffffffffffffffff, j


def _cie_encoding(data, hdr: int, eh: bool, base: int) -> tuple | None:
    """(FDE pointer encoding, or None for .debug_frame's plain addresses;
    address size) of the CIE whose entry starts at data[hdr]."""
    if not 0 <= hdr <= len(data) - 4:
        return None
    found = _cie_program(data, hdr, base)
    return None if found is None else found[:2]


def fde_range(data, pos: int, eh: bool, base: int, cies: dict | None = None):
    """(start, end) of the FDE whose entry starts at data[pos], None when
    that entry is a CIE, empty, or not understood."""
    length = _U32.unpack_from(data, pos)[0]
    if length == 0:
        return None
    wide = length == 0xffffffff
    id_pos = pos + (12 if wide else 4)
    cie_id = (_U64 if wide else _U32).unpack_from(data, id_pos)[0]
    if cie_id == (0 if eh else (0xffffffffffffffff if wide else 0xffffffff)):
        return None
    cie_at = id_pos - cie_id if eh else cie_id
    cie = cies.get(cie_at) if cies is not None else None
    if cie is None:
        cie = _cie_encoding(data, cie_at, eh, base)
        if cies is not None:
            cies[cie_at] = cie
    if cie is None:
        return None
    enc, addr_size = cie
    at = id_pos + (8 if wide else 4)
    if enc is None:
        word = _U32 if addr_size == 4 else _U64
        start, size = word.unpack_from(data, at)[0], word.unpack_from(data, at + addr_size)[0]
    else:
        start, at = pointer(data, at, enc, base)
        size, _ = pointer(data, at, enc & 0x0f, base)
    if start == 0 or size == 0:                         # discarded by the linker
        return None
    return start, start + size


def _scan(data, base: int, eh: bool):
    """(position, (start, end)) of every FDE in one section's bytes, in
    order; a damaged entry ends the scan (the FDEs before it are kept)."""
    cies: dict = {}
    pos, n = 0, len(data)
    try:
        while pos + 4 <= n:
            length = _U32.unpack_from(data, pos)[0]
            head = 4
            if length == 0xffffffff:
                length, head = _U64.unpack_from(data, pos + 4)[0], 12
            if length == 0:
                pos += 4
                continue
            if pos + head + length > n:
                break
            found = fde_range(data, pos, eh, base, cies)
            if found is not None:
                yield pos, found
            pos += head + length
    except (IndexError, struct.error, ValueError, OverflowError):
        return


def all_ranges(data, base: int, eh: bool) -> list:
    """Sorted (start, end) of every FDE in one section's bytes; a damaged
    entry ends the scan (the FDEs before it are kept)."""
    return sorted(found for _pos, found in _scan(data, base, eh))


def covering(ranges: list, starts: list, vaddr: int):
    """The (start, end) of `ranges` (sorted; `starts`: their starts) that
    holds vaddr, the one starting nearest below it when several do."""
    i = bisect.bisect_right(starts, vaddr) - 1
    while i >= 0:
        start, end = ranges[i]
        if vaddr < end:
            return start, end
        if i and ranges[i - 1][1] <= start:
            return None            # no earlier FDE reaches this far
        i -= 1
    return None


def hdr_table(hdr, hdr_addr: int) -> tuple | None:
    """.eh_frame_hdr's sorted table as two arrays of the same length: each
    FDE's initial location and the FDE's address, both relative to
    hdr_addr (the datarel sdata4 every linker writes); None when the header
    has no such table."""
    if len(hdr) < 4 or hdr[0] != 1:
        return None
    ptr_enc, count_enc, table_enc = hdr[1], hdr[2], hdr[3]
    if _OMIT in (ptr_enc, count_enc, table_enc) or table_enc != 0x3b:
        return None
    _, pos = pointer(hdr, 4, ptr_enc, hdr_addr)
    count, pos = pointer(hdr, pos, count_enc, hdr_addr)
    count = min(count, (len(hdr) - pos) // 8)
    pairs = array("i")
    pairs.frombytes(bytes(hdr[pos:pos + 8 * count]))
    if sys.byteorder != "little":
        pairs.byteswap()
    return pairs[0::2], pairs[1::2]


def hdr_lookup(hdr, hdr_addr: int, vaddr: int) -> int | None:
    """The address of the FDE .eh_frame_hdr's table names for vaddr (the
    last one whose initial location is at or below it), None when the
    header has no table or none is at or below vaddr."""
    table = hdr_table(hdr, hdr_addr)
    if table is None:
        return None
    starts, fdes = table
    i = bisect.bisect_right(starts, vaddr - hdr_addr)
    if i == 0:
        return None
    return (hdr_addr + fdes[i - 1]) & 0xffffffffffffffff


# --- the first row of an FDE: is its start where a call lands? ------------------

_RSP, _RA = 7, 16           # DWARF numbers of x86-64's rsp and return address
_STOP = object()


def _cie_program(data, hdr: int, base: int) -> tuple | None:
    """(FDE pointer encoding or None, address size, data alignment, whether
    FDEs have augmentation data, initial instructions [start, end)) of the
    CIE at data[hdr]; None when it cannot be read."""
    from .leb128 import sleb128, uleb128
    length = _U32.unpack_from(data, hdr)[0]
    pos = hdr + 4
    if length == 0xffffffff:
        length = _U64.unpack_from(data, pos)[0]
        pos += 8
        end = pos + length
        pos += 8
    else:
        end = pos + length
        pos += 4
    version = data[pos]
    z = bytes(data[pos + 1:pos + 64]).index(b"\0") + pos + 1
    aug = bytes(data[pos + 1:z]).decode("latin-1")
    pos = z + 1
    addr_size = 8
    if version >= 4:
        addr_size = data[pos]
        pos += 2
    _, pos = uleb128(data, pos)                         # code alignment
    data_align, pos = sleb128(data, pos)
    pos = pos + 1 if version == 1 else uleb128(data, pos)[1]
    enc = None
    if aug.startswith("z"):
        alen, pos = uleb128(data, pos)
        p, after = pos, pos + alen
        enc = 0x00
        for ch in aug[1:]:
            if ch == "R":
                enc = data[p]
                p += 1
            elif ch == "P":
                _, p = pointer(data, p + 1, data[p] & 0x7f, base)
            elif ch == "L":
                p += 1
            elif ch not in "SBG":
                if "R" not in aug[1:aug.index(ch)]:
                    return None        # unknown data before R: the encoding is not known
                break
        pos = after
    elif aug:
        return None
    return enc, addr_size, data_align, aug.startswith("z"), pos, end


def _first_row(data, i: int, end: int, state: list, data_align: int):
    """Run CFA instructions from data[i] until the location first changes,
    updating state [cfa register, cfa offset, return address offset];
    _STOP once a location changes, None at an instruction that makes the
    CFA or the return address unknown here (an expression)."""
    from .leb128 import sleb128, uleb128
    saved = []
    while i < end:
        op = data[i]
        i += 1
        hi = op & 0xc0
        if hi == 0x40 or op in (0x01, 0x02, 0x03, 0x04):    # advance_loc*, set_loc
            return _STOP
        if hi == 0x80:                                      # offset
            off, i = uleb128(data, i)
            if op & 0x3f == _RA:
                state[2] = off * data_align
        elif hi == 0xc0 or op == 0x00:                      # restore, nop
            continue
        elif op == 0x0c:                                    # def_cfa
            state[0], i = uleb128(data, i)
            state[1], i = uleb128(data, i)
        elif op == 0x0d:                                    # def_cfa_register
            state[0], i = uleb128(data, i)
        elif op == 0x0e:                                    # def_cfa_offset
            state[1], i = uleb128(data, i)
        elif op in (0x12, 0x13):                            # def_cfa(_offset)_sf
            if op == 0x12:
                state[0], i = uleb128(data, i)
            v, i = sleb128(data, i)
            state[1] = v * data_align
        elif op == 0x0a:                                    # remember_state
            saved.append(list(state))
        elif op == 0x0b:                                    # restore_state
            if saved:
                state[:] = saved.pop()
        elif op in (0x05, 0x09, 0x14, 0x2f):                # two ulebs
            reg, i = uleb128(data, i)
            v, i = uleb128(data, i)
            if reg == _RA:
                if op != 0x05:
                    return None
                state[2] = v * data_align
        elif op in (0x11, 0x15):                            # uleb, sleb
            reg, i = uleb128(data, i)
            v, i = sleb128(data, i)
            if reg == _RA:
                if op != 0x11:
                    return None
                state[2] = v * data_align
        elif op in (0x06, 0x07, 0x08):                      # one register
            reg, i = uleb128(data, i)
            if reg == _RA and op != 0x06:
                return None
        elif op == 0x2e:                                    # GNU_args_size
            _, i = uleb128(data, i)
        elif op in (0x10, 0x16):                            # (val_)expression
            reg, i = uleb128(data, i)
            n, i = uleb128(data, i)
            i += n
            if reg == _RA:
                return None
        else:                                               # def_cfa_expression, unknown
            return None
    return _STOP


def entry_cfa(data, pos: int, eh: bool, base: int) -> tuple | None:
    """(start, CFA register, CFA offset, return address's offset from the
    CFA) at the first row of the FDE whose entry starts at data[pos]: a
    function that calls reach has CFA = rsp + 8 and the return address at
    CFA - 8 there (the return address is at sp). None when unreadable."""
    try:
        length = _U32.unpack_from(data, pos)[0]
        wide = length == 0xffffffff
        end = pos + (12 + _U64.unpack_from(data, pos + 4)[0] if wide else 4 + length)
        id_pos = pos + (12 if wide else 4)
        cie_id = (_U64 if wide else _U32).unpack_from(data, id_pos)[0]
        cie = _cie_program(data, id_pos - cie_id if eh else cie_id, base)
        if cie is None:
            return None
        enc, addr_size, data_align, has_z, init, init_end = cie
        at = id_pos + (8 if wide else 4)
        if enc is None:
            word = _U32 if addr_size == 4 else _U64
            start = word.unpack_from(data, at)[0]
            at += 2 * addr_size
        else:
            start, at = pointer(data, at, enc, base)
            _, at = pointer(data, at, enc & 0x0f, base)
        if has_z:
            from .leb128 import uleb128
            alen, at = uleb128(data, at)
            at += alen
        state = [_RSP, 8, None]
        if _first_row(data, init, init_end, state, data_align) is None or \
                _first_row(data, at, end, state, data_align) is None:
            return None
        return start, state[0], state[1], state[2]
    except (IndexError, struct.error, ValueError, OverflowError):
        return None


def is_call_entry(row: tuple | None) -> bool:
    """Whether an entry_cfa row says the return address is at sp."""
    return row is not None and row[1:] == (_RSP, 8, -8)


def entry_positions(data, base: int, eh: bool) -> dict:
    """{start: entry position} of every FDE in one section's bytes (for
    entry_cfa where no .eh_frame_hdr table finds them)."""
    out = {}
    for pos, found in _scan(data, base, eh):
        out.setdefault(found[0], pos)
    return out
