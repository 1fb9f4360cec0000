"""DWARF call frame information compiled into a compact unwind table.

An object's CFI (.eh_frame, .debug_frame, and the separate debug file's
.debug_frame when the object has gaps) is interpreted once into rows that
say, per address range, how to find the caller: CFA = rsp|rbp|rbx + off,
return address at CFA + off, rbp and rbx unchanged / at CFA + off / lost.
rbx is kept because glibc's lazy-binding resolver (_dl_runtime_resolve_*)
and TLS descriptors define their CFA from it: a walk through them needs
rbx as each frame between restored it. Only what an x86-64 unwinder needs
is kept, as parallel arrays: lookup() is one bisect and the table is one
file on disk, cached by a hash of the CFI sections it was built from
(objfile/content_key.py), because interpreting libc's CFI costs far more
than reading the result back.

The parser is our own, not pyelftools' CFI decoder: that one is several
times slower (its entries are rich objects) and raises on
DW_CFA_GNU_args_size, which every C++ object with exceptions contains.
Section bytes come from ElfImage (which inflates SHF_COMPRESSED ones); the
debug file is the one objfile/debuginfo finds (build-id, .gnu_debuglink,
the user's --debug-dir), already checked to belong to the object."""
from __future__ import annotations

import bisect
import os
import struct
import zlib
from array import array

from ..model import UstackError
from ..objfile import cache as objcache
from ..objfile.built_once import BuiltOnce
from ..objfile.debuginfo import DebugLookup
from ..objfile.elf import ElfImage
from ..objfile.fde import pointer as _pointer
from ..objfile.leb128 import sleb128, uleb128
from .cfi_key import UNREADABLE, cfi_sections, debug_file, sections_key, table_key, table_of
from .cfi_key import forget as forget_debug_files

# Row kinds (low nibble of a row's kind byte).
NONE = 0      # no CFI here: the unwinder falls back (frame pointer)
CFA_SP = 1    # CFA = rsp + cfa_off
CFA_BP = 2    # CFA = rbp + cfa_off
CFA_PLT = 3   # lazy-binding PLT: CFA = rsp + cfa_off + (8 if (rip & 15) >= aux)
UNKNOWN = 4   # CFI exists but uses rules we do not evaluate
END = 5       # return address undefined: the outermost frame (_start, clone3)
CFA_SP_DEREF = 6  # CFA = [rsp + cfa_off] + aux (OpenSSL's assembly)
CFA_BP_DEREF = 7  # CFA = [rbp + cfa_off] + aux (gcc's realigned stack, DRAP)
CFA_BX = 8    # CFA = rbx + cfa_off (ld.so's _dl_runtime_resolve_*, _dl_tlsdesc_*)
# rbp rule (bits 4-5).
BP_SAME = 0   # rbp keeps its value in the caller
BP_AT = 1     # caller's rbp saved at CFA + bp_off
BP_LOST = 2   # undefined, or a rule we do not evaluate
BP_AT_BP = 3  # caller's rbp saved at rbp + bp_off (DRAP: DW_OP_breg6 expression)
# rbx rule (bits 6-7).
BX_SAME = 0   # rbx keeps its value in the caller
BX_AT = 1     # caller's rbx saved at CFA + bx_off
BX_LOST = 2   # undefined, or a rule we do not evaluate


def rules(kind_byte: int) -> tuple:
    """(kind, bp rule, bx rule) of a row's kind byte."""
    return kind_byte & 15, (kind_byte >> 4) & 3, kind_byte >> 6

_RSP, _RBP, _RBX = 7, 6, 3        # DWARF register numbers on x86-64
_R_SAME, _R_OFF, _R_UNDEF, _R_OTHER, _R_AT_BP = 0, 1, 2, 3, 4  # rules while parsing
_MAGIC = b"USTKCFI\x03"
_ROW_BYTES = 8 + 1 + 4 * 5
_HEADER = struct.Struct("<8sIII")  # magic, rows, len(signature), crc32
_U16, _U32, _U64 = struct.Struct("<H"), struct.Struct("<I"), struct.Struct("<Q")
# DWARF expression opcodes that CFA expressions seen in practice use.
_OP_BREG6, _OP_BREG7, _OP_BREG16 = 0x76, 0x77, 0x80
_OP_DEREF, _OP_PLUS_UCONST = 0x06, 0x23
# The PLT's CFA expression (binutils): breg7 N; breg16 0; lit15; and; litK;
# ge; lit3; shl; plus. N and K are read from the bytes.
_PLT_MID = b"\x80\x00\x3f\x1a"              # breg16 0; lit15; and
_PLT_END = b"\x2a\x33\x24\x22"              # ge; lit3; shl; plus


