"""A function's parameters from DWARF: names, C types, and where each one
lives at an address (a register, a stack slot, per location-list entry),
for arguments by name (probes.named_args) and `ustack list -v`.

The DWARF is the object's own or its separate debug file (found by
objfile.debuginfo, with a dwz alt file when it borrows DIEs from one).
Only the compilation unit holding the address is read (.debug_aranges
says which, else each unit's top DIE), and in it only the top-level DIEs
and the one function's children: pyelftools is slow on big files.

Location expressions are kept as plain (operation name, operands) tuples;
what a probe can make of them is probes.named_args's business. Each answer
is kept in the on-disk cache by file version and address: a warm lookup does
not open the DWARF (libc's write: ~0.4 s cold, mostly pyelftools reading
.debug_aranges and decompressing sections)."""
from __future__ import annotations

import bisect
import json
import os
import struct
import zlib

from . import cache as objcache
from . import content_key
from .debuginfo import debug_lookup, find_alt_file
from .dwarf_units import die_ranges, low_pc
from .elf import ElfImage
from ..model import UstackError
from ..values import as_dict, value

_VERSION = "v1"          # of the cached answers' layout
_CONTAINERS = ("DW_TAG_namespace", "DW_TAG_class_type", "DW_TAG_structure_type",
               "DW_TAG_union_type", "DW_TAG_module")
# qualifiers and aliases a value's meaning does not depend on
_TRANSPARENT = ("DW_TAG_typedef", "DW_TAG_const_type", "DW_TAG_volatile_type",
                "DW_TAG_restrict_type", "DW_TAG_atomic_type")
_CXX_LANGS = (0x4, 0x1A, 0x21, 0x2B)   # DW_LANG_C_plus_plus, _03, _11, _14
# DW_ATE_* -> kind; unsigned char (uint8_t) is a number, plain and signed
# char a character
_ATE_KINDS = {0x2: "bool", 0x4: "float", 0x5: "signed", 0x6: "char", 0x7: "unsigned",
              0x8: "unsigned", 0x10: "unsigned", 0x3: "float", 0x9: "float", 0xF: "float"}


class DamagedDwarf(UstackError):
    """The DWARF that describes a function does not parse: one line naming
    the file and what broke (the parameters are then unknown, not guessed)."""


def _damage() -> tuple:
    """What pyelftools raises on damaged DWARF: its own errors, and those
    of its unchecked reads: an unknown form or abbreviation code
    (KeyError), an address size it asserts (AssertionError), a seek past
    the file (ValueError), a compressed section that does not inflate
    (zlib.error), a truncated record (struct.error, IndexError, EOFError),
    a seek to a negative offset (OSError)."""
    from elftools.common.exceptions import DWARFError, ELFError
    return (ELFError, DWARFError, KeyError, IndexError, AssertionError, ValueError,
            struct.error, zlib.error, EOFError, OverflowError, UnicodeDecodeError, OSError)


def _why(e: Exception) -> str:
    text = str(e).splitlines()[0] if str(e) else ""
    return f"{type(e).__name__}: {text}"[:200] if text else type(e).__name__


@value
class CType:
    """A parameter's type: `name` as bpftrace -lv spells it ('const char*',
    'struct pair*', 'short int'); `kind` what its value is once typedefs and
    qualifiers are followed: signed | unsigned | bool | char | enum |
    pointer | float | struct | array | void | other; `size` in bytes;
    `pointee`: for a pointer, the kind of what it points to."""
    name: str
    kind: str
    size: int
    pointee: str = ""


@value
class Param:
    """One formal parameter. `locations`: ((lo, hi, ops), …), the operations
    valid for lo <= pc < hi (lo None: everywhere); () when DWARF gives none."""
    name: str
    type: CType
    locations: tuple
    artificial: bool = False   # C++'s implicit `this`
    output: bool = False       # Go's result parameters (~r0, …)

    def ops_at(self, vaddr: int) -> tuple | None:
        """The location expression at vaddr, or None (optimized out there)."""
        for lo, hi, ops in self.locations:
            if lo is None or lo <= vaddr < hi:
                return ops
        return None


