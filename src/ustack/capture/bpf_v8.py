"""JS frames in the in-kernel walk: what user space does for
src/ustack/bpf/v8.h.

The kernel names the JS frames of a stack that went through a V8 object
(node, or libnode) whose rows point at its layout in V8_OBJECTS: where its
frames keep their context, function and bytecode slots, and the offsets of
JSFunction::shared and SharedFunctionInfo::function_data (from the object's
v8dbg_* symbols: unwind/v8_runtime.py). This module fills that map as the
run's objects load (unwind_objects.UnwindObjects asks `slot_of` of each): a
-c command's load closure before it runs, what -p and whole-machine
processes map, the objects the walk wants later (a node started during
the run). Nothing is done per process: a worker thread, a fork, a node
started during the run get their JS frames named from their first sample.

The JS frames' words are named in user space (symbols/v8.py), after the
run, when a process may be gone: so once a V8 object is known, the
functions the kernel saw (V8_FUNCTIONS, per process: they live in its
heap) are read every HARVEST_EVERY seconds while the run lives, and taken
out of the map (the kernel puts one back when it sees it again). Those
met only in a node's last HARVEST_EVERY seconds stay unnamed: node frees
its heap before it exits, so holding it at its exit (as a Python command
is, plan.held_at_exit) finds none of them readable."""
from __future__ import annotations

import struct

from ..unwind import v8_runtime
from .bpf_common import unwind_object
from .interpreter_objects import InterpreterMaps, InterpreterObjects

OBJECTS = 16                    # V8 objects (each node binary, libnode) known at once
FUNCTIONS = 1 << 16             # (tgid, function) seen since the last harvest, an LRU
HARVEST_EVERY = 0.1             # seconds between two reads of the functions seen
_FUNCTION_KEY = struct.Struct("<IIQ")      # struct v8_function_key


class V8Maps(InterpreterMaps):
    """v8.h's maps, shared by the run's unwinder programs; `lock` is held
    by whoever writes them, and by close()."""

    def __init__(self, objects: int = OBJECTS, functions: int = FUNCTIONS):
        super().__init__((("v8_objects", objects), ("v8_functions", functions)))


def pack_object(runtime: v8_runtime.Runtime) -> bytes:
    """V8_OBJECTS' value (struct v8_object) of a runtime."""
    layout = unwind_object().layout("v8_object")
    out = bytearray(layout.struct.size)
    at = layout.offsets
    for name in ("context", "function", "bytecode_array", "bytecode_offset"):
        struct.pack_into("<I", out, at["slot_" + name], runtime.slot("fp_" + name))
    for name in ("function_shared", "shared_function_data", "shared_name_or_scope_info"):
        struct.pack_into("<I", out, at[name], runtime.field(name))
    struct.pack_into("<I", out, at["present"], 1)
    return bytes(out)


class V8Objects(InterpreterObjects):
    """The run's V8 objects, in V8_OBJECTS, and the functions the kernel
    saw, read while their processes live. `functions`: the run's
    V8Functions (symbols/v8.py), or None; `objects`: the run's
    unwind_objects.UnwindObjects, which asks `slot_of` of each object it loads."""

    objects_map = "v8_objects"
    detect = staticmethod(v8_runtime.object_runtime)
    pack = staticmethod(pack_object)
    harvest_every = HARVEST_EVERY
    harvester_name = "ustack-v8-functions"

    def __init__(self, maps: V8Maps, functions=None, objects=None):
        super().__init__(maps)
        self.functions = functions
        self.runtimes = self.slot_paths     # V8_OBJECTS' slots: their paths
        if objects is not None:
            objects.v8 = self

    def wants_harvest(self) -> bool:
        return self.functions is not None

    def harvest(self) -> int:
        """Read the functions the kernel saw since last time, while their
        processes live; how many."""
        with self.maps.lock:
            if not self.maps.all:
                return 0
            try:
                keys = self.maps.v8_functions.keys()
                for key in keys:
                    self.maps.v8_functions.delete(key)
            except OSError:
                return 0
        if self.functions is not None:
            for key in keys:
                tgid, _pad, shared = _FUNCTION_KEY.unpack(key)
                try:
                    self.functions.remember(tgid, shared)
                except (OSError, ValueError, OverflowError):
                    pass    # gone, or moved already: its frames say so when named
        return len(keys)
