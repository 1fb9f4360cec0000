"""Where a CPython process keeps its threads' Python frames.

The interpreter is the mapped object (the python executable, or
libpython3.X.so under it) that defines `_PyRuntime`. From it and its
version follow the state layout (the field offsets the in-kernel walk and
the user-space reader follow): _PyRuntime -> interpreters.head -> its
thread list -> each PyThreadState's current frame -> the `previous` chain,
each frame's code object and instruction. Release builds keep these
offsets fixed within a minor version (x86-64, glibc); 3.13 also states them
in _PyRuntime's first bytes (_Py_DebugOffsets), which win where present.
The eval function's address ranges say which native frames ran Python code.
"""
from __future__ import annotations

import os
import re
import struct

from ..model import Mapping, UstackError
from ..objfile import content_key, symbol_by_name
from ..objfile.elf import ElfImage
from ..objfile.mapped import object_path
from ..values import value
from .runtime_files import file_name, may_be

NONE = 0xFFFFFFFF               # a layout field the version does not have

# how a frame says where it is (layout["instr_kind"])
LASTI_BYTES = 1                 # int f_lasti, a byte offset (3.8, 3.9)
LASTI_UNITS = 2                 # int f_lasti, in 2-byte code units (3.10)
INSTR_POINTER = 3               # a pointer into the code's bytecode (3.11+)

# which Python frames one C frame of the eval function ran (layout["entry_kind"])
ONE_PER_EVAL = 1                # one (3.8-3.10)
IS_ENTRY = 2                    # up to and including a frame whose is_entry byte is set (3.11)
OWNER_CSTACK = 3                # up to a shim frame whose owner byte is CSTACK (3.12+)
FRAME_OWNED_BY_CSTACK = 3

EVAL_FUNCTION = "_PyEval_EvalFrameDefault"

# The layout per (major, minor): the names python.h's struct python_layout
# has. Read off the DWARF of release builds (tests/test_python_runtime.py
# checks them against each installed build's).
_FRAME_OBJECT = dict(frame_previous=24, frame_code=32, code_bytecode=NONE,
                     cframe_current_frame=NONE, entry_kind=ONE_PER_EVAL, frame_entry=NONE)
LAYOUTS = {
    (3, 8): dict(_FRAME_OBJECT, runtime_interp_head=32, interp_tstate_head=8, tstate_next=8,
                 tstate_thread_id=176, tstate_frame=24, frame_instr=104,
                 instr_kind=LASTI_BYTES),
    (3, 9): dict(_FRAME_OBJECT, runtime_interp_head=32, interp_tstate_head=8, tstate_next=8,
                 tstate_thread_id=176, tstate_frame=24, frame_instr=104,
                 instr_kind=LASTI_BYTES),
    (3, 10): dict(_FRAME_OBJECT, runtime_interp_head=32, interp_tstate_head=8, tstate_next=8,
                  tstate_thread_id=176, tstate_frame=24, frame_instr=96,
                  instr_kind=LASTI_UNITS),
    (3, 11): dict(runtime_interp_head=40, interp_tstate_head=16, tstate_next=8,
                  tstate_thread_id=152, tstate_frame=56, cframe_current_frame=8,
                  frame_previous=48, frame_code=32, frame_instr=56, instr_kind=INSTR_POINTER,
                  code_bytecode=184, entry_kind=IS_ENTRY, frame_entry=68),
    (3, 12): dict(runtime_interp_head=40, interp_tstate_head=72, tstate_next=8,
                  tstate_thread_id=136, tstate_frame=56, cframe_current_frame=0,
                  frame_previous=8, frame_code=0, frame_instr=56, instr_kind=INSTR_POINTER,
                  code_bytecode=192, entry_kind=OWNER_CSTACK, frame_entry=70),
    (3, 13): dict(runtime_interp_head=632, interp_tstate_head=7344, tstate_next=8,
                  tstate_thread_id=152, tstate_frame=72, cframe_current_frame=NONE,
                  frame_previous=8, frame_code=0, frame_instr=56, instr_kind=INSTR_POINTER,
                  code_bytecode=200, entry_kind=OWNER_CSTACK, frame_entry=70),
}
FIELDS = tuple(sorted(LAYOUTS[(3, 11)]))

# where a PyCodeObject keeps what names it, per (major, minor): read by the
# symbolizer (symbols/python.py), and by the kernel to tell a code object
# from one freed at its address (code_identity)
_CODE_38 = dict(firstlineno=40, filename=104, name=112, qualname=None, table=120)
_CODE_311 = dict(firstlineno=72, filename=112, name=120, qualname=128, table=136)
_CODE_312 = dict(_CODE_311, firstlineno=68)
CODE_OFFSETS = {(3, 8): _CODE_38, (3, 9): _CODE_38, (3, 10): _CODE_38,
                (3, 11): _CODE_311, (3, 12): _CODE_312, (3, 13): _CODE_312}


