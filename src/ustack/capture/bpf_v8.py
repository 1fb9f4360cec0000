"""JS frames in the in-kernel walk: what user space does for
src/ustack/bpf/v8.h.

The kernel names the JS frames of a process in V8_PROCS: tgid -> where its
V8 keeps a frame's context, function and bytecode slots, and the offsets of
JSFunction::shared and SharedFunctionInfo::function_data (from node's
v8dbg_* symbols: unwind/v8_runtime.py). This module fills that map: for a
-p target, or every process of a system-wide run, at start; for any
process later when an MMAP2 record shows it mapping node (a -c command's
exec, a fork that execs node); it drops a process at its exec and its exit.
The JS frames' words are named in user space (symbols/v8.py), after the
run, when a process may be gone: so the functions the kernel saw
(V8_FUNCTIONS) are read every HARVEST_EVERY seconds while the run lives, and
taken out of the map (the kernel puts one back when it sees it again)."""
from __future__ import annotations

import struct
import threading
import time

from ..interrupt import NEVER
from ..kernel import bpf_syscall, procfs
from ..model import CommEvent, ExitEvent, MmapEvent
from ..unwind import v8_runtime
from .bpf_common import unwind_object
from .fork_safe_lock import ForkSafeLock

PROCS = 1024                    # V8 processes followed at once
FUNCTIONS = 1 << 16             # (tgid, function) seen since the last harvest, an LRU
HARVEST_EVERY = 0.1             # seconds between two reads of the functions seen
_TGID = struct.Struct("<I")
_FUNCTION_KEY = struct.Struct("<IIQ")      # struct v8_function_key


class V8Maps(bpf_syscall.MapSet):
    """v8.h's map, shared by the run's unwinder programs; `lock` is held
    by whoever writes it, and by close()."""

    def __init__(self, procs: int = PROCS, functions: int = FUNCTIONS):
        super().__init__()
        self.lock = ForkSafeLock()
        try:
            self.v8_procs = unwind_object().make_map("v8_procs", procs)
            self.all.append(self.v8_procs)
            self.v8_functions = unwind_object().make_map("v8_functions", functions)
            self.all.append(self.v8_functions)
        except BaseException:
            self.close()
            raise

    def named(self) -> dict:
        return {"v8_procs": self.v8_procs, "v8_functions": self.v8_functions}

    def close(self) -> None:
        with self.lock:
            super().close()


def pack_proc(runtime: v8_runtime.Runtime) -> bytes:
    """V8_PROCS' value (struct v8_proc) of a runtime."""
    layout = unwind_object().layout("v8_proc")
    out = bytearray(layout.struct.size)
    at = layout.offsets
    for name in ("context", "function", "bytecode_array", "bytecode_offset"):
        struct.pack_into("<I", out, at["slot_" + name], runtime.slot("fp_" + name))
    for name in ("function_shared", "shared_function_data", "shared_name_or_scope_info"):
        struct.pack_into("<I", out, at[name], runtime.field(name))
    return bytes(out)


class V8Procs:
    """The processes whose JS frames are named, in V8_PROCS."""

    def __init__(self, maps: V8Maps, functions=None):
        self.maps = maps
        self.functions = functions      # the run's V8Functions (symbols/v8.py), or None
        self.followed: set = set()
        self._harvester = None

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

    def _harvest_while_open(self) -> None:
        while self.maps.all:
            self.harvest()
            time.sleep(HARVEST_EVERY)

    def _start_harvest(self) -> None:
        if self._harvester is None and self.functions is not None:
            self._harvester = threading.Thread(target=self._harvest_while_open, daemon=True,
                                               name="ustack-v8-functions")
            self._harvester.start()

    def add(self, pid: int, mappings: list | None = None) -> bool:
        """Follow pid's V8, if it maps one (`mappings`: those to look in,
        else its /proc/PID/maps); whether it does."""
        if mappings is None:
            mappings = procfs.executable_mappings(pid)
        try:
            runtime = v8_runtime.find_runtime(mappings)
        except (OSError, ValueError):
            runtime = None
        if runtime is None:
            return False
        with self.maps.lock:
            if not self.maps.all:
                return False        # the run has ended
            try:
                self.maps.v8_procs.update(_TGID.pack(pid), pack_proc(runtime))
            except OSError:
                return False        # the map is full: its JS frames stay as walked
        self.followed.add(pid)
        self._start_harvest()
        return True

    def warm(self, paths: list) -> bool:
        """Read now whether a -c command's load closure holds a V8, so its
        MMAP2 record adds it at once."""
        return v8_runtime.runs_v8(paths)

    def forget(self, pid: int) -> bool:
        if pid not in self.followed:
            return False
        self.followed.discard(pid)
        with self.maps.lock:
            try:
                if self.maps.all:
                    self.maps.v8_procs.delete(_TGID.pack(pid))
            except OSError:
                pass
        return True

    def watch_command(self, pid: int, armed, seconds: float = 1.5) -> None:
        """A -c command's V8, added as soon as it is mapped (its MMAP2
        record is read later): in the background, once `armed` says the
        command has exec'd, its maps are read every few ms for `seconds`."""
        threading.Thread(target=self._watch, args=(pid, armed, seconds), daemon=True,
                         name="ustack-v8-watch").start()

    def _watch(self, pid: int, armed, seconds: float) -> None:
        end = time.monotonic() + seconds
        try:
            while not int.from_bytes(armed.lookup(bytes(4)) or bytes(8), "little"):
                if time.monotonic() > end + 60 or not self.maps.all:
                    return
                time.sleep(0.001)
            end = time.monotonic() + seconds
            while time.monotonic() < end and self.maps.all and pid not in self.followed:
                if self.add(pid):
                    return
                time.sleep(0.002)
        except OSError:             # the map closed under us: the run ended
            return

    def add_running(self, pids: list, interrupt=NEVER) -> None:
        for pid in pids:
            interrupt.check()
            self.add(pid)

    def follow(self, metas: list) -> None:
        """Keep the map in step with the stream's records: node mapped, an
        exec, an exit."""
        for _time, event in metas:
            if isinstance(event, MmapEvent):
                if event.pid not in self.followed:
                    self.add(event.pid, [event.mapping])
            elif isinstance(event, CommEvent) and event.exec and self.forget(event.pid):
                self.add(event.pid)
            elif isinstance(event, ExitEvent) and event.pid == event.tid:
                self.forget(event.pid)
