"""A sampled thread's Python frames read from its live process, for stacks
the kernel copied (the perf backend): the user-space counterpart of the
in-kernel walk (bpf/python.h). The capture calls `read(pid, tid)` as each
sample comes off the ring, the nearest moment to the sample user space
has; the unwinder merges what it read (python_frames.merge_read), checked
against the sample's native stack. A stack the in-kernel walk deferred
(the BPF backend) may come with the chain the kernel read at the sample
(`chain()`, bpf/python.h python_deferred): `read` gives that one instead.

A PyThreadState names its thread by pthread_self(): on x86-64 glibc the
address of the thread's struct pthread, which holds the kernel's thread id
at a fixed offset, found once per process among its thread ids.

Not thread-safe: one thread (the capture's drain thread) calls it all."""
from __future__ import annotations

import struct
import time

from ..kernel import procfs
from ..kernel.procfs import ProcessMemory
from ..model import Mapping, UstackError, python_frame_parts
from .python_frames import (ID_CPU_BITS, USER_ID_CPU, code_identity, current_frame,
                            frame_groups, freed, identity_span, thread_states)
from .python_runtime import CODE_OFFSETS, ONE_PER_EVAL, find_interpreter

TID_OFFSET = 0x2D0          # glibc 2.x, x86-64: offsetof(struct pthread, tid)
TID_SCAN = 0x800            # else looked for in this many bytes of struct pthread
REREAD_S = 0.01             # a thread without a known state: its list re-read at most this often
MAX_PROCS = 1024            # processes followed at once
MAX_CODES = 1 << 14         # code objects remembered per process (then read anew)
TYPE_NAME = 24              # PyTypeObject.tp_name
MAX_CHAINS = 4096           # kernel-read chains waiting for their sample's record
PY_GROUP_END = 2            # bpf/python.h: a chain word's id after an eval call's frames
CHAIN_HEAD = 6              # bpf/python.h PY_CHAIN_HEAD: a chain's words before its frames
_HEAD = struct.Struct(f"<{CHAIN_HEAD}Q")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")

# what the header says of a run that reads them
HEADER_NOTE = "Python frames read from the process after each sample"
FREED = "a frame's code object was not one when read (freed, or the frame is damaged)"
UNREAD = "the thread's Python frames could not be read"
MOVED = "the thread ran on while its Python frames were read"


class _Process:
    """What is known of one Python process."""
    __slots__ = ("interp", "mem", "threads", "read_at", "tid_offset", "code_type",
                 "codes", "offsets", "span")

    def __init__(self, interp, mem: ProcessMemory):
        self.interp, self.mem = interp, mem
        self.threads: dict = {}         # tid -> PyThreadState address
        self.read_at = -1.0             # when the thread list was read
        self.tid_offset = None          # of the tid in struct pthread, once found
        self.code_type = 0              # PyCode_Type's address, once seen
        self.codes: dict = {}           # code address -> (identity, id)
        self.offsets = CODE_OFFSETS[interp.version]
        self.span = identity_span(self.offsets)


