"""file:line and inlined calls at an address, from an ELF file's DWARF
(.debug_line, and DW_TAG_inlined_subroutine in .debug_info), as
`eu-addr2line -i -f` gives them, through pyelftools: the way for what a
SymCache (objfile.symcache) does not cover — see objfile.dwarf_lines.

pyelftools needs ~17 s for all of libc's debug file, so nothing is parsed up
front: .debug_aranges (or, without it, each unit's top DIE) says which
compilation unit holds an address, and only that unit's line program and
DIE tree are read — tens of ms. Each unit's compact table, and the unit
index, are kept in the on-disk cache by file version: a warm lookup does not
open the DWARF at all."""
from __future__ import annotations

import bisect
import json
import os

from . import cache as objcache
from . import content_key
from .source_loc import SourceLoc

_VERSION = "v1"          # of the cached table layout
_MAX_UNITS = 512         # unit tables kept in memory
# DIEs whose children may hold code scopes; everything else is skipped.
_CONTAINERS = ("DW_TAG_lexical_block", "DW_TAG_namespace", "DW_TAG_class_type",
               "DW_TAG_structure_type", "DW_TAG_union_type", "DW_TAG_module")
_SCOPES = ("DW_TAG_subprogram", "DW_TAG_inlined_subroutine")
_ADDR_FORMS = ("DW_FORM_addr", "DW_FORM_addrx", "DW_FORM_addrx1", "DW_FORM_addrx2",
               "DW_FORM_addrx3", "DW_FORM_addrx4")


class DwarfUnits:
    """The source locations of one ELF file with DWARF, unit by unit."""

    parsed_units = 0     # units read from DWARF in this process (tests, bench)

    def __init__(self, path: str, st: os.stat_result,
                 alt_path: str | None = None, store: bool = True):
        """`alt_path`: the dwz alt file the DWARF borrows names and DIEs from
        (objfile.debuginfo.find_alt_file), when it has one. `store`: keep the
        tables in the disk cache (not when they lack the names of a missing
        alt file: once it is installed, they would be wrong)."""
        self.path = path
        self._alt_path = alt_path
        self._store = store
        self._st = st
        self._dwarf = None            # opened on the first cache miss
        self._file = None
        self._index: tuple | None = None   # (starts, ends, unit offsets)
        self._units: dict = {}        # unit offset -> _Unit
        self.errors: list = []        # why some units gave nothing (corrupt DWARF)

    # --- queries ----------------------------------------------------------

    def locate(self, vaddr: int) -> tuple:
        """SourceLocs at vaddr, innermost inlined call first and the real
        function last; () when DWARF says nothing about vaddr."""
        unit = self._unit_at(vaddr)
        return unit.locate(vaddr) if unit is not None else ()

    # --- units -------------------------------------------------------------

    def _cache(self, name: str) -> str:
        return objcache.cache_file("lines", content_key.of_dwarf(self._st, self._alt_path),
                                   f"{_VERSION}.{name}.json")

    def _unit_at(self, vaddr: int):
        if self._index is None:
            self._index = self._load_index()
        starts, ends, offsets = self._index
        i = bisect.bisect_right(starts, vaddr) - 1
        if i < 0 or vaddr >= ends[i]:
            return None
        off = offsets[i]
        unit = self._units.get(off)
        if unit is None:
            if len(self._units) >= _MAX_UNITS:
                self._units.clear()
            unit = self._units[off] = self._load_unit(off)
        return unit

    def _load_index(self) -> tuple:
        cache = self._cache("units")
        blob = objcache.read(cache)
        if blob:
            try:
                rows = json.loads(blob)
                return ([r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows])
            except (ValueError, TypeError, IndexError):
                pass                    # corrupt: rebuilt
        rows = []
        try:
            rows = sorted(self._unit_ranges())
        except Exception as e:          # pyelftools raises many types on bad DWARF
            self.errors.append(f"{self.path}: corrupt DWARF: {_why(e)}")
        if self._store:
            objcache.write(cache, json.dumps(rows).encode())
        return ([r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows])

    def _unit_ranges(self) -> list:
        """(lo, hi, unit offset) for every unit: .debug_aranges when present
        (nothing else to read), else each unit's top DIE."""
        dwarf = self._open()
        if dwarf.debug_aranges_sec is not None:
            aranges = dwarf.get_aranges()
            rows = [(e.begin_addr, e.begin_addr + e.length, e.info_offset)
                    for e in aranges.entries if e.length]
            if rows:
                return rows
        rows = []
        for cu in dwarf.iter_CUs():
            top = cu.get_top_DIE()
            for lo, hi in die_ranges(top, dwarf, cu, low_pc(top)):
                rows.append((lo, hi, cu.cu_offset))
        return rows

    def _load_unit(self, offset: int) -> "_Unit":
        cache = self._cache(f"{offset:x}")
        blob = objcache.read(cache)
        if blob:
            try:
                return _Unit.from_json(json.loads(blob))
            except (ValueError, TypeError, KeyError, IndexError):
                pass
        try:
            unit = _Unit.parse(self._open(), offset)
            DwarfUnits.parsed_units += 1
        except Exception as e:
            self.errors.append(f"{self.path}: corrupt DWARF in unit 0x{offset:x}: {_why(e)}")
            return _Unit([], [], [], [], [])
        if self._store:
            objcache.write(cache, json.dumps(unit.to_json()).encode())
        return unit

    def _open(self):
        if self._dwarf is None:
            # imported here: most runs never come this way (~25 ms)
            from elftools.elf.elffile import ELFFile
            self._file = open(self.path, "rb")
            # no stream loader: pyelftools must not follow debuglinks itself
            self._dwarf = ELFFile(self._file).get_dwarf_info(follow_links=False)
            if self._alt_path is not None:
                # pyelftools resolves DW_FORM_GNU_strp_alt/ref_alt through this
                self._alt_file = open(self._alt_path, "rb")
                self._dwarf.supplementary_dwarfinfo = ELFFile(
                    self._alt_file).get_dwarf_info(follow_links=False)
        return self._dwarf