@value
class FunctionInfo:
    name: str
    low: int
    high: int
    returns: CType | None   # None: void, or DWARF does not say
    params: tuple              # of Param, in declaration order
    frame_base: tuple          # ops of DW_AT_frame_base (() when absent)


class DwarfParams:
    """The functions of one ELF file with DWARF. Use for_image()."""

    _memo: dict = {}

    @classmethod
    def for_image(cls, image: ElfImage) -> "DwarfParams" | None:
        """For `image` (its own DWARF, else its separate debug file's);
        None when neither has .debug_info."""
        try:
            key = objcache.memo_key(os.stat(image.path))   # a rebuilt file is new
        except OSError:
            return None
        if key not in cls._memo:
            source = image if _has_info(image) else None
            if source is None:
                debug = debug_lookup(image)[0]
                source = debug if debug is not None and _has_info(debug) else None
            cls._memo[key] = cls(source) if source is not None else None
        return cls._memo[key]

    def __init__(self, image: ElfImage):
        self.path = image.path
        self._image = image
        self._dwarf = None
        self._files: list = []
        self._index: tuple | None = None      # (starts, ends, unit offsets)
        self._functions: dict = {}               # unit offset -> [(lo, hi, DIE)]
        self._answers: dict = {}                 # vaddr -> FunctionInfo or None
        self._damaged: dict = {}                 # where the DWARF broke -> DamagedDwarf
        self._lists: _LocationLists | None = None
        self._alt_path = None
        # answers that lack the names of a missing dwz alt file are not kept
        self._store = ".gnu_debugaltlink" not in image.file.section_names
        if not self._store:
            self._alt_path = find_alt_file(image).path
            self._store = self._alt_path is not None

    def function_at(self, vaddr: int) -> FunctionInfo | None:
        """The out-of-line function whose code holds vaddr, or None;
        DamagedDwarf when the DWARF that would say does not parse."""
        if vaddr not in self._answers:
            self._answers[vaddr] = self._cached(vaddr)
        return self._answers[vaddr]

    def _cached(self, vaddr: int) -> FunctionInfo | None:
        try:
            key = content_key.of_dwarf(os.stat(self.path), self._alt_path)
            cache = objcache.cache_file("params", key, f"{_VERSION}.{vaddr:x}.json")
        except OSError:
            return self._function_at(vaddr)
        blob = objcache.read(cache)
        if blob:
            try:
                return _from_json(json.loads(blob))
            except (ValueError, TypeError, KeyError, IndexError):
                pass                              # damaged: found again
        info = self._function_at(vaddr)
        if self._store:
            objcache.write(cache, json.dumps(as_dict(info) if info else None).encode())
        return info

    # --- finding the DIE ------------------------------------------------------

    def _function_at(self, vaddr: int) -> FunctionInfo | None:
        # each part read once: where it broke is remembered (the file as a
        # whole, a unit, a function), so `list -v` of a damaged file does
        # not parse the same bytes again for each of its functions
        dwarf = self._parsed("file", self._open)
        if self._lists is None:
            self._lists = _LocationLists(dwarf)
        if self._index is None:
            self._index = self._parsed("file", self._unit_index, dwarf)
        starts, ends, offsets = self._index
        units = [offsets[i] for i in range(bisect.bisect_right(starts, vaddr))
                 if vaddr < ends[i]]
        for off in dict.fromkeys(reversed(units)):
            cu = self._parsed(off, dwarf.get_CU_at, off)
            if off not in self._functions:
                self._functions[off] = self._parsed(off, _unit_functions, dwarf, cu)
            for lo, hi, die in self._functions[off]:
                if lo <= vaddr < hi:
                    return self._parsed((off, lo), _function_info, self._lists, cu,
                                        die, lo, hi)
        return None

    def _parsed(self, where, read, *args):
        """read(*args), pyelftools' failures on damaged DWARF turned into
        DamagedDwarf (kept for `where`, and for the file when it opens)."""
        known = self._damaged.get(where) or self._damaged.get("file")
        if known is not None:
            raise known
        try:
            return read(*args)
        except _damage() as e:
            error = self._damaged[where] = DamagedDwarf(
                f"{self.path}: its DWARF is damaged ({_why(e)}): "
                "parameters cannot be read from it")
            raise error from None

    def _unit_index(self, dwarf) -> tuple:
        rows = []
        if dwarf.debug_aranges_sec is not None:
            rows = [(e.begin_addr, e.begin_addr + e.length, e.info_offset)
                    for e in dwarf.get_aranges().entries if e.length]
        if not rows:
            for cu in dwarf.iter_CUs():
                top = cu.get_top_DIE()
                rows += [(lo, hi, cu.cu_offset)
                         for lo, hi in die_ranges(top, dwarf, cu, low_pc(top))]
        rows.sort()
        return [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows]

    def _open(self):
        if self._dwarf is None:
            from elftools.elf.elffile import ELFFile   # loaded on first use
            _within_file(self._image)
            self._files.append(open(self.path, "rb"))
            self._dwarf = ELFFile(self._files[0]).get_dwarf_info(follow_links=False)
            if self._alt_path is not None:
                self._files.append(open(self._alt_path, "rb"))
                self._dwarf.supplementary_dwarfinfo = ELFFile(
                    self._files[-1]).get_dwarf_info(follow_links=False)
        return self._dwarf


