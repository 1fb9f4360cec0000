"""JS frames of the stacks the kernel hands to user space unwalked (its
deferred records: a process's first samples while its mappings or node's
rows are not in the kernel yet, an object whose rows did not fit the
table), named as the kernel's pass (bpf/v8.h) names the stacks it walks:
each such stack is unwound from its copy as it comes off the ring, while
its process lives, and `name` turns its JS frames into JS words
(model.v8_frame_word).

A frame walked on its frame pointer (JIT code, V8's builtins: code
without CFI) in a process whose stack holds a V8 object's frames is a JS
frame when the slots below its frame pointer, in the copy (as they were
at the sample), hold a context (a heap object, not a typed frame's
marker) and a JSFunction whose shared field, read from the process now,
is a SharedFunctionInfo by its map. Interpreted where its BytecodeArray
slot is its function's function_data and its offset slot a Smi. Anything
else leaves the frame as walked, never a guess. `remember(pid, shared)`
is told of each function named, so it is read while its process lives
(symbols/v8.V8Functions.remember).

Not thread-safe: the thread that unwinds the deferred stacks calls it all."""
from __future__ import annotations

import struct

from ..kernel.procfs import ProcessMemory
from ..model import V8_NO_OFFSET, v8_frame_word
from ..objfile.mapped import object_path
from . import v8_runtime
from .runtime_files import may_be

MAX_PROCS = 256                 # processes whose memory is kept open
_Q = struct.Struct("<Q")
_SLOTS = struct.Struct(f"<{v8_runtime.SLOTS}Q")
# the innermost frame's first instructions (push rbp; mov rbp, rsp) or its
# ret: its frame pointer is its caller's, or its slots are gone
_PROLOGUE = (b"\x55", b"\x48\x89\xe5")
_RET = (0xC3, 0xC2)


def _heap(v: int) -> bool:
    return v & 3 == 1 and 0 < v < 1 << 47


class _Process:
    __slots__ = ("pid", "runtime", "f", "mem")

    def __init__(self, pid: int, runtime: v8_runtime.Runtime, mem: ProcessMemory):
        self.pid, self.runtime, self.mem = pid, runtime, mem
        self.f = dict(runtime.layout)


class V8Live:
    """The JS frames of copied stacks, per process as each is met."""

    def __init__(self, remember=None):
        self.remember = remember
        self._procs: dict = {}          # pid -> _Process

    def name(self, pid: int, addrs: tuple, fps: list, stack: bytes, sp0: int,
             find) -> tuple:
        """`addrs` with each JS frame's address replaced by its JS word;
        `fps`: each frame's frame pointer where it was walked on it, else 0
        (dwarf.DwarfUnwinder.unwind's); `find(addr)`: pid's mapping there."""
        if not any(fps):
            return addrs
        proc = self._process(pid, addrs, fps, find)
        if proc is None:
            return addrs
        out = list(addrs)
        try:
            for i, fp in enumerate(fps):
                if fp:
                    word = self._frame(proc, fp, stack, sp0, addrs[0] if i == 0 else 0)
                    if word:
                        out[i] = word
        except OSError:                 # the process is gone, or another has its pid
            self.forget(pid)
            return addrs
        return tuple(out)

    def forget(self, pid: int) -> None:
        proc = self._procs.pop(pid, None)
        if proc is not None:
            proc.mem.close()

    def close(self) -> None:
        for pid in list(self._procs):
            self.forget(pid)

    def _process(self, pid: int, addrs: tuple, fps: list, find) -> _Process | None:
        """pid's V8, from a V8 object among the frames walked on their
        frame pointer (node's builtins); None where none is."""
        proc = self._procs.get(pid)
        if proc is not None:
            return proc
        runtime = None
        for addr, fp in zip(addrs, fps):
            m = find(addr) if fp else None
            path = object_path(m) if m is not None else None
            if path and may_be("v8", path):
                runtime = v8_runtime.object_runtime(path)
                if runtime is not None:
                    break
        if runtime is None:
            return None
        try:
            mem = ProcessMemory(pid)
        except OSError:
            return None
        if len(self._procs) >= MAX_PROCS:
            self.forget(next(iter(self._procs)))
        proc = self._procs[pid] = _Process(pid, runtime, mem)
        return proc

    def _frame(self, proc: _Process, fp: int, stack: bytes, sp0: int, pc: int) -> int:
        """The JS word of the frame whose frame pointer is fp, 0 where its
        slots are not a JS frame's; pc: the innermost frame's own, else 0."""
        at = fp - 8 * v8_runtime.SLOTS - sp0
        if at < 0 or fp - sp0 > len(stack):
            return 0
        below = _SLOTS.unpack_from(stack, at)
        rt, f, mem = proc.runtime, proc.f, proc.mem
        if pc and not self._pushed(mem, pc, sp0, fp, rt.slot("fp_function")):
            return 0
        if not _heap(below[rt.slot("fp_context")]):
            return 0                    # a typed frame's marker: a stub, an entry, an exit
        function = below[rt.slot("fp_function")]
        if not _heap(function):
            return 0
        shared = mem.word(function - 1 + f["function_shared"])
        if not _heap(shared):
            return 0
        kind = mem.word(shared - 1 + f["heap_object_map"])
        if not _heap(kind) or struct.unpack("<H", mem.read(
                kind - 1 + f["map_instance_type"], 2))[0] != f["type_shared_function_info"]:
            return 0
        index = V8_NO_OFFSET
        bytecode = below[rt.slot("fp_bytecode_array")]
        offset = below[rt.slot("fp_bytecode_offset")]
        if _heap(bytecode) and not offset & 0xFFFFFFFF \
                and (not pc or self._pushed(mem, pc, sp0, fp, rt.slot("fp_bytecode_offset"))) \
                and mem.word(shared - 1 + f["shared_function_data"]) == bytecode:
            index = min(offset >> 32, V8_NO_OFFSET - 1)
        if self.remember is not None:
            try:
                self.remember(proc.pid, shared)
            except (OSError, ValueError, OverflowError):
                pass
        return v8_frame_word(shared, index)

    @staticmethod
    def _pushed(mem: ProcessMemory, pc: int, sp: int, fp: int, slot: int) -> bool:
        """Whether the innermost frame has pushed its slots up to `slot`
        and not begun to leave (v8.h's v8_slots_pushed)."""
        if sp > fp - 8 * (v8_runtime.SLOTS - slot):
            return False
        code = mem.read(pc, 3)
        return not (code.startswith(_PROLOGUE) or code[0] in _RET)
