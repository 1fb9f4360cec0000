"""Go's own symbol table, .gopclntab: function names, file:line and inlined
calls for any pc of a Go binary, stripped (-ldflags=-s -w) or not.

Written against the layouts documented in Go's src/runtime/symtab.go
(pcHeader, _func, inlinedCall) and src/debug/gosym/pclntab.go:

  magic 0xfffffffa  Go 1.16-1.17  entries are absolute pcs (pointer-sized)
  magic 0xfffffff0  Go 1.18-1.19  entries are uint32 offsets from textStart
  magic 0xfffffff1  Go 1.20+      _func gains startLine; inlinedCall shrinks

Every read is bounds-checked: a corrupt table gives PclntabError when it is
opened, and None (no name) for a pc it cannot explain, never a wrong name.
The inline tree lives outside the table (moduledata.gofunc + funcdata
offset); runtime.firstmoduledata is found by its pointer to the table, so
inlined frames work on stripped binaries too."""
from __future__ import annotations

import bisect
import struct
import weakref
from array import array

from ..model import UstackError
from .leb128 import uleb128
from ..values import value

GO116, GO118, GO120 = 0xFFFFFFFA, 0xFFFFFFF0, 0xFFFFFFF1
_MAGICS = {GO116: "1.16", GO118: "1.18", GO120: "1.20"}
_PCDATA_INL_TREE_INDEX = 2
_FUNCDATA_INL_TREE = 3
_NO_DATA = 0xFFFFFFFF
_MAX_INLINE_DEPTH = 64     # a loop in a corrupt tree must end
_MAX_CACHED_PCS = 1 << 16  # frames() results kept per table; bounds memory


class PclntabError(UstackError):
    """The table is missing, of an unknown version, or corrupt."""


@value
class GoFrame:
    """One frame at a pc: the function, its source position, and whether it
    is a call inlined into the frame after it."""
    function: str
    file: str
    line: int
    inlined: bool = False


@value
class GoFunc:
    name: str
    entry: int
    end: int
    index: int


