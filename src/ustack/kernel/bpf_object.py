"""Loading a built BPF object (an ELF file clang made from C, see
src/ustack/bpf/): its programs, the maps it declares, its read-only data and
its BTF, without libbpf.

- A program is an ELF section of instructions named by its function
  (SEC("...") in C); functions it calls that clang kept apart (bpf-to-bpf
  calls, bpf_loop callbacks) live in .text: those it reaches are appended
  to the program and its calls pointed at the copy.
- Maps are the variables of section .maps, their type, key, value and
  size read from BTF (libbpf's __uint/__type declarations); a run may hand
  in maps it made already (shared with another object's programs) or size
  a declared one anew. An array of maps NAME is made from a template
  declared as the map NAME_inner.
- .rodata is one read-only ARRAY map per loaded program, filled before the
  load and frozen: the values known only at load time (a probe's index, a
  kernel struct's field offset) are constants to the verifier, which drops
  the code they switch off. .data and .bss are writable maps shared by the
  programs of a run.
- The object's BTF is loaded (BPF_BTF_LOAD) and each program gets its
  func_info and line_info from .BTF.ext: bpf_loop callbacks need them, and
  a refusal then shows the C source line in the verifier's log.

Python learns the layout of a structure the programs share with it from
the same BTF (layout()), so a C header is the one definition."""
from __future__ import annotations

import bisect
import functools
import os
import struct
from collections import namedtuple

from ..model import UstackError
from . import bpf_syscall
from .btf import Btf

_INSN = struct.Struct("<BBhi")
_LD_IMM64, _CALL = 0x18, 0x85
_PSEUDO_MAP_FD, _PSEUDO_MAP_VALUE, _PSEUDO_CALL, _PSEUDO_FUNC = 1, 2, 1, 4
_DATA_SECTIONS = (".rodata", ".data", ".bss")
# ELF64, little-endian: what an object clang made holds (a few struct
# reads: pyelftools would cost ~55 ms of start-up to import)
_EHDR = struct.Struct("<16xHHIQQQIHHHHHH")
_SHDR = struct.Struct("<IIQQQQIIQQ")  # name, type, flags, addr, offset, size, link, info, ...
_SYM = struct.Struct("<IBBHQQ")       # name, info, other, shndx, value, size
_REL = struct.Struct("<QQ")           # offset, info (symbol << 32 | type)
_U32 = struct.Struct("<I")
_SHT_SYMTAB, _SHT_NOBITS, _SHT_REL = 2, 8, 9
_STT_OBJECT, _STT_FUNC, _STT_SECTION = 1, 2, 3
_STB_GLOBAL = 1
Symbol = namedtuple("Symbol", "name type bind shndx value size")
Section = namedtuple("Section", "name type data size info")
_EXT_HDR = struct.Struct("<HBBIIIII")   # magic, version, flags, hdr_len, func/line off+len
_LOCAL_CALL = bytes((_CALL, _PSEUDO_CALL << 4))    # a bpf-to-bpf call's first two bytes
# a .text function in a program's copy: its first byte and size in .text,
# its first instruction in the copy
_Placed = namedtuple("_Placed", "start size at")

# section name (up to its first "/") -> (program type, expected attach type);
# "event" programs take their type from the probe they are loaded for
SECTION_TYPES = {
    "raw_tracepoint": (bpf_syscall.PROG_RAW_TRACEPOINT, 0),
    "raw_tp": (bpf_syscall.PROG_RAW_TRACEPOINT, 0),
    "kprobe": (bpf_syscall.PROG_KPROBE, 0),
    "uprobe": (bpf_syscall.PROG_KPROBE, 0),
    "uprobe.multi": (bpf_syscall.PROG_KPROBE, bpf_syscall.TRACE_UPROBE_MULTI),
    "tracepoint": (bpf_syscall.PROG_TRACEPOINT, 0),
    "perf_event": (bpf_syscall.PROG_PERF_EVENT, 0),
    "event": (None, 0),
}


class MapDef(namedtuple("MapDef", "map_type key_size value_size max_entries flags")):
    """A map as the object declares it."""


class Layout(namedtuple("Layout", "struct fields offsets")):
    """A C structure's layout: `struct` (a struct.Struct) unpacks its
    `fields` in order; `offsets`: field -> byte offset."""

    @property
    def size(self) -> int:
        return self.struct.size


