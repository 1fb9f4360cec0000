"""Whether a process runs a HotSpot JVM, and how that JVM lays out its code
cache, frames and metadata.

HotSpot describes itself to serviceability agents in tables libjvm exports:
gHotSpotVMStructs (type, field, static?, offset or address), gHotSpotVMTypes
(type, size), gHotSpotVMIntConstants and gHotSpotVMLongConstants, each an
array whose entry layout (offsets of its members, its stride) is given by
more exported ints (gHotSpotVMStructEntryTypeNameOffset, ...). The tables
are filled by the loader's relocations, so they are read from a live
process's memory; what they say is the file's, kept per libjvm file
(statics as addresses relative to the load bias). A JVM whose tables lack
a field read below is not followed, never guessed at."""
from __future__ import annotations

import os
import struct

from ..kernel import procfs
from ..model import UstackError
from ..objfile import symbol_by_name
from ..objfile.elf import ElfImage
from ..values import value

LIBJVM = "libjvm.so"
# the exported ints that describe each table's entries
_ENTRY_INTS = (
    "gHotSpotVMStructEntryTypeNameOffset", "gHotSpotVMStructEntryFieldNameOffset",
    "gHotSpotVMStructEntryIsStaticOffset", "gHotSpotVMStructEntryOffsetOffset",
    "gHotSpotVMStructEntryAddressOffset", "gHotSpotVMStructEntryArrayStride",
    "gHotSpotVMStructEntryTypeStringOffset",
    "gHotSpotVMTypeEntryTypeNameOffset", "gHotSpotVMTypeEntrySizeOffset",
    "gHotSpotVMTypeEntryArrayStride",
    "gHotSpotVMIntConstantEntryNameOffset", "gHotSpotVMIntConstantEntryValueOffset",
    "gHotSpotVMIntConstantEntryArrayStride",
)
_TABLES = ("gHotSpotVMStructs", "gHotSpotVMTypes", "gHotSpotVMIntConstants")
# what the walker and the namer read: name in Layout -> (type, field), or
# several where JDKs differ (the first the tables hold is taken)
FIELDS = {
    "heaps": ("CodeCache", "_heaps"),                    # static GrowableArray<CodeHeap*>*
    "array_len": ("GrowableArrayBase", "_len"),
    "array_data": ("GrowableArray<int>", "_data"),
    "heap_memory": ("CodeHeap", "_memory"),              # a VirtualSpace
    "heap_segmap": ("CodeHeap", "_segmap"),              # a VirtualSpace
    "heap_log2_segment": ("CodeHeap", "_log2_segment_size"),
    "space_low": ("VirtualSpace", "_low"),
    "space_high": ("VirtualSpace", "_high"),
    "block_length": ("HeapBlock::Header", "_length"),
    "block_used": ("HeapBlock::Header", "_used"),
    "blob_name": ("CodeBlob", "_name"),
    "blob_size": ("CodeBlob", "_size"),
    "blob_frame_complete": ("CodeBlob", "_frame_complete_offset"),
    "blob_frame_size": ("CodeBlob", "_frame_size"),
    "nmethod_method": (("CompiledMethod", "_method"), ("nmethod", "_method")),  # JDK 11-22; 23-
    "method_const": ("Method", "_constMethod"),
    "const_constants": ("ConstMethod", "_constants"),
    "const_name_index": ("ConstMethod", "_name_index"),
    "const_code_size": ("ConstMethod", "_code_size"),
    "pool_holder": ("ConstantPool", "_pool_holder"),
    "klass_name": ("Klass", "_name"),
    "klass_constants": ("InstanceKlass", "_constants"),
    "symbol_length": ("Symbol", "_length"),
    "symbol_body": ("Symbol", "_body"),
}
# a blob's code, one of two ways: pointers (JDK 17 and before), or offsets
# from the blob (JDK 25: a smaller header); the tables say which
CODE_POINTERS = {"blob_code_begin": ("CodeBlob", "_code_begin"),
                 "blob_code_end": ("CodeBlob", "_code_end")}
CODE_OFFSETS = {"blob_code_offset": ("CodeBlob", "_code_offset"),
                "blob_data_offset": ("CodeBlob", "_data_offset")}