class UnwindTable:
    """Unwind rows of one ELF object, addressed by ELF virtual address."""

    parse_count = 0          # objects whose CFI this process has interpreted
    # (dev, ino, mtime, debug dirs) -> (UnwindTable, DebugLookup), one builder
    # per object: the run's reader (a deferred stack) and the loader of kernel
    # rows (capture/lazy_rows.py) may want it at once
    _memo = BuiltOnce()

    __slots__ = ("path", "starts", "kinds", "cfa", "ra", "bp", "aux", "bx", "from_cache", "key")

    def __init__(self, path: str, starts: array, kinds: bytes, cfa: array,
                 ra: array, bp: array, aux: array, bx: array, from_cache: bool = False):
        self.path = path
        self.starts = starts      # array('Q'): row start addresses, sorted
        self.kinds = kinds        # kind | bp_rule << 4 | bx_rule << 6, one byte per row
        self.cfa = cfa            # array('i'): CFA offset
        self.ra = ra              # array('i'): return address at CFA + ra
        self.bp = bp              # array('i'): rbp's offset (see the BP_ rules)
        self.aux = aux            # array('i'): PLT threshold, or added after a deref
        self.bx = bx              # array('i'): rbx's offset from the CFA (BX_AT)
        self.from_cache = from_cache
        self.key = ""             # the content key of the CFI it was built from

    def __len__(self) -> int:
        return len(self.starts)

    def lookup(self, vaddr: int) -> tuple | None:
        """(kind, cfa_off, ra_off, bp_rule, bp_off, aux, bx_rule, bx_off) at
        vaddr, None without CFI."""
        i = bisect.bisect_right(self.starts, vaddr) - 1
        if i < 0:
            return None
        k = self.kinds[i]
        if k & 15 == NONE:
            return None
        return (k & 15, self.cfa[i], self.ra[i], (k >> 4) & 3, self.bp[i], self.aux[i],
                k >> 6, self.bx[i])

    # --- building and caching -----------------------------------------------

    @classmethod
    def loaded(cls) -> list:
        """The tables this process holds in memory (built or read from the
        disk cache: see from_cache), one per object and debug dirs."""
        return [table for table, _found in cls._memo.values.values()]

    @classmethod
    def clear_cache(cls) -> None:
        """Forget the tables held in memory; the disk cache stays, so the
        next for_image() reads it (or builds the table again)."""
        cls._memo.clear()
        forget_debug_files()

    @classmethod
    def for_image(cls, image: ElfImage, debug_dirs=()) -> tuple:
        """(UnwindTable, DebugLookup) of an ELF object, from memory, the disk
        cache, or built (and cached). The object's CFI gaps are filled from
        its separate debug file under debug_dirs and the default roots; the
        DebugLookup says which file that was and which candidates were
        refused. A warm cache hit reads no section."""
        st = os.stat(image.path)
        key = objcache.memo_key(st) + (tuple(debug_dirs),)
        return cls._memo.get(key, lambda: cls._read_or_build(image, st, debug_dirs))

    @classmethod
    def in_memory(cls, image: ElfImage, debug_dirs=()) -> tuple | None:
        """for_image()'s answer if this process holds it already, else None
        (nothing is read or built)."""
        st = os.stat(image.path)
        return cls._memo.values.get(objcache.memo_key(st) + (tuple(debug_dirs),))

    @classmethod
    def _cached(cls, image: ElfImage, key: str):
        """The table on disk built from the CFI whose key is `key`, or None
        (none, corrupt, or of other bytes: built again)."""
        blob = objcache.read(objcache.cache_file("cfi", key, "v2"))
        table = cls.from_bytes(image.path, blob, key.encode()) if blob else None
        if table is not None:
            table.key = key
        return table

    @classmethod
    def _read_or_build(cls, image: ElfImage, st: os.stat_result, debug_dirs) -> tuple:
        found = debug_file(image, st, debug_dirs)
        table = cls._cached(image, table_key(image, st, found))
        if table is None:
            cls.parse_count += 1
            table = _build(image, found)    # keyed by the bytes it parsed
            objcache.write(objcache.cache_file("cfi", table.key, "v2"),
                           table.to_bytes(table.key.encode()))
        return table, found

    def to_bytes(self, signature: bytes = b"") -> bytes:
        body = b"".join((signature, self.starts.tobytes(), self.kinds, self.cfa.tobytes(),
                         self.ra.tobytes(), self.bp.tobytes(), self.aux.tobytes(),
                         self.bx.tobytes()))
        return _HEADER.pack(_MAGIC, len(self.starts), len(signature),
                            zlib.crc32(body)) + body

    @classmethod
    def from_bytes(cls, path: str, blob: bytes, signature: bytes = b""
                   ) -> "UnwindTable" | None:
        """None if blob is not a well-formed table for this debug state."""
        if len(blob) < _HEADER.size:
            return None
        magic, n, siglen, crc = _HEADER.unpack_from(blob)
        body = memoryview(blob)[_HEADER.size:]
        if magic != _MAGIC or len(body) != siglen + _ROW_BYTES * n or zlib.crc32(body) != crc:
            return None
        if bytes(body[:siglen]) != signature:
            return None   # built from other sections or another debug file
        p = siglen
        arrays = []
        for code, width in (("Q", 8), ("B", 1), ("i", 4), ("i", 4), ("i", 4), ("i", 4),
                            ("i", 4)):
            a = array(code)
            a.frombytes(body[p:p + width * n])
            arrays.append(a)
            p += width * n
        starts, kinds, cfa, ra, bp, aux, bx = arrays
        return cls(path, starts, bytes(kinds), cfa, ra, bp, aux, bx, from_cache=True)


