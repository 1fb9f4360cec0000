"""Python frames in the in-kernel walk: what user space does for
src/ustack/bpf/python.h.

The kernel merges a thread's Python frames into its native stack when the
walk went through an interpreter object (the python executable, or
libpython) whose rows point at its facts in PYTHON_OBJECTS: the version's
state layout, the ELF addresses of _PyRuntime and of the eval function,
the version. This module fills that map as the run's objects load
(unwind_objects.UnwindObjects asks `slot_of` of each): a -c command's load
closure before it runs, what -p and whole-machine processes map, the
objects the walk wants later (a Python started during the run, a
dlopen'd libpython). Nothing is done per process: a thread, a fork, a
Python started during the run get Python frames from their first sample.
unwind/python_runtime.py says what an interpreter object is.

The kernel names a Python frame's code object by an id, and reports each
id once by a ring record (status PYTHON_CODE: a trace record's head, the
interpreter's version in its cpu field, its frame count of (address, id,
identity, what the kernel copied) after it: capture/bpf_unwind.code_entries
reads them); `code_seen` hands it to the run's PythonCode
(symbols/python.py), which reads the code object while the process lives,
checking it is the one the id stands for, so it can be named after it is
gone. A -c
command that may exit before the ring is read is held at its exit
(plan.held_at_exit), where `at_exit` reads what is left.

Every BPF capture whose stacks are walked in the kernel has these maps
(bpf_capture.BpfCapture): count, profile, trace, offcpu, latency's entry
stacks, memleak."""
from __future__ import annotations

import struct

from ..kernel import procfs
from ..model import CommEvent, ExitEvent
from ..unwind import python_runtime
from ..unwind.python_frames import ascii_data
from .bpf_common import unwind_object
from .interpreter_objects import InterpreterMaps, InterpreterObjects

OBJECTS = 64                    # interpreter objects (each version's python, libpython)
THREADS = 8192                  # (mm, fsbase) -> PyThreadState, an LRU
CODES = 1 << 16                 # (tgid, code) reported already, an LRU
# the ring of a program whose stacks stay in the kernel (offcpu, memleak):
# only its records of new code objects (~300 bytes, at most one a stack)
CODE_RING_BYTES = 1 << 20
_TGID = struct.Struct("<I")


class PythonMaps(InterpreterMaps):
    """python.h's maps, shared by the run's unwinder programs; `lock` is
    held by whoever writes them, and by close()."""

    def __init__(self, objects: int = OBJECTS, threads: int = THREADS, codes: int = CODES):
        super().__init__((("python_objects", objects), ("python_threads", threads),
                          ("python_codes", codes), ("python_scratch", None)))


def pack_object(interp: python_runtime.Interpreter) -> bytes:
    """PYTHON_OBJECTS' value (struct python_object) of an interpreter."""
    layout = unwind_object().layout("python_object")
    out = bytearray(layout.struct.size)
    at = layout.offsets
    for name, v in interp.layout:
        struct.pack_into("<I", out, at["layout." + name], v)
    major, minor = interp.version
    struct.pack_into("<I", out, at["version"], major << 8 | minor)
    struct.pack_into("<Q", out, at["runtime"], interp.runtime)
    filename, name = python_runtime.code_identity(interp.version)
    struct.pack_into("<II", out, at["code_filename"], filename, name)
    struct.pack_into("<II", out, at["code_firstline"],
                     python_runtime.CODE_OFFSETS[interp.version]["firstlineno"],
                     ascii_data(interp.version))
    ranges = (tuple(interp.eval_ranges) + ((0, 0), (0, 0)))[:2]
    for i, (start, end) in enumerate(ranges):
        struct.pack_into("<Q", out, at["eval_start"] + 8 * i, start)
        struct.pack_into("<Q", out, at["eval_end"] + 8 * i, end)
    return bytes(out)


class PythonProcs(InterpreterObjects):
    """The run's interpreter objects, in PYTHON_OBJECTS, and the Python
    processes whose code objects the kernel reported, read while they
    live. `python_code`: the run's PythonCode (symbols/python.py), or
    None; `objects`: the run's unwind_objects.UnwindObjects, which asks
    `slot_of` of each object it loads."""

    objects_map = "python_objects"
    detect = staticmethod(python_runtime.object_interpreter)
    pack = staticmethod(pack_object)

    def __init__(self, maps: PythonMaps, python_code=None, objects=None):
        super().__init__(maps)
        self.python_code = python_code
        self.versions: dict = {}        # pid -> (major, minor) of its interpreter
        self.interpreters = self.slot_paths     # PYTHON_OBJECTS' slots: their paths
        if objects is not None:
            objects.interpreters = self

    def follow(self, metas: list) -> None:
        """A process's exec or exit ends what is known of its version."""
        for _time, event in metas:
            if (isinstance(event, CommEvent) and event.exec) or \
                    (isinstance(event, ExitEvent) and event.pid == event.tid):
                self.versions.pop(event.pid, None)

    def version(self, pid: int) -> tuple | None:
        """(major, minor) of pid's interpreter: from its code records, else
        from its maps."""
        version = self.versions.get(pid)
        if version is None:
            try:
                version = python_runtime.version_of(procfs.executable_mappings(pid))
            except (OSError, ValueError):
                version = None
            if version is not None:
                self.versions[pid] = version
        return version

    def at_exit(self, pid: int, _execs: int = 0) -> None:
        """pid stands at its exit, its memory still there (a -c command
        held by TracedCommand): every code object the kernel reported for
        it and the ring has not brought yet is read now."""
        if self.python_code is None or self.version(pid) is None:
            return
        tgid = _TGID.pack(pid)
        # called from SIGCHLD's handler too, maybe over this thread's own
        # hold of the lock: not waited for long
        if not self.maps.lock.acquire(timeout=0.2):
            return
        try:
            keys = self.maps.python_codes.keys() if self.maps.all else []
        except OSError:
            return
        finally:
            self.maps.lock.release()
        for key in keys:
            if key[:4] != tgid:
                continue
            try:
                value = self.maps.python_codes.lookup(key)
            except OSError:
                continue
            if value is None:
                continue
            code = struct.unpack_from("<Q", key, 8)[0]
            identity, code_id = struct.unpack_from("<QQ", value)
            if not self.python_code.known(pid, code_id << 3):
                self.code_seen(pid, code, code_id, identity)

    def code_seen(self, pid: int, code: int, code_id: int, identity: int,
                  copied: tuple | None = None, version: int = 0) -> None:
        """A PYTHON_CODE record's entry (`version`: major << 8 | minor, as
        the kernel put it): the code object is read now, while pid lives,
        and kept under its id; `copied`, what the kernel read of it at the
        sample (PythonCode.remember)."""
        if self.python_code is None:
            return
        if version:
            self.versions[pid] = (version >> 8, version & 0xFF)
        found = self.version(pid)
        if found is not None:
            try:
                self.python_code.remember(pid, code, found, code_id, identity, copied)
            except (OSError, ValueError, OverflowError):
                pass        # gone, or freed and reused already: a frame read mid-change