# what names more where the JVM has it: inlined methods (a compiled
# frame's scopes), lines (a method's line number table), source files
OPTIONAL = {
    "nmethod_compile_id": ("nmethod", "_compile_id"),
    "pc_offset": ("PcDesc", "_pc_offset"),
    "pc_scope": ("PcDesc", "_scope_decode_offset"),
    # a u2 in JDK 11-17, a u4 (ConstMethodFlags) in 21-
    "const_flags": (("ConstMethod", "_flags"), ("ConstMethod", "_flags._flags")),
    "pool_source_file": ("ConstantPool", "_source_file_name_index"),
}
# an nmethod's scopes (PcDescs, then the scopes' stream) and metadata, one
# of two ways: inside the blob (JDK 17 and before), or its debug info in a
# block of its own (_immutable_data) and its metadata after its
# relocations in another (_mutable_data) (JDK 25)
SCOPES_IN_BLOB = {
    "nmethod_scopes_data": (("CompiledMethod", "_scopes_data_begin"),
                            ("nmethod", "_scopes_data_begin")),
    "nmethod_scopes_pcs": ("nmethod", "_scopes_pcs_offset"),
    "nmethod_dependencies": ("nmethod", "_dependencies_offset"),
    "nmethod_metadata": ("nmethod", "_metadata_offset"),
}
SCOPES_APART = {
    "nmethod_immutable": ("nmethod", "_immutable_data"),
    "nmethod_scopes_pcs": ("nmethod", "_scopes_pcs_offset"),
    "nmethod_scopes_data_offset": ("nmethod", "_scopes_data_offset"),
    "blob_mutable_data": ("CodeBlob", "_mutable_data"),
    "blob_relocation_size": ("CodeBlob", "_relocation_size"),
}
SIZES = {"heap_block": "HeapBlock", "constant_pool": "ConstantPool",
         "const_method": "ConstMethod", "pc_desc": "PcDesc"}
INT_CONSTANTS = {"has_line_table": ("ConstMethod::_has_linenumber_table",          # -17
                                    "ConstMethodFlags::_misc_has_linenumber_table"),  # 21-
                 "entry_bci": ("InvocationEntryBci",)}
# the C types of the integer fields, as the tables spell them -> struct format
_INT_FORMATS = {"int": "i", "jint": "i", "int32_t": "i", "uint": "I", "juint": "I",
                "uint32_t": "I", "u4": "I", "int16_t": "h", "short": "h", "jshort": "h",
                "uint16_t": "H", "u2": "H", "unsigned short": "H", "u1": "B", "uint8_t": "B",
                "int8_t": "b"}
# x86-64 interpreter frame slots, in words from rbp (frame_x86.hpp: the
# same in JDK 11-25, walked on 17 and 25; the tables do not carry them)
INTERP_SENDER_SP = -1
INTERP_METHOD = -3
INTERP_BCP = -8


@value
class Layout:
    """One libjvm file's tables: field offsets, static addresses (ELF
    addresses: add the process's load bias), type sizes."""
    path: str
    fields: tuple               # sorted (name, offset or ELF address) pairs: FIELDS' names
    sizes: tuple                # sorted (name, size) pairs: SIZES' names
    formats: tuple = ()         # sorted (name, struct format) of the integer fields

    def as_dict(self) -> dict:
        return dict(self.fields) | dict(self.sizes)

    def int_formats(self) -> dict:
        """name -> the struct format of that field's integer ("i" where the
        tables name no integer type)."""
        return dict(self.formats)


def libjvm_of(pid: int) -> tuple | None:
    """(path, load bias) of the libjvm process pid maps, or None. The path
    is where this tool opens the file: a container's libjvm is reached
    through the process (kernel/proc_root.py), never by its path here."""
    for m in procfs.executable_mappings(pid):
        if m.path.endswith("/" + LIBJVM):
            try:
                vaddr = ElfImage.open(m.open_path).vaddr_of_file_offset(m.pgoff)
            except (OSError, ValueError, UstackError):
                return None
            return None if vaddr is None else (m.open_path, m.start - vaddr)
    return None


_layouts: dict = {}