def code_identity(version: tuple) -> tuple:
    """(co_filename's offset, co_qualname's or before 3.11 co_name's) in a
    PyCodeObject of `version`: the fields frames are named by; (0, 0) for a
    version without a layout."""
    offsets = CODE_OFFSETS.get(version)
    if offsets is None:
        return (0, 0)
    name = offsets["qualname"] if offsets["qualname"] is not None else offsets["name"]
    return (offsets["filename"], name)

# 3.13's _Py_DebugOffsets at _PyRuntime's start: "xdebugpy", the version
# (PY_VERSION_HEX), then sections of u64 offsets; (section offset, field
# index) of each layout field it states
_DEBUG_COOKIE = b"xdebugpy"
_DEBUG_FIELDS_313 = dict(runtime_interp_head=(24, 2), interp_tstate_head=(48, 3),
                         tstate_next=(152, 2), tstate_frame=(152, 4), tstate_thread_id=(152, 5),
                         frame_previous=(224, 1), frame_code=(224, 2), frame_instr=(224, 3),
                         frame_entry=(224, 5), code_bytecode=(272, 9))
_DEBUG_BYTES = 360


@value
class Interpreter:
    """A process's CPython: where its state is and how it is laid out."""
    path: str                   # the object that defines _PyRuntime, as ustack opens it
    version: tuple              # (3, 11)
    runtime: int                # _PyRuntime's address in the process
    eval_ranges: tuple          # ((start, end), ...) of the eval function, process addresses
    layout: tuple               # sorted (field, value) pairs: LAYOUTS' names

    def field(self, name: str) -> int:
        return dict(self.layout)[name]


def find_interpreter(mappings: list) -> Interpreter | None:
    """The CPython of a process with these executable mappings, or None
    when it runs none (or one of a version ustack has no layout for)."""
    for m in mappings:
        path = object_path(m)
        if not path or not _looks_like_python(path):
            continue
        found = interpreter_of(path, m)
        if found:
            return found
    return None


def runs_python(paths: list) -> bool:
    """Whether one of the objects at `paths` (a command's load closure)
    is a CPython interpreter ustack has a layout for."""
    for path in paths:
        try:
            if find_interpreter([Mapping(0, 1, 0, path)]) is not None:
                return True
        except (OSError, ValueError):
            pass
    return False


def _looks_like_python(path: str) -> bool:
    """Cheap test before reading the file's symbols (runtime_files.py)."""
    return may_be("python", path)


def interpreter_of(path: str, mapping: Mapping) -> Interpreter | None:
    """The interpreter defined by the object at `path`, mapped executable
    by `mapping`; None when it defines no _PyRuntime."""
    if _object_facts(path) is None:
        return None
    vaddr = ElfImage.open(path).vaddr_of_file_offset(mapping.pgoff)
    if vaddr is None:
        return None
    return _interpreter(path, mapping.start - vaddr)


def object_interpreter(path: str) -> Interpreter | None:
    """The interpreter the object at `path` defines, at its ELF addresses
    (the in-kernel walk moves them to a process's by the object's load
    bias); None when it is no interpreter ustack has a layout for."""
    if not _looks_like_python(path) or _object_facts(path) is None:
        return None
    try:
        # an image of its own, if one is read at all: this runs on the
        # run's rows loader thread, and the shared one's symbols may be
        # being read by another
        return _interpreter(path, 0, lambda: ElfImage(path))
    except (OSError, ValueError, UstackError):
        return None


def version_of(mappings: list) -> tuple | None:
    """(major, minor) of the interpreter among a process's executable
    mappings, or None."""
    for m in mappings:
        path = object_path(m)
        facts = _object_facts(path) if path and _looks_like_python(path) else None
        if facts is not None and _layout(facts[1], facts[2]) is not None:
            return facts[1]
    return None


def _interpreter(path: str, bias: int, image=None) -> Interpreter | None:
    """The interpreter at `path` loaded `bias` bytes above its ELF addresses
    (`image()`: the file's image, else the shared one is read if needed)."""
    facts = _object_facts(path)
    if facts is None:
        return None
    runtime, version, debug = facts
    layout = _layout(version, debug)
    if layout is None:
        return None
    ranges = tuple(sorted((bias + a, bias + b)
                          for a, b in _eval_ranges(path, image or (lambda: ElfImage.open(path)))))
    if not ranges:
        return None
    return Interpreter(path=path, version=version, runtime=bias + runtime,
                       eval_ranges=ranges, layout=tuple(sorted(layout.items())))


_EVAL_KIND = "python-eval"          # content_key memo: the eval function's ranges
_RANGE = struct.Struct("<QQ")