class _Program:
    """A program: `code` starts at byte `start` of its section (a section
    may hold several)."""

    def __init__(self, name: str, section: str, code: bytes, shndx: int, start: int):
        self.name, self.section, self.code, self.shndx = name, section, code, shndx
        self.start = start

    def holds(self, offset: int) -> bool:
        return self.start <= offset < self.start + len(self.code)


class BpfObject:
    """One built object, parsed once (objects() caches them by path)."""

    def __init__(self, path: str):
        self.path = path
        with open(path, "rb") as f:
            self._parse(f.read())

    def _read_elf(self, blob: bytes) -> None:
        """self._sections and self._symbols from the ELF file's bytes."""
        if blob[:4] != b"\x7fELF" or blob[4] != 2 or blob[5] != 1:
            raise UstackError(f"{self.path}: not a little-endian ELF64 object")
        shoff = _EHDR.unpack_from(blob)[5]
        shnum, shstrndx = _EHDR.unpack_from(blob)[11], _EHDR.unpack_from(blob)[12]
        heads = [_SHDR.unpack_from(blob, shoff + i * _SHDR.size) for i in range(shnum)]
        names = blob[heads[shstrndx][4]:heads[shstrndx][4] + heads[shstrndx][5]]

        def name_at(table: bytes, off: int) -> str:
            return table[off:table.index(b"\0", off)].decode()

        self._sections = [Section(name_at(names, h[0]), h[1],
                                  b"" if h[1] == _SHT_NOBITS else blob[h[4]:h[4] + h[5]],
                                  h[5], h[7]) for h in heads]
        self._symbols = []
        for h in heads:
            if h[1] == _SHT_SYMTAB:
                strings = self._sections[h[6]].data
                # clang's local labels (LBB0_12: ~770 of unwind.bpf.o's ~860
                # symbols) are never looked up by name: left unnamed, as
                # naming them cost ~0.4 ms of every run's start
                self._symbols = [
                    Symbol("" if not info and n else name_at(strings, n), info & 0xF,
                           info >> 4, shndx, value, size)
                    for n, info, _other, shndx, value, size in _SYM.iter_unpack(
                        blob[h[4]:h[4] + h[5] - h[5] % _SYM.size])]

    def _parse(self, blob: bytes) -> None:
        self._read_elf(blob)
        sections = self._sections
        self._sec_names = [s.name for s in sections]
        self._sec_sizes = [s.size for s in sections]
        by_name = {s.name: s for s in sections}
        if ".BTF" not in by_name:
            raise UstackError(f"{self.path}: no BTF (build it with clang -g)")
        self._btf_blob = by_name[".BTF"].data
        self._fixed_btf = None                # _loadable_btf()
        self._btf_fd = -1                     # _btf()
        self.btf = Btf(self._btf_blob)
        self._ext = by_name[".BTF.ext"].data if ".BTF.ext" in by_name else b""
        self._ext_made: dict = {}             # (program, .text's place) -> _ext_info()
        self._data = {}                       # ".rodata" -> its initial bytes
        for name in _DATA_SECTIONS:
            sec = by_name.get(name)
            if sec is not None:
                self._data[name] = (bytes(sec.size) if sec.type == _SHT_NOBITS
                                    else sec.data)
        self._text_shndx = self._sec_names.index(".text") if ".text" in by_name else -1
        self._text = by_name[".text"].data if ".text" in by_name else b""
        self.programs: dict = {}
        for sym in self._symbols:
            if (sym.type == _STT_FUNC and sym.bind == _STB_GLOBAL
                    and 0 < sym.shndx < len(sections) and sym.shndx != self._text_shndx):
                sec = sections[sym.shndx]
                self.programs[sym.name] = _Program(
                    sym.name, sec.name, sec.data[sym.value:sym.value + sym.size],
                    sym.shndx, sym.value)
        # section index -> its relocation section, decoded when a program
        # there is first loaded (all of them: ~1.5 ms of a run's start)
        self._rel_sections = {sec.info: sec for sec in sections
                              if sec.type == _SHT_REL and sec.info < len(sections)}
        self._relocs_made: dict = {}
        self.maps = self._map_defs()

    def _relocs(self, shndx: int) -> list:
        """[(byte offset, symbol)] of section `shndx`'s relocations."""
        found = self._relocs_made.get(shndx)
        if found is None:
            sec = self._rel_sections.get(shndx)
            found = self._relocs_made[shndx] = [] if sec is None else [
                (off, self._symbols[info >> 32])
                for off, info in (_REL.unpack_from(sec.data, at)
                                  for at in range(0, len(sec.data), _REL.size))]
        return found

    # -- what the object declares -------------------------------------------
    def _map_defs(self) -> dict:
        out = {}
        sec = self.btf.by_kind_name.get((15, ".maps"))
        for var_type, _off, _size in (self.btf.extra.get(sec, []) if sec else []):
            name = self.btf.name(var_type)
            fields = {}
            for member, _at, mtype in self.btf.members_of(self.btf.kinds[var_type][2]):
                target = self.btf.kinds[mtype][2]          # the pointer's type
                if member in ("key", "value"):
                    fields[member + "_size"] = self.btf.size(target)
                else:                                      # int (*name)[N]
                    fields[member] = self.btf.extra[target][1]
            if fields["type"] == bpf_syscall.MAP_RINGBUF:
                # its __type(value, ...) names the record type (for BTF,
                # so for Python); the kernel wants no key or value size
                fields["key_size"] = fields["value_size"] = 0
            out[name] = MapDef(fields["type"], fields.get("key_size", 0),
                               fields.get("value_size", 0), fields.get("max_entries", 1),
                               fields.get("map_flags", 0))
        return out

    def layout(self, struct_name: str) -> Layout:
        """The layout of a struct the programs share with Python; a nested
        struct's members are its own, named "outer.inner"."""
        btf = self.btf
        fmt, fields, offsets, at = "<", [], {}, 0
        for name, off, mtype in _flat_members(btf, btf.by_name[struct_name]):
            size = btf.size(mtype)
            fmt += "x" * (off - at)
            fmt += _code(btf, mtype, size)
            fields.append(name)
            offsets[name] = off
            at = off + size
        total = btf.size(btf.by_name[struct_name])
        fmt += "x" * (total - at)
        return Layout(struct.Struct(fmt), tuple(fields), offsets)

    def enum(self, name: str) -> dict:
        """The values of a C enum, by name."""
        return self.btf.enum(name)

    # -- making maps and loading programs -----------------------------------
    def make_map(self, name: str, max_entries: int | None = None,
                 value_size: int | None = None, flags: int | None = None,
                 inner_map_fd: int = 0) -> bpf_syscall.Map:
        """The map `name` as declared, its size and flags changed if given.
        A map of maps is made with `inner_map_fd`, its inner maps'
        template; without one, with a template made (and closed) as the
        object declares `NAME_inner`."""
        d = self.maps[name]
        if d.map_type == bpf_syscall.MAP_ARRAY_OF_MAPS and not inner_map_fd:
            inner = self.make_map(name + "_inner")
            try:
                return self.make_map(name, max_entries, value_size, flags, inner.fd)
            finally:
                inner.close()
        return bpf_syscall.Map(d.map_type, d.key_size, value_size or d.value_size,
                       max_entries or d.max_entries, f"ustack_{name}"[:15],
                       flags=d.flags if flags is None else flags, inner_map_fd=inner_map_fd)

    def load(self, program: str, maps: dict, rodata: dict | None = None,
             prog_type: int | None = None, name: str = "",
             attach_type: int | None = None) -> int:
        """Load `program` and return its fd. `maps`: name -> bpf_syscall.Map for the
        maps it uses (.data and .bss by those names); one it uses and
        `maps` lacks is made as declared and added to `maps`, whose owner
        closes them all. `rodata`: values for .rodata's variables (the rest
        keep the C's initial values). `prog_type`: for an "event" program,
        the type of the event it is for; `attach_type`: what it will be
        attached by, where not its section's (TRACE_UPROBE_MULTI: links)."""
        prog = self.programs.get(program)
        if prog is None:
            raise UstackError(f"{os.path.basename(self.path)} has no BPF program {program}")
        ptype, section_attach = SECTION_TYPES.get(prog.section.split("/")[0], (None, 0))
        ptype = prog_type if prog_type is not None else ptype
        attach_type = section_attach if attach_type is None else attach_type
        if ptype is None:
            raise UstackError(f"BPF program {program} needs a program type")
        code, placed = self._linked(prog)
        ro = None
        try:
            code, ro = self._relocate(prog, code, placed, maps, rodata or {})
            func_info, line_info = self._ext_info(prog, placed)
            return bpf_syscall.load_with_btf(ptype, code, name or program, self._btf(),
                                     func_info, line_info, attach_type)
        finally:
            if ro is not None:
                ro.close()                  # the program holds its own reference

    def _btf(self) -> int:
        """The object's BTF in the kernel (its fd), loaded once a process:
        the kernel checks the unwinder's 6 ms a load, and a run loads a
        program per probe and a pass per runtime met. Kept open until the
        process ends (two threads loading at once may each load it: the
        later fd is kept, the other closes with the process)."""
        if self._btf_fd < 0:
            self._btf_fd = bpf_syscall.load_btf(self._loadable_btf())
        return self._btf_fd

    def _linked(self, prog: _Program) -> tuple:
        """The program's code with the .text functions it reaches (its
        calls and bpf_loop callbacks, and theirs) appended in .text's
        order, and where each went (a tuple of _Placed; () for none).
        Only those: the unwinder's .text holds every runtime's walk (~5,800
        of its ~7,400 instructions), which a program whose runtimes are
        switched off by .rodata never runs; the verifier removed them
        one by one (~1.5 ms a load), and the maps only they name were
        made for nothing."""
        edges = self._text_edges
        todo = [self._function_at(t) for t in self._text_targets(prog)]
        reached = set()
        while todo:
            f = todo.pop()
            if f is not None and f not in reached:
                reached.add(f)
                todo.extend(edges[f])
        code, placed = bytearray(prog.code), []
        for start, size in sorted(self._text_functions[f] for f in reached):
            placed.append(_Placed(start, size, len(code) // 8))
            code += self._text[start:start + size]
        return code, tuple(placed)

    @functools.cached_property
    def _text_functions(self) -> list:
        """(first byte, size) of each function in .text, in order."""
        return sorted((s.value, s.size) for s in self._symbols
                      if s.shndx == self._text_shndx and s.type == _STT_FUNC and s.size)

    @functools.cached_property
    def _text_starts(self) -> list:
        return [start for start, _size in self._text_functions]

    def _function_at(self, byte: int):
        """The index in _text_functions of the function starting at .text's
        `byte`, or None."""
        starts = self._text_starts
        i = bisect.bisect_left(starts, byte)
        return i if i < len(starts) and starts[i] == byte else None

    def _text_targets(self, prog: _Program) -> list:
        """The .text bytes the program's relocations point its calls and
        callbacks at."""
        return [self._text_target(sym, offset - prog.start, prog.code)
                for offset, sym in self._relocs(prog.shndx)
                if sym.shndx == self._text_shndx and prog.holds(offset)]

    def _text_target(self, sym: Symbol, at: int, code: bytes) -> int:
        """The .text byte a relocated call (imm: from the symbol, in
        instructions, less one) or callback address (imm: in bytes) at
        byte `at` of `code` points at."""
        opcode, _regs, _off, imm = _INSN.unpack_from(code, at)
        return sym.value + (imm + 1) * 8 if opcode == _CALL else sym.value + imm

    @functools.cached_property
    def _text_calls(self) -> list:
        """(byte, target byte) of each call inside .text that clang left
        unrelocated: pc-relative, within the section."""
        relocated = {offset for offset, _sym in self._relocs(self._text_shndx)}
        calls, text, at = [], self._text, self._text.find(_LOCAL_CALL)
        while at >= 0:
            if at % 8 == 0 and at not in relocated:
                imm = _INSN.unpack_from(text, at)[3]
                calls.append((at, at + (imm + 1) * 8))
            at = text.find(_LOCAL_CALL, at + 1)
        return calls

    @functools.cached_property
    def _text_edges(self) -> list:
        """Per .text function (as _text_functions), the functions it calls
        or takes a callback's address of."""
        edges = [set() for _ in self._text_functions]
        pairs = [(offset, self._text_target(sym, offset, self._text))
                 for offset, sym in self._relocs(self._text_shndx)
                 if sym.shndx == self._text_shndx]
        for at, target in pairs + self._text_calls:
            f, g = bisect.bisect_right(self._text_starts, at) - 1, self._function_at(target)
            if f >= 0 and g is not None:
                edges[f].add(g)
        return edges

    @staticmethod
    def _placed_at(placed: tuple, byte: int) -> int:
        """Where .text's `byte` is in the program's copy (placed: _linked's)."""
        for f in placed:
            if f.start <= byte < f.start + f.size:
                return f.at + (byte - f.start) // 8
        raise UstackError(f".text byte {byte} was not linked into the program")

    def _relocate(self, prog: _Program, code: bytearray, placed: tuple, maps: dict,
                  rodata: dict) -> tuple:
        ro = None
        relocs = [(-prog.start // 8, r) for r in self._relocs(prog.shndx)
                  if prog.holds(r[0])]
        text_relocs = self._relocs(self._text_shndx) if placed else []
        for f in placed:
            relocs += [(f.at - f.start // 8, r) for r in text_relocs
                       if f.start <= r[0] < f.start + f.size]
        for at, target in (self._text_calls if placed else []):
            if any(f.start <= at < f.start + f.size for f in placed):
                here = self._placed_at(placed, at)
                opcode, regs, off, _imm = _INSN.unpack_from(code, 8 * here)
                _INSN.pack_into(code, 8 * here, opcode, regs, off,
                                self._placed_at(placed, target) - here - 1)
        for base, (offset, sym) in relocs:
            at = base + offset // 8
            opcode, regs, off, imm = _INSN.unpack_from(code, 8 * at)
            target = self._sec_names[sym.shndx] if 0 < sym.shndx < len(self._sec_names) else ""
            if target == ".maps":
                m = maps.get(sym.name) or maps.setdefault(sym.name, self.make_map(sym.name))
                _INSN.pack_into(code, 8 * at, opcode, (regs & 0xF) | _PSEUDO_MAP_FD << 4,
                                off, m.fd)
            elif target in _DATA_SECTIONS:
                if target == ".rodata":
                    if ro is None:
                        ro = self._rodata_map(rodata)
                    m = ro
                else:
                    m = maps.get(target) or maps.setdefault(target, self._data_map(target))
                value_off = imm + (sym.value if sym.type != _STT_SECTION else 0)
                _INSN.pack_into(code, 8 * at, opcode, (regs & 0xF) | _PSEUDO_MAP_VALUE << 4,
                                off, m.fd)
                nxt = _INSN.unpack_from(code, 8 * at + 8)
                _INSN.pack_into(code, 8 * at + 8, nxt[0], nxt[1], nxt[2], value_off)
            elif target == ".text" and placed:
                dest = self._placed_at(placed, self._text_target(sym, 8 * at, code))
                if opcode != _CALL:   # ld_imm64 of a callback
                    regs = (regs & 0xF) | _PSEUDO_FUNC << 4
                _INSN.pack_into(code, 8 * at, opcode, regs, off, dest - at - 1)
            else:
                raise UstackError(f"{os.path.basename(self.path)}: {prog.name} refers to "
                                  f"{sym.name or target}, which the loader cannot place")
        return bytes(code), ro

    def _rodata_map(self, values: dict) -> bpf_syscall.Map:
        """.rodata with `values` set, frozen."""
        data = bytearray(self._data[".rodata"])
        variables = self._variables(".rodata")
        for name, value in values.items():
            if name not in variables:
                raise UstackError(f"{os.path.basename(self.path)} has no read-only "
                                  f"variable {name}")
            off, size, signed = variables[name]
            data[off:off + size] = int(value).to_bytes(size, "little", signed=signed)
        m = bpf_syscall.Map(bpf_syscall.MAP_ARRAY, 4, len(data), 1, "ustack.rodata",
                    flags=bpf_syscall.F_RDONLY_PROG)
        try:
            m.update(bytes(4), bytes(data))
            bpf_syscall.freeze(m)
        except BaseException:
            m.close()
            raise
        return m

    def _data_map(self, section: str) -> bpf_syscall.Map:
        m = bpf_syscall.Map(bpf_syscall.MAP_ARRAY, 4, len(self._data[section]), 1,
                            f"ustack{section}")
        if any(self._data[section]):
            m.update(bytes(4), self._data[section])
        return m

    def _variables(self, section: str) -> dict:
        """name -> (byte offset, size, signed) of a data section's variables,
        from the symbol table (clang leaves BTF's offsets at 0)."""
        shndx = self._sec_names.index(section)
        out = {}
        for sym in self._symbols:
            if sym.shndx == shndx and sym.type == _STT_OBJECT:
                out[sym.name] = (sym.value, sym.size, False)
        sec = self.btf.by_kind_name.get((15, section))
        for var_type, _off, _size in (self.btf.extra.get(sec, []) if sec else []):
            name = self.btf.name(var_type)
            if name in out:
                off, size, _s = out[name]
                out[name] = (off, size, bool(self.btf.int_signed(self.btf.kinds[var_type][2])))
        return out

    def _loadable_btf(self) -> bytes:
        """The object's BTF as the kernel takes it: clang leaves each data
        section's size and its variables' offsets at 0, the ELF file has them."""
        if self._fixed_btf is None:
            self._fixed_btf = self._fixed_datasecs()
        return self._fixed_btf

    def _fixed_datasecs(self) -> bytes:
        blob = bytearray(self._btf_blob)
        btf = self.btf
        for (kind, name), tid in btf.by_kind_name.items():
            if kind != 15 or name not in self._sec_names:
                continue
            at = btf.at[tid]
            shndx = self._sec_names.index(name)
            struct.pack_into("<I", blob, at + 8, self._sec_sizes[shndx])
            offsets = {s.name: s.value for s in self._symbols
                       if s.shndx == shndx and s.type == _STT_OBJECT}
            for i, (var_type, _off, var_size) in enumerate(btf.extra[tid]):
                struct.pack_into("<I", blob, at + 12 + 12 * i + 4,
                                 offsets.get(btf.name(var_type), 0))
        return bytes(blob)

    def _ext_info(self, prog: _Program, placed: tuple) -> tuple:
        """(func_info, line_info) records of the program and of the .text
        functions linked after it, offsets turned from bytes into
        instructions; made once per program and linking (a run loads one
        program per probe)."""
        key = (prog.name, placed)
        info = self._ext_made.get(key)
        if info is None:
            info = self._ext_made[key] = self._make_ext_info(prog, placed)
        return info

    def _make_ext_info(self, prog: _Program, placed: tuple) -> tuple:
        if not self._ext:
            return b"", b""
        _magic, _v, _f, hdr_len, f_off, f_len, l_off, l_len = _EXT_HDR.unpack_from(self._ext)
        # (section, first byte, end byte, instruction base) of each part
        parts = [(prog.section, prog.start, prog.start + len(prog.code), -prog.start // 8)]
        parts += [(".text", f.start, f.start + f.size, f.at - f.start // 8) for f in placed]
        out = []
        for off, length in ((f_off, f_len), (l_off, l_len)):
            blocks = self._ext_records(hdr_len + off, length)
            records = []            # one join: the unwinder has ~1,600 line records
            for section, first, end, base in parts:
                block = blocks.get(section)
                if block is None:
                    continue
                rec_size, data = block
                pack = _U32.pack
                for offset, rest in struct.iter_unpack(f"<I{rec_size - 4}s", data):
                    if first <= offset < end:
                        records.append(pack(offset // 8 + base))
                        records.append(rest)
            out.append(b"".join(records))
        return tuple(out)

    def _ext_records(self, start: int, length: int) -> dict:
        """section name -> (record size, its records' bytes), from one
        .BTF.ext info block."""
        if not length:
            return {}
        rec_size = struct.unpack_from("<I", self._ext, start)[0]
        pos, end, out = start + 4, start + length, {}
        while pos < end:
            name_off, count = struct.unpack_from("<II", self._ext, pos)
            pos += 8
            out[self.btf._str(name_off)] = (rec_size, self._ext[pos:pos + count * rec_size])
            pos += count * rec_size
        return out


def _flat_members(btf: Btf, type_id: int, prefix: str = "", base: int = 0) -> list:
    """(name, byte offset, type id) of a struct's members, those of the
    structs it holds in their place."""
    out = []
    for name, off, mtype in btf.members_of(btf._resolve(type_id)):
        if btf.kinds[btf._resolve(mtype)][0] == 4:          # a struct
            out += _flat_members(btf, mtype, f"{prefix}{name}.", base + off)
        else:
            out.append((prefix + name, base + off, mtype))
    return out


def _code(btf: Btf, type_id: int, size: int) -> str:
    """A struct format code for a member: integers by size and sign,
    arrays of integers repeated, anything else as bytes."""
    signed = btf.int_signed(type_id)
    if signed is not None or btf.kinds[btf._resolve(type_id)][0] == 2:
        code = {1: "b", 2: "h", 4: "i", 8: "q"}.get(size)
        if code is not None:
            return code if signed else code.upper()
    return f"{size}s"


_objects: dict = {}


def bpf_object(path: str) -> BpfObject:
    """The parsed object at `path` (once per process)."""
    obj = _objects.get(path)
    if obj is None:
        obj = _objects[path] = BpfObject(path)
    return obj