class _Unit:
    """One compilation unit's line rows and code scopes, in plain lists."""

    def __init__(self, files, rows_addr, rows_file_line, scopes, names):
        self.files = files                  # resolved source paths
        self.addrs = rows_addr              # sorted row addresses
        self.rows = rows_file_line          # [file index, line]; line 0 ends a sequence
        self.scopes = scopes                # [lo, hi, depth, name index, call file, call line]
        self.names = names

    def to_json(self):
        return {"files": self.files, "addrs": self.addrs, "rows": self.rows,
                "scopes": self.scopes, "names": self.names}

    @classmethod
    def from_json(cls, d):
        return cls(d["files"], d["addrs"], d["rows"], d["scopes"], d["names"])

    def _file(self, index: int) -> str:
        return self.files[index] if 0 <= index < len(self.files) else ""

    def locate(self, vaddr: int) -> tuple:
        i = bisect.bisect_right(self.addrs, vaddr) - 1
        if i >= 0 and self.rows[i][1] > 0:
            file, line = self._file(self.rows[i][0]), self.rows[i][1]
        else:
            file, line = "", 0
        # one scope a depth: gas gives each alias of an assembly function
        # a subprogram of its own; the first, as for eu-addr2line, names it
        by_depth: dict = {}
        for s in self.scopes:
            if s[0] <= vaddr < s[1] and s[2] not in by_depth:
                by_depth[s[2]] = s
        chain = [by_depth[d] for d in sorted(by_depth, reverse=True)]  # innermost first
        if not chain:
            return (SourceLoc("", file, line),) if line else ()
        out = []
        for scope in chain:
            out.append(SourceLoc(self.names[scope[3]], file, line))
            # the next (enclosing) scope is at the line that made this call
            file, line = self._file(scope[4]), scope[5]
        return tuple(out)

    # --- parsing ------------------------------------------------------------

    @classmethod
    def parse(cls, dwarf, offset: int) -> "_Unit":
        cu = dwarf.get_CU_at(offset)
        top = cu.get_top_DIE()
        program = dwarf.line_program_for_CU(cu)
        files, addrs, rows = [], [], []
        shift = 0
        if program is not None:
            header = program.header
            v5 = header["version"] >= 5
            shift = 0 if v5 else 1          # DWARF 5 numbers files from 0
            comp_dir = _text(top.attributes.get("DW_AT_comp_dir"))
            dirs = [_str(d) for d in header["include_directory"]]
            for entry in header["file_entry"]:
                d = entry.dir_index
                if v5:
                    directory = dirs[d] if d < len(dirs) else ""
                else:
                    directory = comp_dir if d == 0 else (dirs[d - 1] if d <= len(dirs) else "")
                path = os.path.join(directory, _str(entry.name))
                if not os.path.isabs(path) and comp_dir:
                    path = os.path.join(comp_dir, path)
                files.append(path)
            seq = []
            for entry in program.get_entries():
                state = entry.state
                if state is None:
                    continue
                # an end_sequence row (line 0) marks where the sequence stops
                seq.append((state.address, not state.end_sequence,
                            state.file - shift, 0 if state.end_sequence else state.line))
            # sequences may come in any order; a new one may start where
            # another ended: sort by address, the end row first (stable sort
            # keeps rows of one address in program order)
            seq.sort(key=lambda r: (r[0], r[1]))
            addrs = [r[0] for r in seq]
            rows = [[r[2], r[3]] for r in seq]
        scopes, names = [], []
        name_index: dict = {}
        _collect(dwarf, cu, top, low_pc(top), 0, shift, scopes, names, name_index)
        return cls(files, addrs, rows, scopes, names)