class Pclntab:
    """One parsed .gopclntab. `data` is the table's bytes, `addr` the
    virtual address they are loaded at; `read(vaddr, size)` reads other
    parts of the image (for moduledata and the inline tree), may be None."""

    def __init__(self, data: bytes, addr: int, read=None, text_start: int | None = None):
        self.data = memoryview(data)
        self.addr = addr
        self._read = read
        self._names: dict = {}
        self._strings: dict = {}
        self._frames: dict = {}        # pc -> tuple of GoFrames (frames() cache)
        try:
            self._parse_header(text_start)
        except (struct.error, IndexError, ValueError) as e:
            raise PclntabError(f"corrupt .gopclntab: {e}") from None
        self._gofunc: int | None = None
        self._gofunc_done = False

    # --- header and function table ----------------------------------------

    def _parse_header(self, text_start) -> None:
        d = self.data
        if len(d) < 16:
            raise PclntabError("corrupt .gopclntab: shorter than its header")
        magic = struct.unpack_from("<I", d, 0)[0]
        if magic not in _MAGICS:
            raise PclntabError(f"unsupported .gopclntab (magic 0x{magic:08x}; "
                               "Go 1.16 or newer is needed)")
        if d[4] or d[5] or d[6] not in (1, 2, 4) or d[7] not in (4, 8):
            raise PclntabError("corrupt .gopclntab header")
        self.magic, self.version = magic, _MAGICS[magic]
        self.quantum, self.ptrsize = d[6], d[7]
        word = "<Q" if self.ptrsize == 8 else "<I"

        def w(i):
            return struct.unpack_from(word, d, 8 + i * self.ptrsize)[0]

        self.nfunc, self.nfiles = w(0), w(1)
        if magic == GO116:
            first = 2
            self.text_start = 0
        else:
            first = 3
            # the table's own textStart may be unrelocated (PIE): prefer the
            # caller's (the .text address), as debug/gosym does
            self.text_start = w(2) if text_start is None else text_start
        offs = [w(first + i) for i in range(5)]  # funcname, cu, file, pc, func
        if any(o >= len(d) for o in offs):
            raise PclntabError("corrupt .gopclntab: an offset points outside it")
        self.funcnametab, self.cutab, self.filetab, self.pctab, self.pclntable = (
            d[o:] for o in offs)
        self._offsets = dict(zip(("funcname", "cu", "file", "pc", "func"), offs))
        # functab: nfunc (entry, funcoff) pairs and a final entry = end of text
        field = 4 if magic != GO116 else self.ptrsize
        n = 2 * self.nfunc + 1
        if self.nfunc <= 0 or n * field > len(self.pclntable):
            raise PclntabError("corrupt .gopclntab: function table out of bounds")
        tab = array("I" if field == 4 else "Q")
        tab.frombytes(self.pclntable[:n * field].tobytes())
        base = self.text_start if magic != GO116 else 0
        self._entries = [base + e for e in tab[0::2]]   # nfunc + 1 values
        self._funcoffs = tab[1::2]
        if any(a > b for a, b in zip(self._entries, self._entries[1:])):
            raise PclntabError("corrupt .gopclntab: function table not sorted")
        # _func: a 4-byte entry offset (1.18+) or a pointer (1.16), then
        # 4-byte fields; startLine (1.20+) shifts the bytes at the end
        self._field0 = 4 if magic != GO116 else self.ptrsize
        self._func_size = self._field0 + (9 if magic == GO120 else 8) * 4 + 4

    @property
    def text_range(self) -> tuple:
        return self._entries[0], self._entries[-1]

    def __len__(self) -> int:
        return self.nfunc

    def functions(self):
        """(name, entry, end) of every function, in address order."""
        for i in range(self.nfunc):
            name = self._func_name(i)
            if name:
                yield name, self._entries[i], self._entries[i + 1]

    def find(self, pc: int) -> GoFunc | None:
        i = bisect.bisect_right(self._entries, pc) - 1
        if i < 0 or i >= self.nfunc or pc >= self._entries[i + 1]:
            return None
        name = self._func_name(i)
        if name is None:
            return None
        return GoFunc(name, self._entries[i], self._entries[i + 1], i)

    # --- per-function data ------------------------------------------------

    def _func(self, i: int) -> int | None:
        """Offset of function i's _func in pclntable, if it is consistent
        with the function table (a corrupt table must not name wrongly)."""
        off = self._funcoffs[i]
        if off + self._func_size > len(self.pclntable):
            return None
        if self.magic == GO116:
            entry = struct.unpack_from("<Q" if self.ptrsize == 8 else "<I",
                                       self.pclntable, off)[0]
        else:
            entry = struct.unpack_from("<I", self.pclntable, off)[0] + self.text_start
        return off if entry == self._entries[i] else None

    def _field(self, off: int, n: int) -> int:
        """The nth 4-byte field after the entry (1 = nameoff ... 8 = cuOffset)."""
        return struct.unpack_from("<I", self.pclntable, off + self._field0 + (n - 1) * 4)[0]

    def _func_name(self, i: int) -> str | None:
        off = self._func(i)
        if off is None:
            return None
        return self._name(self._field(off, 1))

    def _name(self, nameoff: int) -> str | None:
        name = self._names.get(nameoff)
        if name is None:
            name = _cstring(self.funcnametab, nameoff)
            self._names[nameoff] = name
        return name or None

    def sp_deltas(self, i: int) -> list:
        """(pc, SP delta) runs of function i, from its pcsp table: how far
        SP is below its value at the function's entry, from pc up to the
        next run's pc (or the function's end); [] when unreadable."""
        off = self._func(i)
        if off is None:
            return []
        table_off = self._field(off, 4)
        if table_off == 0 or table_off >= len(self.pctab):
            return []
        p, j, n = self.pctab, table_off, len(self.pctab)
        val, cur, end = -1, self._entries[i], self._entries[i + 1]
        out: list = []
        try:
            while j < n and cur < end:
                uv, j = uleb128(p, j)
                if uv == 0 and out:
                    break
                val += -((uv >> 1) + 1) if uv & 1 else uv >> 1
                delta, j = uleb128(p, j)
                out.append((cur, val))
                cur += delta * self.quantum
        except IndexError:
            return []
        return out

    def _pcvalue(self, table_off: int, entry: int, pc: int) -> int | None:
        """The value a pc-value table holds at pc: pairs of zig-zag varint
        value deltas and pc deltas (in quanta), starting at value -1."""
        if table_off == 0 or table_off >= len(self.pctab):
            return None
        p, i, n = self.pctab, table_off, len(self.pctab)
        val, cur, first = -1, entry, True
        while i < n:
            uv, i = uleb128(p, i)
            if uv == 0 and not first:
                return None
            first = False
            val += -((uv >> 1) + 1) if uv & 1 else uv >> 1
            delta, i = uleb128(p, i)
            cur += delta * self.quantum
            if pc < cur:
                return val
        return None

    def _file(self, off: int, fno: int) -> str | None:
        if fno < 0:
            return None
        cu = self._field(off, 8)
        at = (cu + fno) * 4
        if at + 4 > len(self.cutab):
            return None
        fileoff = struct.unpack_from("<I", self.cutab, at)[0]
        if fileoff == _NO_DATA:
            return None
        s = self._strings.get(fileoff)
        if s is None:
            s = self._strings[fileoff] = _cstring(self.filetab, fileoff)
        return s

    def source(self, pc: int) -> tuple:
        """(file, line) of pc, ('', 0) when unknown."""
        f = self.find(pc)
        if f is None:
            return "", 0
        off = self._func(f.index)
        return self._source(off, f.entry, pc)

    def _source(self, off: int, entry: int, pc: int) -> tuple:
        try:
            fno = self._pcvalue(self._field(off, 5), entry, pc)
            line = self._pcvalue(self._field(off, 6), entry, pc)
            file = self._file(off, fno) if fno is not None else None
        except (IndexError, struct.error):
            return "", 0
        if not file or line is None or line <= 0:
            return "", 0
        return file, line

    def frames(self, pc: int) -> list:
        """GoFrames at pc, innermost first: the calls inlined at pc (each
        with the position inside it), then the function that holds pc.
        Kept per pc: decoding the pc-value tables is most of a Go frame's
        cost with --lines/--inlines, and stacks repeat their pcs."""
        hit = self._frames.get(pc)
        if hit is None:
            if len(self._frames) >= _MAX_CACHED_PCS:
                self._frames.clear()
            hit = self._frames[pc] = tuple(self._decode_frames(pc))
        return list(hit)

    def _decode_frames(self, pc: int) -> list:
        f = self.find(pc)
        if f is None:
            return []
        off = self._func(f.index)
        out = []
        tree = self._inline_tree(off)
        for _ in range(_MAX_INLINE_DEPTH if tree is not None else 0):
            ix = self._pcdata(off, _PCDATA_INL_TREE_INDEX, f.entry, pc)
            call = tree(ix) if ix is not None and ix >= 0 else None
            if call is None:
                break
            name, parent_pc = call
            out.append(GoFrame(name, *self._source(off, f.entry, pc), inlined=True))
            if not f.entry + parent_pc < f.end:
                return [GoFrame(f.name, *self._source(off, f.entry, pc))]  # corrupt tree
            pc = f.entry + parent_pc
        out.append(GoFrame(f.name, *self._source(off, f.entry, pc)))
        return out

    # --- inline tree ------------------------------------------------------

    def _counts(self, off: int) -> tuple:
        npcdata = self._field(off, 7)
        nfuncdata = self.pclntable[off + self._func_size - 1]
        return npcdata, nfuncdata

    def _pcdata(self, off: int, table: int, entry: int, pc: int) -> int | None:
        npcdata, _ = self._counts(off)
        if table >= npcdata:
            return None
        at = off + self._func_size + table * 4
        if at + 4 > len(self.pclntable):
            return None
        try:
            return self._pcvalue(struct.unpack_from("<I", self.pclntable, at)[0], entry, pc)
        except (IndexError, struct.error):
            return None

    def _inline_tree(self, off: int):
        """A function ix -> (name, parentPc) | None over the function's
        inline tree, or None when it has none (or it cannot be read)."""
        if self.magic == GO116 or self._read is None:
            return None
        npcdata, nfuncdata = self._counts(off)
        if _FUNCDATA_INL_TREE >= nfuncdata:
            return None
        at = off + self._func_size + npcdata * 4 + _FUNCDATA_INL_TREE * 4
        if at + 4 > len(self.pclntable):
            return None
        fdoff = struct.unpack_from("<I", self.pclntable, at)[0]
        gofunc = self._go_func()
        if fdoff == _NO_DATA or gofunc is None:
            return None
        base = gofunc + fdoff
        size = 16 if self.magic == GO120 else 20

        def call(ix: int):
            raw = self._read(base + ix * size, size)
            if len(raw) < size:
                return None
            if self.magic == GO120:   # funcID, _[3], nameOff, parentPc, startLine
                nameoff, parent_pc = struct.unpack_from("<iI", raw, 4)
            else:                     # parent, funcID, _, file, line, func_, parentPc
                nameoff, parent_pc = struct.unpack_from("<iI", raw, 12)
            name = self._name(nameoff) if nameoff >= 0 else None
            return (name, parent_pc) if name else None
        return call

    def _go_func(self) -> int | None:
        """moduledata.gofunc: runtime.firstmoduledata is the word that points
        at this table and whose text field equals its textStart."""
        if self._gofunc_done:
            return self._gofunc
        self._gofunc_done = True
        find = getattr(self._read, "find_pointer", None)
        if find is None or self.ptrsize != 8:
            return None
        words = 40 if self.magic == GO120 else 38  # covctrs came in Go 1.20
        for md in find(self.addr):
            raw = self._read(md, (words + 1) * 8)
            if len(raw) < (words + 1) * 8:
                continue
            w = struct.unpack_from(f"<{words + 1}Q", raw)
            if (w[1] == self.addr + self._offsets["funcname"]
                    and w[22] == self.text_start and w[22] < w[23]):
                self._gofunc = w[words]
                return self._gofunc
        return None