# --- building ------------------------------------------------------------------

def _build(image: ElfImage, found: DebugLookup) -> UnwindTable:
    """The table of the object and its debug file, its key that of the
    bytes parsed here (not read again: the file may change meanwhile)."""
    fdes: list = []
    sections = cfi_sections(image)
    for data, vaddr, eh in sections:
        more: list = []
        _parse(data, vaddr, eh, more)
        fdes = _fill_gaps(fdes, more)
    debug_key = ""
    if found.path is not None:
        debug_fdes, debug_key = _debug_fdes(found)
        fdes = _fill_gaps(fdes, debug_fdes)
    table = _flatten(image.path, fdes)
    table.key = table_of(sections_key(sections), debug_key)
    return table


def _debug_fdes(found: DebugLookup) -> tuple:
    """The FDEs of the separate debug file (debuginfo checked that it
    belongs to the object) and the key of the bytes they came from; a
    damaged one gives none, and says so."""
    out: list = []
    try:
        sections = cfi_sections(ElfImage.open(found.path))
        for data, vaddr, eh in sections:
            _parse(data, vaddr, eh, out)
    except UstackError as e:
        found.refused.append(f"{e}; its CFI is not used")
        return [], UNREADABLE
    return out, sections_key(sections)


def _fill_gaps(fdes: list, extra: list) -> list:
    """fdes plus those of extra that overlap none of them."""
    if not fdes or not extra:
        return fdes + extra
    fdes.sort(key=lambda f: f[0])
    starts = [f[0] for f in fdes]
    keep = []
    for fde in extra:
        s, e = fde[0], fde[1]
        i = bisect.bisect_right(starts, s) - 1
        if (i >= 0 and fdes[i][1] > s) or (i + 1 < len(fdes) and fdes[i + 1][0] < e):
            continue
        keep.append(fde)
    return fdes + keep


_INT32 = range(-1 << 31, 1 << 31)
_ADDRESSES = range(1 << 64)


def fits(fde) -> bool:
    """Whether an FDE's addresses and rows fit the table's arrays (a
    corrupt one's may not: it is left out, as if it had no CFI)."""
    lo, hi, rows = fde
    if lo not in _ADDRESSES or hi not in _ADDRESSES:
        return False
    for offset, row in rows:
        if lo + offset not in _ADDRESSES:
            return False
        fits = _ROW_FITS.get(row)
        if fits is None:
            fits = _ROW_FITS[row] = 0 <= row[0] < 256 and all(v in _INT32 for v in row[1:])
        if not fits:
            return False
    return True


_ROW_FITS: dict = {}    # row -> whether its values fit the arrays