def _within_file(image: ElfImage) -> None:
    """ValueError when a DWARF section's header says it runs past the end of
    the file: pyelftools reads a section whole, into a buffer of the size
    the header says (2**62 bytes: a MemoryError)."""
    size = os.stat(image.path).st_size
    for name, (_addr, offset, length) in image.file.sections.items():
        if name.startswith((".debug_", ".zdebug_")) and offset + length > size:
            raise ValueError(f"{name} runs past the end of the file")


def _from_json(d) -> FunctionInfo | None:
    """A FunctionInfo as json.dumps(as_dict(…)) wrote it (lists back to tuples)."""
    if d is None:
        return None

    def tup(x):
        return tuple(tup(i) for i in x) if isinstance(x, list) else x
    params = tuple(Param(p["name"], CType(**p["type"]), tup(p["locations"]),
                         p["artificial"], p["output"]) for p in d["params"])
    return FunctionInfo(d["name"], d["low"], d["high"],
                        CType(**d["returns"]) if d["returns"] else None, params,
                        tup(d["frame_base"]))


def _has_info(image: ElfImage) -> bool:
    return bool({".debug_info", ".zdebug_info"} & image.file.section_names)


def _unit_functions(dwarf, cu) -> list:
    top = cu.get_top_DIE()
    found: list = []
    _subprograms(dwarf, cu, top, low_pc(top), found)
    return found


def _subprograms(dwarf, cu, die, base, out: list) -> None:
    """(lo, hi, DIE) of the functions with code at the top of a unit (and
    in its namespaces and classes); nested scopes are not searched."""
    for child in die.iter_children():
        if child.tag == "DW_TAG_subprogram":
            out.extend((lo, hi, child) for lo, hi in die_ranges(child, dwarf, cu, base))
        elif child.tag in _CONTAINERS:
            _subprograms(dwarf, cu, child, base, out)


# --- reading one function ---------------------------------------------------

def _function_info(lists: _LocationLists, cu, die, lo: int, hi: int) -> FunctionInfo:
    cxx = cu.get_top_DIE().attributes.get("DW_AT_language")
    namer = _TypeNamer(cxx is not None and cxx.value in _CXX_LANGS)
    origin = _origin(die)
    rtype = _attr_die(origin, "DW_AT_type") or _attr_die(die, "DW_AT_type")
    base = low_pc(cu.get_top_DIE())
    params = []
    concrete = [c for c in die.iter_children() if c.tag == "DW_TAG_formal_parameter"]
    if "DW_AT_abstract_origin" in die.attributes:
        # an out-of-line copy of an inline function: names and types are in
        # the abstract DIE, locations in the concrete one (if it kept them)
        by_origin = {}
        for c in concrete:
            ref = _attr_die(c, "DW_AT_abstract_origin")
            if ref is not None:
                by_origin[ref.offset] = c
        for a in origin.iter_children():
            if a.tag == "DW_TAG_formal_parameter":
                params.append(_param(lists, cu, base, a, by_origin.get(a.offset), namer))
    else:
        params = [_param(lists, cu, base, c, c, namer) for c in concrete]
    fb = die.attributes.get("DW_AT_frame_base")
    frame_base = _expr(lists.dwarf, fb.value) if fb is not None and isinstance(fb.value, list) else ()
    return FunctionInfo(_name(die), lo, hi, namer.type(rtype) if rtype is not None else None,
                        tuple(params), frame_base)


