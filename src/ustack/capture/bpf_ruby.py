"""Ruby frames in the in-kernel walk: what user space does for
src/ustack/bpf/ruby.h.

The kernel merges the Ruby frames of a stack that went through a Ruby VM
object (libruby) whose rows point at its facts in RUBY_OBJECTS: where
rb_vm_exec is, how to reach the thread's execution context, and its
version's struct offsets (unwind/ruby_runtime.py). This module fills that
map as the run's objects load (unwind_objects.UnwindObjects asks `slot_of` of
each): a -c command's load closure before it runs, what -p and
whole-machine processes map, the objects the walk wants later (a ruby
started during the run). Nothing is done per process.

The Ruby frames' words are named in user space (symbols/ruby.py), after
the run, when a process may be gone: so once a Ruby VM object is known,
the iseqs the kernel saw (RUBY_ISEQS, per process) are read every
HARVEST_EVERY seconds while the run lives, and taken out of the map (the
kernel puts one back when it sees it again). Those met only in a ruby's
last HARVEST_EVERY seconds stay unnamed: ruby frees its iseqs as it
exits, so holding it at its exit (as a Python command is,
plan.held_at_exit) finds none of them readable."""
from __future__ import annotations

import struct

from ..unwind import ruby_runtime
from .bpf_common import unwind_object
from .interpreter_objects import InterpreterMaps, InterpreterObjects

OBJECTS = 16                    # Ruby VM objects known at once
ISEQS = 1 << 14                 # (tgid, iseq body) seen since the last harvest, an LRU
HARVEST_EVERY = 0.1             # seconds between two reads of the iseqs seen
_ISEQ_KEY = struct.Struct("<IIQ")       # struct ruby_iseq_key
_SEEN = struct.Struct("<QQ")           # struct ruby_iseq_seen: label, method entry
# struct ruby_object's fields that come from the version's layout
LAYOUT_FIELDS = ("ec_vm_stack", "ec_vm_stack_size", "ec_cfp", "cfp_pc", "cfp_iseq", "cfp_ep",
                 "cfp_size", "iseq_body", "body_iseq_encoded", "body_location",
                 "location_label")


class RubyMaps(InterpreterMaps):
    """ruby.h's maps, shared by the run's unwinder programs; `lock` is held
    by whoever writes them, and by close()."""

    def __init__(self, objects: int = OBJECTS, iseqs: int = ISEQS):
        super().__init__((("ruby_objects", objects), ("ruby_iseqs", iseqs)))


def pack_object(runtime: ruby_runtime.Runtime) -> bytes:
    """RUBY_OBJECTS' value (struct ruby_object) of a runtime."""
    layout = unwind_object().layout("ruby_object")
    out = bytearray(layout.struct.size)
    at = layout.offsets
    struct.pack_into("<Q", out, at["exec_start"], runtime.exec_start)
    struct.pack_into("<Q", out, at["exec_end"], runtime.exec_end)
    struct.pack_into("<Q", out, at["ec_module_got"], runtime.ec_module_got)
    struct.pack_into("<I", out, at["ec_tls_offset"], runtime.ec_tls_offset)
    for name in LAYOUT_FIELDS:
        struct.pack_into("<I", out, at[name], runtime.field(name))
    struct.pack_into("<I", out, at["present"], 1)
    return bytes(out)


class RubyObjects(InterpreterObjects):
    """The run's Ruby VM objects, in RUBY_OBJECTS, and the iseqs the kernel
    saw, read while their processes live. `iseqs`: the run's RubyIseqs
    (symbols/ruby.py), or None; `objects`: the run's
    unwind_objects.UnwindObjects, which asks `slot_of` of each object it loads."""

    objects_map = "ruby_objects"
    detect = staticmethod(ruby_runtime.object_runtime)
    pack = staticmethod(pack_object)
    harvest_every = HARVEST_EVERY
    harvester_name = "ustack-ruby-iseqs"

    def __init__(self, maps: RubyMaps, iseqs=None, objects=None):
        super().__init__(maps)
        self.iseqs = iseqs
        self.runtimes = self.slot_paths     # RUBY_OBJECTS' slots: their paths
        if objects is not None:
            objects.ruby = self

    def wants_harvest(self) -> bool:
        return self.iseqs is not None

    def harvest(self, wait: float = -1) -> int:
        """Read the iseqs the kernel saw since last time, while their
        processes live; how many. `wait`: seconds to wait for the maps'
        lock at most (-1: as long as it takes)."""
        if not self.maps.lock.acquire(timeout=wait):
            return 0
        try:
            if not self.maps.all:
                return 0
            seen = [(key, self.maps.ruby_iseqs.lookup(key))
                    for key in self.maps.ruby_iseqs.keys()]
            for key, _label in seen:
                self.maps.ruby_iseqs.delete(key)
        except OSError:
            return 0
        finally:
            self.maps.lock.release()
        if self.iseqs is not None:
            read = [(_ISEQ_KEY.unpack(key), _SEEN.unpack(value))
                    for key, value in seen if value is not None]
            # methods first: a block seen with its method is named by its class
            read.sort(key=lambda kv: kv[1][1] == 0)
            for (tgid, _pad, body), (label, method_entry) in read:
                try:
                    self.iseqs.remember(tgid, body, label, method_entry)
                except (OSError, ValueError, OverflowError):
                    pass    # gone: its frames say so when named
        return len(seen)