def _flatten(path: str, fdes: list) -> UnwindTable:
    """FDEs (start, end, rows relative to start) -> one sorted, gap-marked,
    deduplicated table."""
    fdes = sorted(filter(fits, fdes), key=lambda f: f[0])
    starts, kinds = array("Q"), bytearray()
    cfa, ra, bp, aux, bx = array("i"), array("i"), array("i"), array("i"), array("i")
    last = None
    none = (NONE, 0, 0, 0, 0, 0)

    def emit(addr, row):
        nonlocal last
        if row == last:
            return
        if starts and starts[-1] == addr:   # an empty range: replace it
            kinds[-1], cfa[-1], ra[-1], bp[-1], aux[-1], bx[-1] = row
        else:
            starts.append(addr)
            kinds.append(row[0])
            cfa.append(row[1])
            ra.append(row[2])
            bp.append(row[3])
            aux.append(row[4])
            bx.append(row[5])
        last = row

    for i, (lo, hi, rows) in enumerate(fdes):
        nxt = fdes[i + 1][0] if i + 1 < len(fdes) else None
        if nxt is not None and nxt < hi:
            hi = nxt                          # overlapping FDEs: the later wins
        for offset, row in rows:
            addr = lo + offset
            if addr >= hi:
                break
            emit(addr, row)
        if nxt is None or nxt > hi:
            emit(hi, none)
    return UnwindTable(path, starts, bytes(kinds), cfa, ra, bp, aux, bx)


# --- the CFI parser --------------------------------------------------------------

class _Cie:
    __slots__ = ("code_align", "data_align", "ra_reg", "fde_enc", "has_z",
                 "addr_size", "init", "ok", "base")


_uleb, _sleb = uleb128, sleb128   # short names: the parser calls them everywhere


def _parse(data: bytes, base: int, eh: bool, out: list) -> None:
    """Append (start, end, [(offset from start, row), ...]) for each FDE of
    one section. A malformed entry ends the section (what came before is
    kept). FDEs with the same CIE and instructions share one row list
    (node: 76,000 FDEs, 31,000 distinct programs)."""
    cies: dict = {}
    programs: dict = {}
    n = len(data)
    pos = 0
    try:
        while pos + 4 <= n:
            fde, pos = entry_at(data, pos, base, eh, cies, programs)
            if fde is not None:
                out.append(fde)
    except (IndexError, struct.error, ValueError):
        return


def entry_at(data: bytes, pos: int, base: int, eh: bool, cies: dict,
             programs: dict) -> tuple:
    """(the FDE at pos or None for a CIE or padding, where the next entry
    starts). `cies`, `programs`: what entries read before left (CIEs by
    offset, row lists by CIE and instructions). Raises ValueError (or
    IndexError, struct.error) on a malformed entry."""
    hdr = pos
    length = _U32.unpack_from(data, pos)[0]
    pos += 4
    if length == 0:                     # .eh_frame terminator / padding
        return None, pos
    wide = length == 0xffffffff
    if wide:
        length = _U64.unpack_from(data, pos)[0]
        pos += 8
    end = pos + length
    if end > len(data):
        raise ValueError("an entry runs past its section")
    id_pos = pos
    if wide:
        cie_id, pos = _U64.unpack_from(data, pos)[0], pos + 8
    else:
        cie_id, pos = _U32.unpack_from(data, pos)[0], pos + 4
    if eh:
        is_cie = cie_id == 0
    else:
        is_cie = cie_id == (0xffffffffffffffff if wide else 0xffffffff)
    if is_cie:
        if hdr not in cies:
            cies[hdr] = _parse_cie(data, pos, end, eh, base)
        return None, end
    cie_at = id_pos - cie_id if eh else cie_id
    cie = cies.get(cie_at)
    if cie is None:
        cie = cies[cie_at] = _parse_cie_at(data, cie_at, eh, base)
    fde = None
    if cie is not None and cie.ok:
        fde = _parse_fde(data, pos, end, cie, base, programs)
    return fde, end


def _parse_cie_at(data: bytes, hdr: int, eh: bool, base: int) -> _Cie | None:
    """A CIE that an FDE names before the parser reached it (.debug_frame)."""
    if hdr < 0 or hdr + 4 > len(data):
        return None
    length = _U32.unpack_from(data, hdr)[0]
    pos = hdr + 4
    if length == 0xffffffff:
        length = _U64.unpack_from(data, pos)[0]
        pos += 8
        return _parse_cie(data, pos + 8, pos + length, eh, base)
    return _parse_cie(data, pos + 4, pos + length, eh, base)