def _param(lists: _LocationLists, cu, base, decl, concrete, namer) -> Param:
    src = _origin(decl)
    tdie = _attr_die(src, "DW_AT_type")
    a = src.attributes
    return Param(name=_text(a.get("DW_AT_name")),
                 type=namer.type(tdie) if tdie is not None else CType("void", "void", 0),
                 locations=_locations(lists, cu, base, concrete) if concrete is not None else (),
                 artificial=bool(a.get("DW_AT_artificial") and a["DW_AT_artificial"].value),
                 output=bool(a.get("DW_AT_variable_parameter")
                             and a["DW_AT_variable_parameter"].value))


class _LocationLists:
    """The file's location lists, read by pyelftools. One found damaged
    marks them all so: pyelftools reads a damaged entry's expression a
    byte at a time up to the section's end (~0.2 s each), which for each
    function of `list -v` took minutes."""

    def __init__(self, dwarf):
        self.dwarf = dwarf
        self.damage: Exception | None = None

    def parse(self, attr, version: int, die):
        from elftools.dwarf.locationlists import LocationParser
        if self.damage is not None:
            raise self.damage
        try:
            return LocationParser(self.dwarf.location_lists()).parse_from_attribute(
                attr, version, die=die)
        except (ValueError, KeyError, AttributeError):
            return None                          # an empty or unknown form
        except _damage() as e:
            self.damage = e
            raise


def _locations(lists: _LocationLists, cu, base, die) -> tuple:
    attr = die.attributes.get("DW_AT_location")
    if attr is None:
        return ()
    from elftools.dwarf.locationlists import BaseAddressEntry, LocationEntry
    loc = lists.parse(attr, cu["version"], die)
    if loc is None:
        return ()
    dwarf = lists.dwarf
    if not isinstance(loc, list):
        return ((None, None, _expr(dwarf, loc.loc_expr)),)
    out = []
    for entry in loc:
        if isinstance(entry, BaseAddressEntry):
            base = entry.base_address
        elif isinstance(entry, LocationEntry):
            lo, hi = entry.begin_offset, entry.end_offset
            if not entry.is_absolute:
                lo, hi = base + lo, base + hi
            out.append((lo, hi, _expr(dwarf, entry.loc_expr)))
    return tuple(out)


def _expr(dwarf, raw) -> tuple:
    """((operation name, operands), …); DW_OP_entry_value's operand is the
    nested expression, itself such a tuple."""
    from elftools.dwarf.dwarf_expr import DWARFExprParser
    parser = DWARFExprParser(dwarf.structs)

    def plain(ops):
        return tuple((op.op_name, tuple(plain(a) if isinstance(a, list) else a
                                        for a in op.args)) for op in ops)
    try:
        return plain(parser.parse_expr(raw))
    except Exception:       # pyelftools raises many kinds on unknown operations
        return (("DW_OP_unknown", ()),)


# --- types --------------------------------------------------------------------

