"""Ruby, PHP and Perl frames of the stacks ustack unwinds itself from their
copies (the kernel's deferred records: a process's first samples while its
rows load, an object whose rows did not fit; perf's DWARF copies), put
where the kernel's passes (bpf/ruby.h, php.h, perl.h) put them in the
stacks it walks: each native frame of the interpreter's VM function
(rb_vm_exec, execute_ex, Perl_runops_standard) is replaced by the script
frames of its VM call, innermost first, in the same words
(model.ruby_frame_word, php's, perl_frame_word), named by the same
tables (symbols/ruby.py, php.py, perl.py).

The kernel reads the script frames at the sample; here they are read from
the live process as the stack is unwound, moments later (the unwinder
runs as each sample comes off the ring, 0.3 ms after it at the median
behind the BPF ring, 4 ms behind perf's): kept only where two reads in a
row give the same frames (their lines aside), the groups pair one to one
with the stack's VM frames, and the read does not find the thread in a C
function where the sample found it running script code (agrees); a read
that does not is tried again twice, READS in all (the thread runs on: the
state read is of another moment, as the first was, and passes the same
checks), else the VM calls stay C frames, never a guessed frame. Each
runtime says only how to find its VM in an object (detect, vm_range) and
how to read a thread's frame groups (read): unwind/ruby_live.py,
php_live.py, perl_live.py.

Not thread-safe: the thread that unwinds the copied stacks calls it all."""
from __future__ import annotations

import time

from ..kernel.procfs import ProcessMemory
from ..model import LOWEST_FRAME_TAG
from ..objfile.elf import ElfImage
from ..objfile.mapped import object_path

MAX_PROCS = 256                 # processes whose memory is kept open
MAX_OBJECTS = 4096              # objects whose runtime (or none) is remembered
LINE_BITS = 0xFFFF              # a word's line or pc index: what moves between two reads
READS = 3                       # reads of a thread that did not agree with its sample, at most
REREAD_S = 0.0002               # the wait between two of them


class ScriptRuntime:
    """One runtime's reader (ruby_live.RubyLive, ...)."""

    def detect(self, path: str):
        """The runtime's facts of the object at `path`, or None."""
        raise NotImplementedError

    def vm_range(self, facts) -> tuple:
        """(start, end) ELF addresses of the VM function."""
        raise NotImplementedError

    def open(self, pid: int, facts, bias: int, mem: ProcessMemory):
        """What is kept of one process running it."""
        raise NotImplementedError

    def read(self, proc, pid: int, tid: int) -> list | None:
        """The thread's frame groups, innermost first: one tuple of frame
        words per VM call; None where they cannot be read."""
        raise NotImplementedError

    def named(self, proc, pid: int) -> None:
        """Tell the names tables of the frames the last read kept."""

    def agrees(self, proc, innermost: int) -> bool:
        """Whether the last read can be the thread's state at the sample,
        whose innermost VM frame is at index `innermost` of its stack (0:
        the sample's pc is in the VM function): a read done while the
        thread waits (descheduled at a system call) finds it in a C
        function where the sample saw it run script code."""
        return True