def _collect(dwarf, cu, die, base, depth, shift, scopes, names, name_index) -> None:
    """Code scopes (functions, inlined calls) under `die`, with their depth."""
    for child in die.iter_children():
        tag = child.tag
        if tag in _SCOPES:
            ranges = die_ranges(child, dwarf, cu, base)
            if not ranges:
                continue        # a declaration or abstract instance: no code
            name = _scope_name(child)
            if name not in name_index:
                name_index[name] = len(names)
                names.append(name)
            a = child.attributes
            call_file = a["DW_AT_call_file"].value - shift if "DW_AT_call_file" in a else -1
            call_line = a["DW_AT_call_line"].value if "DW_AT_call_line" in a else 0
            for lo, hi in ranges:
                scopes.append([lo, hi, depth, name_index[name], call_file, call_line])
            _collect(dwarf, cu, child, base, depth + 1, shift, scopes, names, name_index)
        elif tag in _CONTAINERS:
            _collect(dwarf, cu, child, base, depth, shift, scopes, names, name_index)


def _scope_name(die) -> str:
    """The linkage name through DW_AT_abstract_origin / DW_AT_specification
    if any DIE on the way has one (what eu-addr2line prints), else the name."""
    name = ""
    for _ in range(8):
        a = die.attributes
        for attr in ("DW_AT_linkage_name", "DW_AT_MIPS_linkage_name"):
            if attr in a:
                return _text(a[attr])
        if not name and "DW_AT_name" in a:
            name = _text(a["DW_AT_name"])
        ref = next((r for r in ("DW_AT_abstract_origin", "DW_AT_specification")
                    if r in a), None)
        if ref is None:
            break
        try:
            die = die.get_DIE_from_attribute(ref)
        except NotImplementedError:     # into a dwz alt file that is missing
            break
    return name


def low_pc(die) -> int:
    attr = die.attributes.get("DW_AT_low_pc")
    return attr.value if attr is not None else 0


def die_ranges(die, dwarf, cu, base) -> list:
    """[(lo, hi)] of a DIE's code: low_pc/high_pc or DW_AT_ranges."""
    a = die.attributes
    if "DW_AT_low_pc" in a and "DW_AT_high_pc" in a:
        lo = a["DW_AT_low_pc"].value
        high = a["DW_AT_high_pc"]
        hi = high.value if high.form in _ADDR_FORMS else lo + high.value
        return [(lo, hi)] if hi > lo else []
    if "DW_AT_ranges" not in a:
        return []
    lists = dwarf.range_lists()
    if lists is None:
        return []
    out = []
    for entry in lists.get_range_list_at_offset(a["DW_AT_ranges"].value, cu=cu):
        if hasattr(entry, "base_address"):
            base = entry.base_address
        elif entry.is_absolute:
            out.append((entry.begin_offset, entry.end_offset))
        else:
            out.append((base + entry.begin_offset, base + entry.end_offset))
    return [(lo, hi) for lo, hi in out if hi > lo]


def _str(value) -> str:
    return os.fsdecode(value) if isinstance(value, bytes) else str(value)


def _text(attr) -> str:
    """A string attribute's text; '' when it cannot be had (a dwz alt
    string without its alt file is left as a bare offset by pyelftools)."""
    if attr is None or not isinstance(attr.value, (str, bytes)):
        return ""
    return _str(attr.value)


def _why(e: Exception) -> str:
    return str(e).splitlines()[0] if str(e) else type(e).__name__