class _TypeNamer:
    """CTypes of type DIEs, spelled the way bpftrace -lv spells them."""

    def __init__(self, cxx: bool):
        self.cxx = cxx

    def type(self, die) -> CType:
        real = die
        for _ in range(16):
            if real is None or real.tag not in _TRANSPARENT:
                break
            real = _attr_die(real, "DW_AT_type")
        kind, size, pointee = self._kind(real)
        return CType(self.spell(die), kind, size, pointee)

    def _kind(self, die) -> tuple:
        if die is None:
            return "void", 0, ""
        size = _int(die, "DW_AT_byte_size")
        tag = die.tag
        if tag == "DW_TAG_base_type":
            return _ATE_KINDS.get(_int(die, "DW_AT_encoding"), "other"), size, ""
        if tag == "DW_TAG_enumeration_type":
            return "enum", size, ""
        if tag in ("DW_TAG_pointer_type", "DW_TAG_reference_type",
                   "DW_TAG_rvalue_reference_type", "DW_TAG_ptr_to_member_type"):
            target = _attr_die(die, "DW_AT_type")
            return "pointer", size or 8, self._kind(_strip(target))[0] if target else "void"
        if tag in ("DW_TAG_structure_type", "DW_TAG_class_type", "DW_TAG_union_type"):
            return "struct", size, ""
        if tag == "DW_TAG_array_type":
            return "array", size, ""
        if tag == "DW_TAG_unspecified_type":      # C++'s decltype(nullptr)
            return "pointer", size or 8, "void"
        return "other", size, ""

    def spell(self, die, depth: int = 0) -> str:
        if die is None:
            return "void"
        if depth > 16:
            return "?"
        tag = die.tag
        name = _text(die.attributes.get("DW_AT_name"))
        target = _attr_die(die, "DW_AT_type")
        if tag in ("DW_TAG_base_type", "DW_TAG_typedef", "DW_TAG_unspecified_type"):
            return name or "?"
        if tag in ("DW_TAG_pointer_type", "DW_TAG_reference_type",
                   "DW_TAG_rvalue_reference_type"):
            if name:                               # Go names its pointer types
                return name
            mark = {"DW_TAG_pointer_type": "*", "DW_TAG_reference_type": "&"}.get(tag, "&&")
            return self.spell(target, depth + 1) + mark
        if tag in ("DW_TAG_const_type", "DW_TAG_volatile_type"):
            word = "const" if tag == "DW_TAG_const_type" else "volatile"
            inner = self.spell(target, depth + 1)
            if target is not None and target.tag == "DW_TAG_pointer_type":
                return f"{inner} {word}"           # the pointer itself is const
            return f"{word} {inner}"
        if tag in ("DW_TAG_restrict_type", "DW_TAG_atomic_type"):
            return self.spell(target, depth + 1)
        if tag in ("DW_TAG_structure_type", "DW_TAG_union_type", "DW_TAG_class_type",
                   "DW_TAG_enumeration_type"):
            word = {"DW_TAG_structure_type": "struct", "DW_TAG_union_type": "union",
                    "DW_TAG_class_type": "class", "DW_TAG_enumeration_type": "enum"}[tag]
            if self.cxx:
                return _qualified(die) or f"({word} <anonymous>)"
            return f"{word} {name}" if name else word
        if tag == "DW_TAG_array_type":
            return self.spell(target, depth + 1) + "[]"
        if tag == "DW_TAG_subroutine_type":
            return self.spell(target, depth + 1) + "(*)()"
        return name or "?"


def _strip(die):
    for _ in range(16):
        if die is None or die.tag not in _TRANSPARENT:
            return die
        die = _attr_die(die, "DW_AT_type")
    return die


def _qualified(die) -> str:
    """ns::Class for a C++ type DIE (its parents' names)."""
    parts = []
    while die is not None and die.tag != "DW_TAG_compile_unit":
        name = _text(die.attributes.get("DW_AT_name"))
        if name:
            parts.append(name)
        die = die.get_parent()
    return "::".join(reversed(parts))


# --- attributes ---------------------------------------------------------------

def _origin(die):
    """The DIE that holds a DIE's name and type: through
    DW_AT_abstract_origin and DW_AT_specification."""
    for _ in range(8):
        ref = next((r for r in ("DW_AT_abstract_origin", "DW_AT_specification")
                    if r in die.attributes), None)
        if ref is None:
            return die
        nxt = _attr_die(die, ref)
        if nxt is None:
            return die
        die = nxt
    return die


def _name(die) -> str:
    for _ in range(8):
        a = die.attributes
        if "DW_AT_name" in a:
            return _text(a["DW_AT_name"])
        nxt = _origin(die)
        if nxt is die:
            return ""
        die = nxt
    return ""


def _attr_die(die, attr: str):
    if attr not in die.attributes:
        return None
    try:
        return die.get_DIE_from_attribute(attr)
    except Exception:          # into a dwz alt file that is missing, or corrupt
        return None


def _int(die, attr: str) -> int:
    a = die.attributes.get(attr)
    return a.value if a is not None and isinstance(a.value, int) else 0


def _text(attr) -> str:
    if attr is None or not isinstance(attr.value, (str, bytes)):
        return ""
    return os.fsdecode(attr.value) if isinstance(attr.value, bytes) else attr.value
