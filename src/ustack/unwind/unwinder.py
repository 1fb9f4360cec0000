"""The unwind stage's one entry: a RawSample to return addresses, by the
frame-pointer repair (fp.py) or the DWARF unwinder (dwarf.py), whichever the
sample's content calls for (the capture copied a stack, or the kernel
walked the frame pointers). Also says what tells two raw stacks apart, so
callers unwind and symbolize each distinct stack once."""
from __future__ import annotations

import os
from collections.abc import Callable

from ..model import (FTRACE_STACK_FULL, FTRACE_STACK_FULL_NOTE,
                     KERNEL_UNWIND_REASONS, KERNEL_UNWIND_STOP,
                     KERNEL_UNWIND_WHOLE, Mapping, PythonSample, RawSample,
                     UnwoundSample, perl_frame_parts, php_frame_parts, python_frame_parts,
                     ruby_frame_parts, v8_frame_parts)
from .fp import frame_pointer_stack

FindMapping = Callable[[int, int], Mapping]     # (pid, addr) -> the mapping, or None


class Unwinder:
    """Keep one per run: the DWARF unwinder's caches live here."""

    def __init__(self, debug_dirs=(), cut_advice: str | None = None):
        """cut_advice: what a stack cut short by its copy's size tells the
        user to do (the capture knows whether a larger copy can help; None:
        raise --stack-size)."""
        self._debug_dirs = debug_dirs
        self._cut_advice = cut_advice
        self._dwarf = None
        # a v8_live.V8Live: the JS frames of copied stacks named from their
        # process as they are unwound (the kernel's deferred ones), or None
        self.v8_live = None
        # a hotspot_live.HotSpotLive: a JVM's copied stacks walked through
        # its Java frames (no frame pointers, no CFI there), or None
        self.hotspot = None
        # hotspot_factory(pid) makes self.hotspot at a copied stack of a JVM
        # (None for another process's: asked again at the next copy)
        self.hotspot_factory = None
        # a script_live.ScriptLive: the Ruby, PHP and Perl frames of copied
        # stacks read from their process as they are unwound, or None
        self.script_live = None
        # sets v8_live and script_live at each copied stack, once their
        # runtime is met: a run whose stacks the kernel walked, or that met
        # no runtime, never imports their readers
        self.live_factory = None

    def close(self) -> None:
        """The run is over: the live readers let go of the processes they
        read (their /proc/PID/mem descriptors); one asked again opens anew."""
        for reader in (self.v8_live, self.hotspot, self.script_live):
            if reader is not None:
                reader.close()

    @property
    def dwarf(self):
        """The DWARF unwinder (dwarf.py), made for the first copied stack:
        a run whose stacks the kernel walked never imports it and its CFI
        interpreter (~1.5 ms of a short run's start)."""
        if self._dwarf is None:
            from .dwarf import RAISE_STACK_SIZE, DwarfUnwinder
            self._dwarf = DwarfUnwinder(debug_dirs=self._debug_dirs,
                                        cut_advice=self._cut_advice or RAISE_STACK_SIZE)
        return self._dwarf

    @property
    def warnings(self) -> list:
        """Debug files refused while looking for CFI, one sentence each."""
        return self._dwarf.warnings if self._dwarf is not None else []

    def unwind(self, sample: RawSample, find: FindMapping) -> tuple:
        """(return addresses innermost first, notes) of one sample."""
        return self.unwind_key(sample.pid, self.stack_key(sample, find), find)

    def stack_key(self, sample: RawSample, find: FindMapping) -> tuple:
        """What tells raw stacks apart before symbolization, as a pair: the
        callchain and return address of a frame-pointer sample (never its
        fetch-arg values), unwound later, once per distinct stack; or the
        (addresses, notes) of a DWARF sample, unwound now, since its stack
        copy is nearly always unique, or that of a sample unwound already
        (UnwoundSample: a DWARF sample unwound while it was recorded).
        A PythonSample's Python frames take the place of the eval
        function's C frames they ran."""
        if sample.regs is not None:
            pid = sample.pid
            find_pid = lambda addr: find(pid, addr)       # noqa: E731
            stack = sample.stack or b""
            python = type(sample) is PythonSample
            if self.hotspot_factory is not None:
                self.hotspot = self.hotspot_factory(pid)
                if self.hotspot is not None:
                    self.hotspot_factory = None
            if self.live_factory is not None:
                self.live_factory(self)
            if self.hotspot is not None and not python:
                walked = self.hotspot.unwind(pid, sample.regs, stack, find_pid, self.dwarf)
                if walked is not None:
                    return walked
            if not python and self.v8_live is None and self.script_live is None:
                return self.dwarf.unwind(sample.regs, stack, find_pid)
            sps: list = []
            fps: list | None = [] if self.v8_live is not None else None
            addrs, notes = self.dwarf.unwind(sample.regs, stack, find_pid, sps, fps)
            if fps:
                addrs = self.v8_live.name(pid, addrs, fps, stack, sample.regs["sp"], find_pid)
            if not python:
                if self.script_live is not None:
                    addrs = self.script_live.merge(pid, sample.tid, addrs, find_pid,
                                                   cut=bool(notes))
                return addrs, notes
            from .dwarf import TRUNCATED      # loaded already: self.dwarf
            from .python_frames import merge_read     # a Python sample's (not a short run's)
            addrs, merged = merge_read(addrs, sample.python, not notes, sample.regs,
                                       stack, sps, copy_cut=bool(notes) and all(
                                           n.startswith(TRUNCATED) for n in notes))
            return addrs, notes + merged
        if type(sample) is UnwoundSample:      # unwound when it was recorded
            return sample.unwound
        return sample.callchain, sample.return_address

    def unwind_key(self, pid: int, key: tuple, find: FindMapping) -> tuple:
        """(addresses, notes) of a stack_key()."""
        first, second = key
        if isinstance(first, tuple):
            return key                      # a DWARF sample: already unwound
        addrs = frame_pointer_stack(first, second,
                                    lambda addr: find(pid, addr) is not None)
        if addrs and addrs[-1] == FTRACE_STACK_FULL:
            return addrs[:-1], (FTRACE_STACK_FULL_NOTE,)
        if addrs and addrs[-1] & ~0xFF == KERNEL_UNWIND_STOP:
            if addrs[-1] & 0xFF in KERNEL_UNWIND_WHOLE:
                return addrs[:-1], (KERNEL_UNWIND_WHOLE[addrs[-1] & 0xFF],)
            return addrs[:-1], (_stop_note(addrs[:-1], addrs[-1], pid, find),)
        return addrs, ()


def _stop_note(addrs: tuple, marker: int, pid: int, find: FindMapping) -> str:
    """Why the kernel's DWARF walk stopped after addrs, for the stack."""
    why = KERNEL_UNWIND_REASONS.get(marker & 0xFF, f"reason {marker & 0xFF}")
    # where the walk was: not a Python, JS, PHP, Perl or Ruby frame's tagged word
    native = [a for a in addrs if python_frame_parts(a) is None and v8_frame_parts(a) is None
              and php_frame_parts(a) is None and perl_frame_parts(a) is None
              and ruby_frame_parts(a) is None]
    m = find(pid, native[-1] - (1 if len(native) > 1 else 0)) if native else None
    if m is None:
        where = "[unknown]"
    elif m.path.startswith("/") and m.path != "//anon":
        where = os.path.basename(m.path)
    else:
        where = "anonymous memory" if m.path in ("", "//anon") else m.path
    return f"stack cut at {where}: {why}"