def _parse_cie(data: bytes, pos: int, end: int, eh: bool, base: int) -> _Cie:
    cie = _Cie()
    cie.ok = False
    cie.base = base
    version = data[pos]
    pos += 1
    z = data.index(b"\0", pos)
    aug = data[pos:z].decode("latin-1")
    pos = z + 1
    cie.addr_size = 8
    if version >= 4:
        cie.addr_size = data[pos]
        pos += 2                       # address_size, segment_selector_size
    cie.code_align, pos = _uleb(data, pos)
    cie.data_align, pos = _sleb(data, pos)
    if version == 1:
        cie.ra_reg, pos = data[pos], pos + 1
    else:
        cie.ra_reg, pos = _uleb(data, pos)
    cie.fde_enc = 0x00
    cie.has_z = aug.startswith("z")
    if cie.has_z:
        alen, pos = _uleb(data, pos)
        p, aend = pos, pos + alen
        for ch in aug[1:]:
            if ch == "R":
                cie.fde_enc, p = data[p], p + 1
            elif ch == "P":
                enc = data[p]
                _, p = _pointer(data, p + 1, enc & 0x7f, base)
            elif ch == "L":
                p += 1
            elif ch in "SBG":
                pass                   # signal frame, AArch64 keys, MTE: no data
            else:
                break                  # unknown: the length still lets us skip
        pos = aend
    elif aug:
        return cie                     # unknown augmentation without 'z': unusable
    init = (_RSP, 8, None, _R_SAME, 0, _R_SAME, 0, _R_SAME, 0)
    cie.init = init
    cie.init = _run(data, pos, end, init, cie, 0, None)[0]
    cie.ok = True
    return cie


def _parse_fde(data: bytes, pos: int, end: int, cie: _Cie, base: int, programs: dict):
    """(start, end, rows relative to start) of one FDE; `programs`: rows
    already run, by (CIE, instruction bytes)."""
    if cie.has_z or cie.fde_enc:
        start, pos = _pointer(data, pos, cie.fde_enc, base)
        size, pos = _pointer(data, pos, cie.fde_enc & 0x0f, base)
    else:                              # .debug_frame: plain target addresses
        if cie.addr_size == 4:
            start, size = _U32.unpack_from(data, pos)[0], _U32.unpack_from(data, pos + 4)[0]
        else:
            start, size = _U64.unpack_from(data, pos)[0], _U64.unpack_from(data, pos + 8)[0]
        pos += 2 * cie.addr_size
    if cie.has_z:
        alen, pos = _uleb(data, pos)
        pos += alen
    if size == 0 or start == 0:        # empty, or code the linker discarded
        return None
    key = (id(cie), data[pos:end])     # the CIE lives as long as `programs`
    rows = programs.get(key)
    if rows is None:
        rows = []
        _state, _loc, absolute = _run(data, pos, end, cie.init, cie, 0, rows)
        if absolute:                   # DW_CFA_set_loc: run again from the FDE's own start
            rows = []
            _run(data, pos, end, cie.init, cie, start, rows)
            return (start, start + size, [(at - start, row) for at, row in rows])
        programs[key] = rows
    return (start, start + size, rows)


def _row(state) -> tuple:
    """A parser state -> (kind byte, cfa_off, ra_off, bp_off, aux, bx_off)
    for the table."""
    cfa_reg, cfa_off, expr, ra_k, ra_o, bp_k, bp_o, bx_k, bx_o = state
    if ra_k == _R_UNDEF:
        return (END, 0, 0, 0, 0, 0)
    if ra_k != _R_OFF:
        return (UNKNOWN, 0, 0, 0, 0, 0)
    aux = 0
    if expr is not None:
        rule = _cfa_expression(expr)
        if rule is None:
            return (UNKNOWN, 0, 0, 0, 0, 0)
        kind, cfa_off, aux = rule
    else:
        kind = _CFA_KINDS.get(cfa_reg)
        if kind is None:                  # rdi (libc's __start_context): not tracked
            return (UNKNOWN, 0, 0, 0, 0, 0)
    if bx_k == _R_SAME:
        kind |= BX_SAME << 6
        bx_o = 0
    elif bx_k == _R_OFF:
        kind |= BX_AT << 6
    else:
        kind |= BX_LOST << 6
        bx_o = 0
    if bp_k == _R_SAME:
        return (kind | BP_SAME << 4, cfa_off, ra_o, 0, aux, bx_o)
    if bp_k == _R_OFF:
        return (kind | BP_AT << 4, cfa_off, ra_o, bp_o, aux, bx_o)
    if bp_k == _R_AT_BP:
        return (kind | BP_AT_BP << 4, cfa_off, ra_o, bp_o, aux, bx_o)
    return (kind | BP_LOST << 4, cfa_off, ra_o, 0, aux, bx_o)