def _cstring(buf, off: int) -> str | None:
    if off < 0 or off >= len(buf):
        return None
    chunk = bytes(buf[off:min(len(buf), off + 4096)])
    end = chunk.find(b"\0")
    if end < 0:
        return None
    try:
        return chunk[:end].decode("utf-8")
    except UnicodeDecodeError:
        return None


# --- finding the table in an ELF image ---------------------------------------

_HEADS = [struct.pack("<I", m) + b"\0\0\x01\x08" for m in _MAGICS]
_tables: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # image -> table


_R_X86_64_RELATIVE = 8
_RELA = struct.Struct("<QQq")            # Elf64_Rela: offset, info, addend
_TEXT_START_AT = 24                      # pcHeader: magic, pad, minLC, ptrSize, nfunc, nfiles


class _ImageReader:
    """Reads an ElfImage's bytes by virtual address, and finds the places
    in its writable segments that hold a given pointer (moduledata).

    Pointers in a PIE are relocated at load time: Go's own linker writes
    their link-time value into the file as well, but an external link (GNU
    ld, cgo) leaves 0 there and only the R_X86_64_RELATIVE relocation's
    addend says it. Reads see the addends, as the loaded process would
    (less its load bias)."""

    def __init__(self, image):
        self.image = image
        self._relocs: dict | None = None   # vaddr -> addend, read when needed
        self._reloc_at: list = []             # its keys, sorted

    def __call__(self, vaddr: int, size: int) -> bytes:
        try:
            data = self.image.read(vaddr, size)
        except UstackError:
            return b""
        at = self._reloc_at
        i = bisect.bisect_left(at, vaddr)
        if i == len(at) or at[i] >= vaddr + len(data):
            return data
        patched = bytearray(data)
        while i < len(at) and at[i] + 8 <= vaddr + len(data):
            struct.pack_into("<q", patched, at[i] - vaddr, self._relocs[at[i]])
            i += 1
        return bytes(patched)

    def _relative_relocations(self) -> dict:
        if self._relocs is None:
            self._relocs = {}
            for name in self.image.sections:
                if not name.startswith(".rela") or name == ".rela.plt":
                    continue
                try:
                    data = self.image.section_bytes(name) or b""
                except UstackError:
                    continue
                for offset, info, addend in _RELA.iter_unpack(
                        data[:len(data) - len(data) % _RELA.size]):
                    if info & 0xFFFFFFFF == _R_X86_64_RELATIVE:
                        self._relocs[offset] = addend
            self._reloc_at = sorted(self._relocs)
        return self._relocs

    def text_start(self, table: int) -> int | None:
        """The pcHeader's textStart as the loader relocates it, when a
        relocation says it: an external link's .text begins with C start-up
        code, so runtime.text (what the table's offsets count from) lies
        after the .text section's start."""
        return self._relative_relocations().get(table + _TEXT_START_AT)

    def find_pointer(self, value: int):
        needle = struct.pack("<Q", value)
        self._relative_relocations()          # from now on reads see them
        for vaddr, _off, size, writable in self.image.segments():
            if not writable:
                continue
            data = self(vaddr, size)
            at = data.find(needle)
            while at >= 0:
                if at % 8 == 0:
                    yield vaddr + at
                at = data.find(needle, at + 1)