def layout_of(path: str, bias: int, mem) -> Layout | None:
    """The layout of the libjvm at `path`, loaded at `bias` in the process
    whose memory `mem` reads; memoized by the file's identity."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    key = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
    if key not in _layouts:
        try:
            _layouts[key] = _read_layout(path, bias, mem)
        except (OSError, UstackError, struct.error, ValueError):
            return None     # a process gone mid-read: asked again next time
    return _layouts[key]


def _read_layout(path: str, bias: int, mem) -> Layout | None:
    image = ElfImage.open(path)
    symbols = symbol_by_name.addresses(image.file, _ENTRY_INTS + _TABLES)
    if any(name not in symbols for name in _ENTRY_INTS + _TABLES):
        return None
    ints = {name: struct.unpack("<q", mem.read(bias + symbols[name], 8))[0]
            for name in _ENTRY_INTS}
    want = {}
    for name, pairs in (FIELDS | CODE_POINTERS | CODE_OFFSETS | OPTIONAL | SCOPES_IN_BLOB
                        | SCOPES_APART).items():
        for rank, pair in enumerate(pairs if isinstance(pairs[0], tuple) else (pairs,)):
            want[pair] = (name, rank)
    fields, ranks, formats = {}, {}, {}
    for entry in _entries(mem, mem.word(bias + symbols["gHotSpotVMStructs"]),
                          ints["gHotSpotVMStructEntryArrayStride"]):
        type_ptr = _q(entry, ints["gHotSpotVMStructEntryTypeNameOffset"])
        if type_ptr == 0:
            break
        field_ptr = _q(entry, ints["gHotSpotVMStructEntryFieldNameOffset"])
        pair = (c_string(mem, type_ptr), c_string(mem, field_ptr))
        name, rank = want.get(pair, (None, 0))
        if name is not None and ranks.get(name, rank + 1) > rank:
            ranks[name] = rank
            static = struct.unpack_from("<i", entry, ints["gHotSpotVMStructEntryIsStaticOffset"])[0]
            fields[name] = (_q(entry, ints["gHotSpotVMStructEntryAddressOffset"]) - bias
                                  if static else
                                  _q(entry, ints["gHotSpotVMStructEntryOffsetOffset"]))
            type_string = _q(entry, ints["gHotSpotVMStructEntryTypeStringOffset"])
            if type_string:
                formats[name] = _INT_FORMATS.get(c_string(mem, type_string), "i")
    sizes = {}
    wanted_types = {t: name for name, t in SIZES.items()}
    for entry in _entries(mem, mem.word(bias + symbols["gHotSpotVMTypes"]),
                          ints["gHotSpotVMTypeEntryArrayStride"]):
        type_ptr = _q(entry, ints["gHotSpotVMTypeEntryTypeNameOffset"])
        if type_ptr == 0:
            break
        name = c_string(mem, type_ptr)
        if name in wanted_types:
            sizes[wanted_types[name]] = _q(entry, ints["gHotSpotVMTypeEntrySizeOffset"])
    ints_start = mem.word(bias + symbols["gHotSpotVMIntConstants"])
    wanted_ints = {c: name for name, cs in INT_CONSTANTS.items() for c in cs}
    unsigned5 = False
    for entry in _entries(mem, ints_start, ints["gHotSpotVMIntConstantEntryArrayStride"]):
        name_ptr = _q(entry, ints["gHotSpotVMIntConstantEntryNameOffset"])
        if name_ptr == 0:
            break
        name = c_string(mem, name_ptr)
        if name in wanted_ints:
            unsigned5 = unsigned5 or name.startswith("ConstMethodFlags::")
            fields[wanted_ints[name]] = struct.unpack_from(
                "<i", entry, ints["gHotSpotVMIntConstantEntryValueOffset"])[0]
    if any(name not in fields for name in FIELDS) or any(name not in sizes for name in SIZES):
        return None
    code = _whole(fields, CODE_POINTERS, CODE_OFFSETS)
    if code is None:
        return None
    for name in CODE_OFFSETS if code is CODE_POINTERS else CODE_POINTERS:
        fields.pop(name, None)
    scopes = _whole(fields, SCOPES_IN_BLOB, SCOPES_APART)
    more = set(OPTIONAL) | set(INT_CONSTANTS)
    every_way = set(SCOPES_IN_BLOB) | set(SCOPES_APART)
    if scopes is None or any(name not in fields for name in more):
        drop = more | every_way     # no inlined methods nor lines: the methods compiled
    else:
        drop = every_way - set(scopes)
    for name in drop:
        fields.pop(name, None)
    # the compressed streams (scopes, line tables' escapes): UNSIGNED5
    # without zero bytes since JDK 20; the tables do not say which, the
    # ConstMethodFlags class (21-) tells the later JDKs from 11-17's
    fields["unsigned5"] = int(unsigned5)
    return Layout(path=path, fields=tuple(sorted(fields.items())),
                  sizes=tuple(sorted(sizes.items())),
                  formats=tuple(sorted((n, f) for n, f in formats.items() if n in fields)))


def _whole(fields: dict, *ways: dict) -> dict | None:
    """The first of `ways` (field sets) the tables hold all of, or None."""
    for way in ways:
        if all(name in fields for name in way):
            return way
    return None


_MAX_ENTRIES = 1 << 14          # a table far longer than any JVM's is not one


def _entries(mem, start: int, stride: int):
    if not 0 < stride <= 256:
        raise ValueError("not a vmStructs table")
    chunk = 256
    for first in range(0, _MAX_ENTRIES, chunk):
        data = mem.read(start + first * stride, chunk * stride)
        for i in range(chunk):
            yield data[i * stride:(i + 1) * stride]
    raise ValueError("a vmStructs table without its end")


def _q(entry: bytes, at: int) -> int:
    return struct.unpack_from("<Q", entry, at)[0]


def c_string(mem, addr: int, most: int = 128) -> str:
    """The C string at addr (the process's), read in one go where it can."""
    try:
        data = mem.read(addr, most)
    except OSError:                     # near the end of a mapping: to its page's end
        data = mem.read(addr, min(most, 4096 - addr % 4096))
    end = data.find(b"\0")
    return data[:end if end >= 0 else most].decode("latin-1")
