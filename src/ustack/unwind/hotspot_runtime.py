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
    "blob_code_begin": ("CodeBlob", "_code_begin"),
    "blob_code_end": ("CodeBlob", "_code_end"),
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
# what names more where the JVM has it: inlined methods (a compiled
# frame's scopes), lines (a method's line number table), source files
OPTIONAL = {
    "nmethod_scopes_data": (("CompiledMethod", "_scopes_data_begin"),
                            ("nmethod", "_scopes_data_begin")),
    "nmethod_scopes_pcs": ("nmethod", "_scopes_pcs_offset"),
    "nmethod_dependencies": ("nmethod", "_dependencies_offset"),
    "nmethod_metadata": ("nmethod", "_metadata_offset"),
    "nmethod_compile_id": ("nmethod", "_compile_id"),
    "pc_offset": ("PcDesc", "_pc_offset"),
    "pc_scope": ("PcDesc", "_scope_decode_offset"),
    "const_flags": ("ConstMethod", "_flags"),           # a u2 in JDK 11-17
    "pool_source_file": ("ConstantPool", "_source_file_name_index"),
}
SIZES = {"heap_block": "HeapBlock", "constant_pool": "ConstantPool",
         "const_method": "ConstMethod", "pc_desc": "PcDesc"}
INT_CONSTANTS = {"has_line_table": "ConstMethod::_has_linenumber_table",
                 "entry_bci": "InvocationEntryBci"}
# x86-64 interpreter frame slots, in words from rbp (frame_x86.hpp: the
# same in JDK 11-21; the tables do not carry them)
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

    def as_dict(self) -> dict:
        return dict(self.fields) | dict(self.sizes)


def libjvm_of(pid: int) -> tuple | None:
    """(path, load bias) of the libjvm process pid maps, or None."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                if line.endswith("/" + LIBJVM + "\n"):
                    fields = line.split(None, 5)
                    if int(fields[2], 16) == 0:
                        path = f"/proc/{pid}/root" + fields[5].rstrip("\n")
                        return path, int(fields[0].split("-")[0], 16)
    except (OSError, ValueError, IndexError):
        pass
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
    for name, pairs in (FIELDS | OPTIONAL).items():
        for rank, pair in enumerate(pairs if isinstance(pairs[0], tuple) else (pairs,)):
            want[pair] = (name, rank)
    fields, ranks = {}, {}
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
    wanted_ints = {c: name for name, c in INT_CONSTANTS.items()}
    for entry in _entries(mem, ints_start, ints["gHotSpotVMIntConstantEntryArrayStride"]):
        name_ptr = _q(entry, ints["gHotSpotVMIntConstantEntryNameOffset"])
        if name_ptr == 0:
            break
        name = c_string(mem, name_ptr)
        if name in wanted_ints:
            fields[wanted_ints[name]] = struct.unpack_from(
                "<i", entry, ints["gHotSpotVMIntConstantEntryValueOffset"])[0]
    if any(name not in fields for name in FIELDS) or any(name not in sizes for name in SIZES):
        return None
    if not all(name in fields for name in OPTIONAL) or "entry_bci" not in fields:
        # no inlined methods nor lines: the frames of the methods compiled
        for name in list(OPTIONAL) + list(INT_CONSTANTS):
            fields.pop(name, None)
    return Layout(path=path, fields=tuple(sorted(fields.items())),
                  sizes=tuple(sorted(sizes.items())))


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