class ScriptLive:
    """The unwinder's hook: merge() puts the script frames of a copied
    stack in place."""

    def __init__(self, runtimes: list):
        self.runtimes = list(runtimes)
        self._objects: dict = {}        # path -> (runtime, facts) or None
        self._biases: dict = {}         # (path, start, pgoff) -> load bias
        self._procs: dict = {}          # (pid, runtime) -> its state, or None

    def merge(self, pid: int, tid: int, addrs: tuple, find, cut: bool = False) -> tuple:
        """`addrs` (innermost first, return addresses but the first) with
        each VM frame replaced by its VM call's script frames where they
        were read; `find(addr)`: pid's mapping there, or None; `cut`: the
        stack ends short of its root (its outer VM frames are not there:
        the groups pair from the inner end, as the kernel's passes pair a
        stack cut short)."""
        found = self._vm_frames(addrs, find)
        if found is None:
            return addrs
        runtime, facts, bias, at = found
        proc = self._process(pid, runtime, facts, bias)
        if proc is None:
            return addrs
        try:
            for attempt in range(READS):
                if attempt:
                    time.sleep(REREAD_S)    # the thread runs on: another moment
                groups = runtime.read(proc, pid, tid)
                if groups is None:
                    return addrs
                if cut:
                    groups = groups[:len(at)]
                if len(groups) != len(at) or not runtime.agrees(proc, at[0]):
                    continue
                again = runtime.read(proc, pid, tid) or []
                if _moving(groups) == _moving(again[:len(at)] if cut else again):
                    runtime.named(proc, pid)
                    return place(addrs, at, groups)
        except OSError:                 # the process is gone, or another has its pid
            self.forget(pid)
        return addrs

    def forget(self, pid: int) -> None:
        for key in [k for k in self._procs if k[0] == pid]:
            proc = self._procs.pop(key)
            if proc is not None:
                proc.mem.close()

    def close(self) -> None:
        for pid in {k[0] for k in self._procs}:
            self.forget(pid)

    def _vm_frames(self, addrs: tuple, find):
        """(runtime, facts, bias, indexes of the VM function's frames) of
        the first runtime whose VM function is in the stack, or None."""
        for i, addr in enumerate(addrs):
            if addr >= LOWEST_FRAME_TAG:
                continue
            pc = addr - 1 if i else addr        # a return address: the call is before it
            m = find(pc)
            path = object_path(m) if m is not None else None
            known = self._object(path) if path else None
            if known is None:
                continue
            runtime, facts = known
            bias = self._bias(path, m)
            if bias is None:
                continue
            start, end = runtime.vm_range(facts)
            start, end = start + bias, end + bias
            at = [j for j, a in enumerate(addrs)
                  if a < LOWEST_FRAME_TAG and start <= (a - 1 if j else a) < end]
            if at:
                return runtime, facts, bias, at
        return None

    def _object(self, path: str):
        if path not in self._objects:
            if len(self._objects) >= MAX_OBJECTS:
                self._objects.clear()
            found = None
            for runtime in self.runtimes:
                facts = runtime.detect(path)
                if facts is not None:
                    found = (runtime, facts)
                    break
            self._objects[path] = found
        return self._objects[path]

    def _bias(self, path: str, m) -> int | None:
        key = (path, m.start, m.pgoff)
        if key not in self._biases:
            try:
                vaddr = ElfImage.open(path).vaddr_of_file_offset(m.pgoff)
            except (OSError, ValueError):
                vaddr = None
            if len(self._biases) >= MAX_OBJECTS:
                self._biases.clear()
            self._biases[key] = None if vaddr is None else m.start - vaddr
        return self._biases[key]

    def _process(self, pid: int, runtime, facts, bias: int):
        key = (pid, runtime)
        if key in self._procs:
            return self._procs[key]
        if len(self._procs) >= MAX_PROCS:
            old = next(iter(self._procs))
            proc = self._procs.pop(old)
            if proc is not None:
                proc.mem.close()
        try:
            mem = ProcessMemory(pid)
        except OSError:
            return None
        try:
            proc = runtime.open(pid, facts, bias, mem)
        except OSError:
            proc = None
        if proc is None:
            mem.close()
        self._procs[key] = proc
        return proc


def _moving(groups) -> tuple:
    """The groups' frames without what moves as a thread runs on (a line,
    a pc index)."""
    return tuple(tuple(w & ~LINE_BITS for w in g) for g in groups)


def place(addrs: tuple, at: list, groups: list) -> tuple:
    """`addrs` with the VM frames at indexes `at` (innermost first) replaced
    by `groups`, one each, innermost first; `addrs` as they are where the
    counts differ (the kernel's passes pair what they read at the sample
    by their runtime's rule; a read moments later that does not pair one
    to one may be of another moment). A group without a frame leaves its
    VM frame as it is."""
    if len(groups) != len(at):
        return addrs
    by_index = dict(zip(at, groups))
    out: list = []
    for i, addr in enumerate(addrs):
        group = by_index.get(i)
        if group:
            out.extend(group)
        else:
            out.append(addr)
    return tuple(out)