_CFA_KINDS = {_RSP: CFA_SP, _RBP: CFA_BP, _RBX: CFA_BX}


def _cfa_expression(expr: bytes) -> tuple | None:
    """(kind, cfa_off, aux) for the CFA expressions compilers emit:
    the PLT's, and `bregN off; deref [; plus_uconst k]`. None otherwise."""
    if len(expr) < 3 or expr[0] not in (_OP_BREG6, _OP_BREG7):
        return None
    off, i = _sleb(expr, 1)
    rest = expr[i:]
    if expr[0] == _OP_BREG7 and len(rest) == 9 and rest[:4] == _PLT_MID \
            and 0x30 <= rest[4] <= 0x4f and rest[5:] == _PLT_END:
        return CFA_PLT, off, rest[4] - 0x30
    if rest[:1] != bytes((_OP_DEREF,)):
        return None
    kind = CFA_SP_DEREF if expr[0] == _OP_BREG7 else CFA_BP_DEREF
    if len(rest) == 1:
        return kind, off, 0
    if rest[1] == _OP_PLUS_UCONST:
        add, j = _uleb(rest, 2)
        if j == len(rest):
            return kind, off, add
    return None


def _run(data: bytes, i: int, end: int, state: tuple, cie: _Cie, loc: int,
         rows: list | None):
    """Interpret CFA instructions from state; append (addr, row) to rows at
    each location change. Returns (final state, loc, whether a set_loc
    gave an absolute address). Only the CFA, the return address, rbp
    and rbx are tracked; other registers' rules are skipped."""
    cfa_reg, cfa_off, expr, ra_k, ra_o, bp_k, bp_o, bx_k, bx_o = state
    init = cie.init
    ra_reg = cie.ra_reg
    caf, daf = cie.code_align, cie.data_align
    stack: list = []
    last_row = None
    absolute = False

    while i < end:
        op = data[i]
        i += 1
        hi = op & 0xc0
        adv = 0
        if hi == 0x40:                                   # advance_loc
            adv = (op & 0x3f) * caf
        elif hi == 0x80:                                 # offset
            reg = op & 0x3f
            v, i = _uleb(data, i)
            if reg == ra_reg:
                ra_k, ra_o = _R_OFF, v * daf
            elif reg == _RBP:
                bp_k, bp_o = _R_OFF, v * daf
            elif reg == _RBX:
                bx_k, bx_o = _R_OFF, v * daf
            continue
        elif hi == 0xc0:                                 # restore
            reg = op & 0x3f
            if reg == ra_reg:
                ra_k, ra_o = init[3], init[4]
            elif reg == _RBP:
                bp_k, bp_o = init[5], init[6]
            elif reg == _RBX:
                bx_k, bx_o = init[7], init[8]
            continue
        elif op == 0x0e:                                 # def_cfa_offset
            cfa_off, i = _uleb(data, i)
            expr = None if cfa_reg is not None else expr
            continue
        elif op == 0x00:                                 # nop
            continue
        elif op == 0x0a:                                 # remember_state
            stack.append((cfa_reg, cfa_off, expr, ra_k, ra_o, bp_k, bp_o, bx_k, bx_o))
            continue
        elif op == 0x0b:                                 # restore_state
            if stack:
                cfa_reg, cfa_off, expr, ra_k, ra_o, bp_k, bp_o, bx_k, bx_o = stack.pop()
            continue
        elif op == 0x02:                                 # advance_loc1
            adv = data[i] * caf
            i += 1
        elif op == 0x03:                                 # advance_loc2
            adv = _U16.unpack_from(data, i)[0] * caf
            i += 2
        elif op == 0x04:                                 # advance_loc4
            adv = _U32.unpack_from(data, i)[0] * caf
            i += 4
        elif op == 0x0c:                                 # def_cfa
            cfa_reg, i = _uleb(data, i)
            cfa_off, i = _uleb(data, i)
            expr = None
            continue
        elif op == 0x0d:                                 # def_cfa_register
            cfa_reg, i = _uleb(data, i)
            expr = None
            continue
        elif op == 0x12 or op == 0x13:                   # def_cfa_sf / def_cfa_offset_sf
            if op == 0x12:
                cfa_reg, i = _uleb(data, i)
            v, i = _sleb(data, i)
            cfa_off, expr = v * daf, None
            continue
        elif op == 0x0f:                                 # def_cfa_expression
            n, i = _uleb(data, i)
            expr, cfa_reg = bytes(data[i:i + n]), None
            i += n
            continue
        elif op in (0x05, 0x11, 0x14, 0x15, 0x2f):       # offset_extended(_sf),
            # val_offset(_sf), GNU_negative_offset_extended
            reg, i = _uleb(data, i)
            if op in (0x05, 0x14, 0x2f):
                v, i = _uleb(data, i)
            else:
                v, i = _sleb(data, i)
            v = -v * daf if op == 0x2f else v * daf
            k = _R_OFF if op in (0x05, 0x11, 0x2f) else _R_OTHER
            if reg == ra_reg:
                ra_k, ra_o = k, v
            elif reg == _RBP:
                bp_k, bp_o = k, v
            elif reg == _RBX:
                bx_k, bx_o = k, v
            continue
        elif op in (0x06, 0x07, 0x08):                   # restore_extended, undefined, same_value
            reg, i = _uleb(data, i)
            if op == 0x06:
                k, v = (init[3], init[4]) if reg == ra_reg else \
                    (init[7], init[8]) if reg == _RBX else (init[5], init[6])
            else:
                k, v = (_R_UNDEF if op == 0x07 else _R_SAME), 0
            if reg == ra_reg:
                ra_k, ra_o = k, v
            elif reg == _RBP:
                bp_k, bp_o = k, v
            elif reg == _RBX:
                bx_k, bx_o = k, v
            continue
        elif op == 0x09:                                 # register
            reg, i = _uleb(data, i)
            _, i = _uleb(data, i)
            if reg == ra_reg:
                ra_k = _R_OTHER
            elif reg == _RBP:
                bp_k = _R_OTHER
            elif reg == _RBX:
                bx_k = _R_OTHER
            continue
        elif op == 0x10 or op == 0x16:                   # expression, val_expression
            reg, i = _uleb(data, i)
            n, i = _uleb(data, i)
            if reg == ra_reg:
                ra_k = _R_OTHER
            elif reg == _RBX:
                bx_k = _R_OTHER
            elif reg == _RBP:
                bp_k = _R_OTHER
                # DRAP: rbp saved at rbp + k (DW_OP_breg6 k), the one form kept
                if op == 0x10 and n >= 2 and data[i] == _OP_BREG6:
                    k, j = _sleb(data, i + 1)
                    if j == i + n:
                        bp_k, bp_o = _R_AT_BP, k
            i += n
            continue
        elif op == 0x2e:                                 # GNU_args_size: not needed
            _, i = _uleb(data, i)
            continue
        elif op == 0x2d:                                 # GNU_window_save (SPARC)
            continue
        elif op == 0x01:                                 # set_loc
            new, i = _pointer(data, i, cie.fde_enc, cie.base)
            adv = new - loc
            absolute = True
        else:
            break                                        # unknown opcode: stop here
        # A location change: the state so far covers [row start, loc + adv).
        if rows is not None and adv:
            state = (cfa_reg, cfa_off, expr, ra_k, ra_o, bp_k, bp_o, bx_k, bx_o)
            row = _ROWS.get(state)
            if row is None:
                row = _ROWS[state] = _row(state)
            if row != last_row:
                rows.append((loc, row))
                last_row = row
        loc += adv
    state = (cfa_reg, cfa_off, expr, ra_k, ra_o, bp_k, bp_o, bx_k, bx_o)
    if rows is not None:
        row = _row(state)
        if row != last_row:
            rows.append((loc, row))
    return state, loc, absolute


_ROWS: dict = {}        # parser state -> _row(state): a few hundred distinct
