"""Whether a process runs V8 (node), and how V8 lays out its frames and
objects there.

V8 describes itself to postmortem debuggers in `v8dbg_*` symbols that node
exports (531 in node 20): each an int in .data whose value is a frame
slot's offset from the frame pointer, a field's offset in an object, an
instance type or a tag. The executable (or libnode.so) that defines them is
the runtime; everything here comes from its file, read once per file. A
V8 whose symbols lack one of those read below is not followed (its JS
frames stay as walked), never guessed at."""
from __future__ import annotations

import os
import struct

from ..model import UstackError
from ..objfile import symbol_by_name
from ..objfile.elf import ElfImage
from ..objfile.mapped import object_path
from ..values import value
from .runtime_files import may_be

# what the in-kernel pass and the reader need: name in LAYOUT -> v8dbg symbol
FIELDS = {
    # a frame's fixed slots, bytes from its frame pointer
    "fp_context": "v8dbg_off_fp_context",
    "fp_function": "v8dbg_off_fp_function",
    "fp_bytecode_array": "v8dbg_off_fp_bytecode_array",
    "fp_bytecode_offset": "v8dbg_off_fp_bytecode_offset",
    # objects' fields, bytes from the object's (untagged) start
    "heap_object_map": "v8dbg_class_HeapObject__map__Map",
    "map_instance_type": "v8dbg_class_Map__instance_type__uint16_t",
    "function_shared": "v8dbg_class_JSFunction__shared__SharedFunctionInfo",
    "shared_name_or_scope_info": "v8dbg_class_SharedFunctionInfo__name_or_scope_info__Object",
    "shared_function_data": "v8dbg_class_SharedFunctionInfo__function_data__Object",
    "shared_script_or_debug_info":
        "v8dbg_class_SharedFunctionInfo__script_or_debug_info__HeapObject",
    "script_name": "v8dbg_class_Script__name__Object",
    "script_source": "v8dbg_class_Script__source__Object",
    "script_line_ends": "v8dbg_class_Script__line_ends__Object",
    "fixed_array_length": "v8dbg_class_FixedArrayBase__length__SMI",
    "fixed_array_data": "v8dbg_class_FixedArray__data__uintptr_t",
    "string_length": "v8dbg_class_String__length__int32_t",
    "seq_one_byte_chars": "v8dbg_class_SeqOneByteString__chars__char",
    "seq_two_byte_chars": "v8dbg_class_SeqTwoByteString__chars__char",
    "cons_first": "v8dbg_class_ConsString__first__String",
    "cons_second": "v8dbg_class_ConsString__second__String",
    "thin_actual": "v8dbg_class_ThinString__actual__String",
    "scope_info_context_locals": "v8dbg_scopeinfo_idx_ncontextlocals",
    "scope_info_first_vars": "v8dbg_scopeinfo_idx_first_vars",
    # instance types and string tags
    "type_shared_function_info": "v8dbg_type_SharedFunctionInfo__SHARED_FUNCTION_INFO_TYPE",
    "type_scope_info": "v8dbg_type_ScopeInfo__SCOPE_INFO_TYPE",
    "type_script": "v8dbg_type_Script__SCRIPT_TYPE",
    "type_bytecode_array": "v8dbg_type_BytecodeArray__BYTECODE_ARRAY_TYPE",
    "type_byte_array": "v8dbg_type_ByteArray__BYTE_ARRAY_TYPE",
    "first_nonstring_type": "v8dbg_FirstNonstringType",
    "string_representation_mask": "v8dbg_StringRepresentationMask",
    "string_encoding_mask": "v8dbg_StringEncodingMask",
    "seq_string_tag": "v8dbg_SeqStringTag",
    "cons_string_tag": "v8dbg_ConsStringTag",
    "thin_string_tag": "v8dbg_ThinStringTag",
    "one_byte_string_tag": "v8dbg_OneByteStringTag",
    "heap_object_tag": "v8dbg_HeapObjectTag",
    "heap_object_tag_mask": "v8dbg_HeapObjectTagMask",
    "tagged_size": "v8dbg_TaggedSize",
}
# what the in-kernel pass takes as given (bpf/v8.h): 8-byte tagged words
# (no pointer compression, node's build), heap objects tagged 1 of mask 3
FIXED = {"tagged_size": 8, "heap_object_tag": 1, "heap_object_tag_mask": 3}
SLOTS = 5                       # v8.h's V8_SLOTS: words below a frame pointer it reads

# the bytecode offset an interpreted frame keeps counts from the tagged
# BytecodeArray pointer: its header's size less the heap tag
BYTECODE_HEADER = "bytecode_header"
# BytecodeArray::source_position_table, which no v8dbg symbol gives: the
# offset in V8 9-12 (after length, constant_pool, handler_table); what is
# there is used only if its map says ByteArray
BYTECODE_SOURCE_POSITIONS = 32


@value
class Runtime:
    """A process's V8: the object defining its v8dbg symbols, and its layout."""
    path: str
    layout: tuple               # sorted (name, value) pairs: FIELDS' names

    def field(self, name: str) -> int:
        return dict(self.layout)[name]

    def slot(self, name: str) -> int:
        """A frame slot as v8.h's index among the SLOTS words below fp."""
        return SLOTS + self.field(name) // 8


def find_runtime(mappings: list) -> Runtime | None:
    """The V8 of a process with these executable mappings, or None."""
    for m in mappings:
        path = object_path(m)
        found = object_runtime(path) if path else None
        if found is not None:
            return found
    return None


def object_runtime(path: str) -> Runtime | None:
    """The V8 the object at `path` is (node, libnode), or None: asked of
    every object whose rows load, so a name test comes before the file."""
    return runtime_of(path) if _looks_like_node(path) else None


def _looks_like_node(path: str) -> bool:
    """Cheap test before reading the file's symbols (runtime_files.py)."""
    return may_be("v8", path)


_runtimes: dict = {}


def runtime_of(path: str) -> Runtime | None:
    """The V8 the object at `path` holds, memoized by the file's identity."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    key = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
    if key not in _runtimes:
        _runtimes[key] = _read_runtime(path)
    return _runtimes[key]


def _read_runtime(path: str) -> Runtime | None:
    try:
        with open(path, "rb") as f:
            if f.read(4) != b"\x7fELF":
                return None
        image = ElfImage.open(path)
        names = tuple(FIELDS.values()) + ("v8dbg_class_BytecodeArray__data__uintptr_t",)
        symbols = symbol_by_name.addresses(image.file, names)
        if any(name not in symbols for name in names):
            return None
        layout = {field: _int_at(image, symbols[name]) for field, name in FIELDS.items()}
        layout[BYTECODE_HEADER] = _int_at(
            image, symbols["v8dbg_class_BytecodeArray__data__uintptr_t"]) \
            - layout["heap_object_tag"]
    except (OSError, UstackError, struct.error):
        return None
    if any(layout[k] != v for k, v in FIXED.items()):
        return None
    for slot in ("fp_context", "fp_function", "fp_bytecode_array", "fp_bytecode_offset"):
        off = layout[slot]
        if off >= 0 or off % 8 or off < -8 * SLOTS:
            return None
    return Runtime(path=path, layout=tuple(sorted(layout.items())))


def _int_at(image: ElfImage, vaddr: int) -> int:
    """The int32 symbol at vaddr; one whose value is 0 sits in .bss, which
    the file does not hold (node's v8dbg_SeqStringTag, HeapObject::map)."""
    data = image.read(vaddr, 4)
    if not data:
        return 0
    return struct.unpack("<i", data)[0]