class LiveFrames:
    """`remember(pid, code, version, id, identity)`: told of each code
    object the first time it is seen (at an address, with an identity),
    so it is named while its process lives (symbols/python.PythonCode.
    remember). The frames read name it by that id (python_frames.py)."""

    def __init__(self, remember=None):
        self.remember = remember
        self._procs: dict = {}          # pid -> _Process, or None: no interpreter mapped
        self._chains: dict = {}         # tid -> (pid, sample time, words): chain()'s
        self._ids = 0                   # ids given

    def chain(self, pid: int, tid: int, at: int, words: bytes) -> None:
        """The Python frame chain the kernel read at the sample of time
        `at` whose deferred record follows (bpf/python.h python_deferred):
        what read(pid, tid, at) gives for that sample."""
        if len(self._chains) >= MAX_CHAINS:
            self._chains.clear()        # their samples' records were lost
        self._chains[tid] = (pid, at, words)

    def read(self, pid: int, tid: int, at: int | None = None) -> tuple | None:
        """(groups, note, eval ranges, current frame) of the thread at the
        sample of time `at`, as the kernel read it then (chain()), else now
        (model.PythonSample.python); None where it runs no Python."""
        kernel = self._chains.pop(tid, None)
        if kernel is not None and kernel[:2] == (pid, at):
            # all it needs is in the record: its process may have ended
            return kernel_chain(kernel[2])
        proc = self._process(pid)
        if proc is None:
            return None
        try:
            tstate = proc.threads.get(tid)
            if tstate is None:
                now = time.monotonic()
                if now - proc.read_at < REREAD_S:
                    return None
                proc.read_at = now
                self._read_threads(pid, proc)
                tstate = proc.threads.get(tid)
                if tstate is None:
                    return None
            # twice: a thread that runs meanwhile can make one read a torn
            # chain (a returning frame's slot reused by the next call's);
            # its instructions move on, its frames' code objects must not
            current = current_frame(proc.mem, proc.interp, tstate)
            groups, note = frame_groups(proc.mem, proc.interp, tstate)
            if not note:
                again, note = frame_groups(proc.mem, proc.interp, tstate)
                if (_codes(again) != _codes(groups)
                        or current_frame(proc.mem, proc.interp, tstate) != current):
                    note = MOVED
            if not note:
                note, groups = self._named(pid, proc, groups)
        except OSError:
            note, current = UNREAD, 0
        return (() if note else groups), note, proc.interp.eval_ranges, current

    def mapped(self, pid: int) -> None:
        """pid mapped an executable object: an interpreter not found before
        may be there now."""
        if pid in self._procs and self._procs[pid] is None:
            del self._procs[pid]

    def forget(self, pid: int) -> None:
        """pid exec'd or exited."""
        proc = self._procs.pop(pid, None)
        if proc is not None:
            proc.mem.close()

    def close(self) -> None:
        for pid in list(self._procs):
            self.forget(pid)

    def _process(self, pid: int) -> _Process | None:
        if pid in self._procs:
            return self._procs[pid]
        if len(self._procs) >= MAX_PROCS:
            self.forget(next(iter(self._procs)))
        proc = None
        try:
            interp = find_interpreter(procfs.executable_mappings(pid))
            if interp is not None:
                proc = _Process(interp, ProcessMemory(pid))
        except (OSError, ValueError, UstackError):
            proc = None
        self._procs[pid] = proc        # None until it maps an object (mapped())
        return proc

    def _read_threads(self, pid: int, proc: _Process) -> None:
        """Each thread's PyThreadState, by the thread's id."""
        states = thread_states(proc.mem, proc.interp)
        if proc.tid_offset is None:
            proc.tid_offset = _tid_offset(proc.mem, list(states), set(procfs.threads(pid)))
            if proc.tid_offset is None:
                return
        read = proc.mem.read
        proc.threads = {_U32.unpack(read(p + proc.tid_offset, 4))[0]: t
                        for p, t in states.items()}

    def _named(self, pid: int, proc: _Process, groups: tuple) -> tuple:
        """(note, groups): "" and the groups with each code object's
        address replaced by its id (as the kernel's words have it, shifted
        as model.python_frame_parts gives it) when every frame's code
        object is a live code object (each one first seen told to
        `remember`), else why not."""
        read = proc.mem.read
        out = []
        for group in groups:
            named = []
            for code, index in group:
                head = read(code, proc.span)
                ob_type = int.from_bytes(head[8:16], "little")
                if freed(head, code):
                    return FREED, ()
                if ob_type != proc.code_type:
                    if proc.code_type or not _is_code_type(proc.mem, ob_type):
                        return FREED, ()
                    proc.code_type = ob_type
                identity = code_identity(head, proc.offsets)
                known = proc.codes.get(code)
                if known is None or known[0] != identity:
                    if len(proc.codes) >= MAX_CODES:
                        proc.codes.clear()
                    self._ids += 1
                    known = proc.codes[code] = (identity,
                                                self._ids << ID_CPU_BITS | USER_ID_CPU)
                    if self.remember is not None:
                        self.remember(pid, code, proc.interp.version, known[1], identity)
                named.append((known[1] << 3, index))
            out.append(tuple(named))
        return "", tuple(out)