def _eval_ranges(path: str, image) -> tuple:
    """(start, end) ELF addresses of the eval function and its unlikely
    paths, found once per version of the file (a profile of a Python
    program found them at every run: ~2.5 ms of libpython's symbols);
    `image()` gives the file's ElfImage when they are to be found."""
    try:
        st = os.stat(path)
    except OSError:
        return ()
    saved = content_key.saved(_EVAL_KIND, st)
    if saved and len(saved) % _RANGE.size == 0:
        return tuple(_RANGE.iter_unpack(saved))
    ranges = _eval_function(image())
    if len(ranges) == 1:                # its .cold part unnamed (no .symtab)
        ranges += _cold_part(path)
    if ranges:
        try:
            content_key.save(_EVAL_KIND, st, b"".join(_RANGE.pack(a, b) for a, b in ranges))
        except OSError:
            pass                        # found again next run
    return tuple(ranges)


def _eval_function(image: ElfImage) -> list:
    """(start, end) ELF addresses of the eval function and the parts gcc
    split off it (.cold): read by name from the symbol tables (~1 ms for
    libpython), else from the index of all its functions, made for this
    (~9 ms: 5.4 k functions)."""
    sized = symbol_by_name.functions_named(image.file, EVAL_FUNCTION)
    if sized and all(sized.values()):
        return [(address, address + size) for (_name, address), size in sized.items()]
    return [(s.address, s.address + s.size) for s in image.functions
            if s.name == EVAL_FUNCTION or s.name.startswith(EVAL_FUNCTION + ".")]


def _cold_part(path: str) -> tuple:
    """The eval function's unlikely paths, split off by gcc as
    `_PyEval_EvalFrameDefault.cold`, where a stripped interpreter names only
    the hot part: the CFI range holding its `python:line` USDT site (the
    line tracing it does there), as (start, end) ELF addresses."""
    from ..objfile.on_disk import OnDisk
    from ..objfile.stapsdt import sdt_probes
    try:
        sites = [p.pc for p in sdt_probes(path) if (p.provider, p.name) == ("python", "line")]
        found = OnDisk.of(path).fde(sites[0]) if len(sites) == 1 else None
    except UstackError:
        return ()
    return (found,) if found else ()


_facts: dict = {}


def _object_facts(path: str):
    """(_PyRuntime's ELF address, (major, minor), the debug offsets' bytes
    or b"") of the object at path, or None; memoized by the file's identity."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    key = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
    if key not in _facts:
        _facts[key] = _read_facts(path)
    return _facts[key]


def _read_facts(path: str):
    with open(path, "rb") as f:
        if f.read(4) != b"\x7fELF":
            return None
    try:
        image = ElfImage.open(path)
    except UstackError:
        return None
    # the hash table, else a table scan where the names are among its
    # strings: a whole-machine run asks ~40 objects that are not Python
    symbols = symbol_by_name.addresses(image.file, ("_PyRuntime", "Py_Version"))
    if "_PyRuntime" not in symbols:
        return None
    version = None
    if "Py_Version" in symbols:          # 3.11+: PY_VERSION_HEX
        hexversion = struct.unpack("<I", image.read(symbols["Py_Version"], 4))[0]
        version = (hexversion >> 24, (hexversion >> 16) & 0xFF)
    else:
        version = _version_from_name(path) or _version_from_text(image)
    if version is None:
        return None
    debug = image.read(symbols["_PyRuntime"], _DEBUG_BYTES)
    return symbols["_PyRuntime"], version, debug if debug.startswith(_DEBUG_COOKIE) else b""


def _version_from_name(path: str) -> tuple | None:
    m = re.search(r"python(\d)\.(\d+)", file_name(path))
    return (int(m.group(1)), int(m.group(2))) if m else None


def _version_from_text(image: ElfImage) -> tuple | None:
    """The version Py_GetVersion prints ("3.9.18 (main, ..."), from .rodata:
    for a renamed executable of a version without Py_Version."""
    rodata = image.file.section_bytes(".rodata")
    if not rodata:
        return None
    m = re.search(rb"\x00(\d)\.(\d+)\.\d+[a-z0-9+]* \(", rodata)
    return (int(m.group(1)), int(m.group(2))) if m else None


def _layout(version: tuple, debug: bytes) -> dict | None:
    """The layout of `version`, with what _Py_DebugOffsets states where the
    interpreter has them."""
    base = LAYOUTS.get(version)
    if base is None:
        return None
    if not debug:
        return dict(base)
    stated_version = struct.unpack_from("<Q", debug, 8)[0]
    if (stated_version >> 24, (stated_version >> 16) & 0xFF) != version or version != (3, 13):
        return dict(base)
    layout = dict(base)
    for name, (section, index) in _DEBUG_FIELDS_313.items():
        layout[name] = struct.unpack_from("<Q", debug, section + 8 * index)[0]
    return layout