def go_table(image) -> Pclntab | None:
    """The parsed .gopclntab of an ElfImage or its ElfFile (cached per
    file), or None when it is not a Go binary. Raises PclntabError when the
    table is there but corrupt."""
    image = getattr(image, "file", image)       # the image's file: one key
    hit = _tables.get(image)
    if hit is None:
        try:
            hit = _load(image)
        except PclntabError as e:
            hit = e
        _tables[image] = hit
    if isinstance(hit, PclntabError):
        raise hit
    return hit or None


def _load(image):
    if not image.is_go:
        return False
    read = _ImageReader(image)
    text = image.sections.get(".text")
    section_text = text[0] if text else None
    sec = image.sections.get(".gopclntab")
    if sec is not None:
        try:
            data = image.section_bytes(".gopclntab")
        except UstackError as e:
            raise PclntabError(str(e)) from None
        return Pclntab(data, sec[0], read, read.text_start(sec[0]) or section_text)
    # PIE and externally linked binaries keep the table inside .data.rel.ro
    # (runtime.pclntab): look for a header in the read-only data
    for vaddr, _off, size, _w in image.segments():
        if image.executable(vaddr):
            continue
        data = read(vaddr, size)
        for head in _HEADS:
            at = data.find(head)
            while at >= 0:
                if at % 8 == 0:
                    text_start = read.text_start(vaddr + at) or section_text
                    try:
                        table = Pclntab(data[at:], vaddr + at, read, text_start)
                        lo, hi = table.text_range
                        if image.executable(lo) and image.executable(hi - 1):
                            return table
                    except PclntabError:
                        pass
                at = data.find(head, at + 1)
    raise PclntabError(f"{image.path}: Go binary without a readable .gopclntab")

