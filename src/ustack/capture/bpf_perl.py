"""Perl frames in the in-kernel walk: what user space does for
src/ustack/bpf/perl.h.

The kernel merges the Perl frames of a stack that went through a Perl
interpreter object (Debian's perl executable, or libperl) whose rows point
at its facts in PERL_OBJECTS: its version's layout and the ELF addresses of
PL_curinterp, PL_thr_key and the run loop (unwind/perl_runtime.py). This
module fills that map as the run's objects load (unwind_objects.UnwindObjects
asks `slot_of` of each): a -c command's load closure before it runs, what
-p and whole-machine processes map, the objects the walk wants later (a
perl started during the run). Nothing is done per process.

The kernel copies each sub's name, package and file into PERL_SUBS as it
meets the sub, so naming needs nothing of the process: they are taken out
every HARVEST_EVERY seconds while the run lives (the kernel puts one back
when it meets it again), and a last time as the maps close, into the
run's PerlSubs (symbols/perl.py)."""
from __future__ import annotations

import struct

from ..unwind import perl_runtime
from .bpf_common import unwind_object
from .interpreter_objects import InterpreterMaps, InterpreterObjects

OBJECTS = 16                    # Perl objects (each perl, libperl) known at once
SUBS = 1 << 14                  # (tgid, sub) seen since the last harvest, an LRU
HARVEST_EVERY = 0.1             # seconds between two reads of the subs seen
_SUB_KEY = struct.Struct("<IIQ")          # struct perl_sub_key


def _text(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


class PerlMaps(InterpreterMaps):
    """perl.h's maps, shared by the run's unwinder programs; `lock` is held
    by whoever writes them, and by close(). `before_close`: called once
    as they close (the last harvest)."""

    def __init__(self, objects: int = OBJECTS, subs: int = SUBS):
        super().__init__((("perl_objects", objects), ("perl_subs", subs)))


def pack_object(interp: perl_runtime.Interpreter) -> bytes:
    """PERL_OBJECTS' value (struct perl_object) of an interpreter."""
    obj = unwind_object()
    out = bytearray(obj.layout("perl_object").struct.size)
    at = obj.layout("perl_object").offsets
    for name, v in interp.layout:
        struct.pack_into("<I", out, at["layout." + name], v)
    major, minor, patch = interp.version
    struct.pack_into("<I", out, at["version"], major << 16 | minor << 8 | patch)
    struct.pack_into("<Q", out, at["curinterp"], interp.curinterp)
    struct.pack_into("<Q", out, at["thr_key"], interp.thr_key)
    struct.pack_into("<Q", out, at["runops_start"], interp.run_loop[0])
    struct.pack_into("<Q", out, at["runops_end"], interp.run_loop[1])
    return bytes(out)


class PerlObjects(InterpreterObjects):
    """The run's Perl objects, in PERL_OBJECTS, and the subs the kernel
    named. `subs`: the run's PerlSubs (symbols/perl.py), or None;
    `objects`: the run's unwind_objects.UnwindObjects, which asks `slot_of` of
    each object it loads."""

    objects_map = "perl_objects"
    detect = staticmethod(perl_runtime.object_interpreter)
    pack = staticmethod(pack_object)
    harvest_every = HARVEST_EVERY
    harvester_name = "ustack-perl-subs"

    def __init__(self, maps: PerlMaps, subs=None, objects=None):
        super().__init__(maps)
        self.subs = subs
        self.paths = self.slot_paths    # PERL_OBJECTS' slots: their paths
        maps.before_close = self.harvest
        if objects is not None:
            objects.perl = self

    def wants_harvest(self) -> bool:
        return self.subs is not None

    def harvest(self) -> int:
        """Take the subs the kernel named since last time; how many."""
        with self.maps.lock:
            if not self.maps.all:
                return 0
            try:
                items = self.maps.perl_subs.items(take=True)
            except OSError:
                return 0
        if self.subs is not None:
            layout = unwind_object().layout("perl_sub").offsets
            name, package, file = layout["name"], layout["package"], layout["file"]
            for key, v in items:
                tgid, _pad, cv = _SUB_KEY.unpack(key)
                self.subs.remember(tgid, cv, _text(v[name:package]),
                                   _text(v[package:file]), _text(v[file:]))
        return len(items)