def kernel_chain(words: bytes) -> tuple:
    """(groups, note, eval ranges, current frame) of a PYTHON_CHAIN
    record's words (bpf/python.h python_deferred): CHAIN_HEAD words (the
    current frame's address, the eval function's two ranges, the layout's
    entry_kind), then a word per Python frame (its code object named by
    id, as LiveFrames names them), innermost first, and a PY_GROUP_END
    after each eval call's; up to 3.10 (ONE_PER_EVAL) every frame is a
    group of its own and has none. A deep chain's PY_CUT word (the frames
    left out between its ends) is a frame of the group it fell in (up to
    3.10: a group of its own)."""
    if len(words) < 8 * CHAIN_HEAD:
        return (), "the kernel's record of the Python frames is cut", (), 0
    current, start0, end0, start1, end1, entry_kind = _HEAD.unpack_from(words)
    ranges = tuple((a, b) for a, b in ((start0, end0), (start1, end1)) if b)
    return chain_groups(words[8 * CHAIN_HEAD:], entry_kind == ONE_PER_EVAL) + (ranges, current)


def chain_groups(words: bytes, one_per_eval: bool) -> tuple:
    """(groups, "") of a PYTHON_CHAIN record's frame words (kernel_chain)."""
    groups, group = [], []
    for (word,) in _U64.iter_unpack(words[:len(words) & ~7]):
        parts = python_frame_parts(word)
        if parts is None:
            continue
        if one_per_eval:
            groups.append((parts,))
        elif parts[0] == PY_GROUP_END << 3:
            groups.append(tuple(group))
            group = []
        else:
            group.append(parts)
    if group:
        groups.append(tuple(group))
    return tuple(groups), ""


def _codes(groups: tuple) -> tuple:
    return tuple(tuple(code for code, _index in group) for group in groups)


def runs_python(target) -> bool:
    """Whether a run's target (target/process.py's) runs CPython, or may:
    a -p process that maps an interpreter, a -c command whose executable's
    load closure holds one, any process of a system-wide run."""
    if target.scope == "pid":
        mappings = procfs.executable_mappings(target.pid)
    elif target.scope == "command":
        from ..objfile.needed import load_closure
        from ..target.process import executable
        exe = executable(target.argv)
        mappings = [Mapping(0, 1, 0, path) for path in (load_closure(exe) if exe else ())]
    else:
        return True
    try:
        return any(find_interpreter([m]) is not None for m in mappings)
    except (OSError, ValueError, UstackError):
        return False


def _is_code_type(mem: ProcessMemory, ob_type: int) -> bool:
    """Whether the type object at ob_type is named "code"."""
    try:
        return mem.read(mem.word(ob_type + TYPE_NAME), 5) == b"code\0"
    except OSError:
        return False


def _tid_offset(mem: ProcessMemory, pthreads: list, tids: set) -> int | None:
    """Where struct pthread keeps the thread's id: glibc's offset if every
    Python thread's pthread holds one of the process's tids there, else
    the first offset where they all do; None if none does."""
    if not pthreads or not tids:
        return None
    try:
        heads = [mem.read(p, TID_SCAN) for p in pthreads]
    except OSError:
        return None
    for off in (TID_OFFSET,) + tuple(range(0, TID_SCAN, 4)):
        if all(_U32.unpack_from(h, off)[0] in tids for h in heads):
            return off
    return None


def read_with(capture, python_code, target) -> None:
    """The copy path (perf, DWARF): the capture reads the Python frames of
    each sample's thread from its process as it drains (what the bpf
    backend's walk does in the kernel); the header says so when the
    target runs CPython."""
    python_code.by_id = True        # the frames read name code objects by id
    capture.python_frames = LiveFrames(python_code.remember)
    if runs_python(target):
        capture.unwind_note = HEADER_NOTE


def wire(capture, python_code, target, plan) -> None:
    """Where a capture's copied stacks get their Python frames: read with
    each sample (perf's DWARF copies), or from the process as a BPF
    capture decodes the stacks the kernel handed over unwalked (a new
    process's first samples, objects whose rows are still loading)."""
    if plan.backend == "perf" and "dwarf" in plan.modes:
        read_with(capture, python_code, target)
    elif getattr(capture, "defers_stacks", False) or getattr(capture, "reads_python_frames",
                                                             False):
        capture.python_frames = LiveFrames(python_code.remember)
