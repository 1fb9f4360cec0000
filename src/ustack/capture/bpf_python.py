"""Python frames in the in-kernel walk: what user space does for
src/ustack/bpf/python.h.

The kernel merges a thread's Python frames into its native stack when its
process is in PYTHON_PROCS: tgid -> (the version's state layout, the
address of _PyRuntime, the eval function's ranges, the version). This
module fills that map: for a -p target, or every process of a system-wide
run, at start; for any process later when an MMAP2 record shows it mapping
an interpreter (a -c command's exec, a fork that execs python); it drops a
process at its exec (the new image may run no Python, or another) and its
exit. unwind/python_runtime.py says where a process's interpreter is.

The kernel names a Python frame's code object by an id, and reports each
id once by a ring record (status PYTHON_CODE: a trace record's head, its
frame count of (address, id, identity) after it:
capture/bpf_unwind.code_entries reads them); `code_seen` hands it to the
run's PythonCode (symbols/python.py), which reads the code object while
the process lives, checking it is the one the id stands for, so it can
be named after it is gone. A -c
command that may exit before the ring is read is held at its exit
(plan.held_at_exit), where `at_exit` reads what is left.

Every BPF capture whose stacks are walked in the kernel follows these
processes (bpf_capture.BpfCapture): count, profile, trace, offcpu,
latency's entry stacks, memleak."""
from __future__ import annotations

import struct
import threading
import time

from ..kernel import bpf_syscall
from ..kernel import procfs
from ..interrupt import NEVER
from ..model import CommEvent, ExitEvent, MmapEvent
from ..unwind import python_runtime
from ..unwind.python_frames import ascii_data
from .bpf_common import unwind_object

PROCS = 1024                    # Python processes followed at once
THREADS = 8192                  # (tgid, fsbase) -> PyThreadState, an LRU
CODES = 1 << 16                 # (tgid, code) reported already, an LRU
# the ring of a program whose stacks stay in the kernel (offcpu, memleak):
# only its records of new code objects (~300 bytes, at most one a stack)
CODE_RING_BYTES = 1 << 20
_TGID = struct.Struct("<I")


class PythonMaps(bpf_syscall.MapSet):
    """python.h's maps, shared by the run's unwinder programs; `lock` is
    held by whoever writes them, and by close()."""

    def __init__(self, procs: int = PROCS, threads: int = THREADS, codes: int = CODES):
        super().__init__()
        self.lock = threading.Lock()
        obj = unwind_object()
        try:
            for name, size in (("python_procs", procs), ("python_threads", threads),
                               ("python_codes", codes), ("python_scratch", None)):
                m = obj.make_map(name, size)
                self.all.append(m)
                setattr(self, name, m)
        except BaseException:
            self.close()
            raise

    def named(self) -> dict:
        return {name: getattr(self, name) for name in (
            "python_procs", "python_threads", "python_codes", "python_scratch")}

    def close(self) -> None:
        with self.lock:
            super().close()


def pack_proc(interp: python_runtime.Interpreter) -> bytes:
    """PYTHON_PROCS' value (struct python_proc) of an interpreter."""
    layout = unwind_object().layout("python_proc")
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


class PythonProcs:
    """The processes whose stacks get Python frames, in PYTHON_PROCS.
    `python_code`: the run's PythonCode (symbols/python.py), or None."""

    def __init__(self, maps: PythonMaps, python_code=None):
        self.maps = maps
        self.python_code = python_code
        self.versions: dict = {}        # pid -> (major, minor) of its interpreter
        # of those forgotten: their code objects' records may come after
        # their exit, and are named from what the kernel copied
        self.ended: dict = {}

    def add(self, pid: int, mappings: list | None = None) -> bool:
        """Follow pid's interpreter, if it maps one (`mappings`: those to
        look in, else its /proc/PID/maps); whether it does."""
        if mappings is None:
            mappings = procfs.executable_mappings(pid)
        try:
            interp = python_runtime.find_interpreter(mappings)
        except (OSError, ValueError):
            interp = None
        if interp is None:
            return False
        with self.maps.lock:
            if not self.maps.all:
                return False        # the run has ended
            try:
                self.maps.python_procs.update(_TGID.pack(pid), pack_proc(interp))
            except OSError:
                return False        # the map is full: its stacks stay native
        self.versions[pid] = interp.version
        return True

    def warm(self, paths: list) -> bool:
        """Read now what the interpreters among `paths` (a -c command's
        load closure) are, so its MMAP2 records add it at once: its first
        samples wait for that. Whether one of them is an interpreter."""
        return python_runtime.runs_python(paths)

    def forget(self, pid: int) -> bool:
        """Stop following pid; whether it was followed."""
        version = self.versions.pop(pid, None)
        if version is None:
            return False
        if len(self.ended) >= PROCS:
            self.ended.clear()
        self.ended[pid] = version
        with self.maps.lock:
            try:
                if self.maps.all:
                    self.maps.python_procs.delete(_TGID.pack(pid))
            except OSError:
                pass
        return True

    def watch_command(self, pid: int, armed, seconds: float = 1.5) -> None:
        """A -c command's interpreter, added as soon as it is mapped: its
        MMAP2 record is read ~0.1 s later (more on a busy machine), and
        the samples meanwhile would have no Python frames. In the
        background: once `armed` (exec.bpf.c's map) says the command has
        exec'd, its maps are read every few ms for `seconds`."""
        threading.Thread(target=self._watch, args=(pid, armed, seconds), daemon=True,
                         name="ustack-python-watch").start()

    def _watch(self, pid: int, armed, seconds: float) -> None:
        end = time.monotonic() + seconds
        try:
            while not int.from_bytes(armed.lookup(bytes(4)) or bytes(8), "little"):
                if time.monotonic() > end + 60 or not self.maps.all:
                    return          # never exec'd (held, or the run ended)
                time.sleep(0.001)
            end = time.monotonic() + seconds
            while time.monotonic() < end and self.maps.all and pid not in self.versions:
                if self.add(pid):
                    return
                time.sleep(0.002)
        except OSError:             # the map closed under us: the run ended
            return

    def add_running(self, pids: list, interrupt=NEVER) -> None:
        """Processes running at the start (-p, system-wide); looking at
        every process of a busy machine takes seconds: a run asked to end
        gives up between two."""
        for pid in pids:
            interrupt.check()
            self.add(pid)

    def follow(self, metas: list) -> None:
        """Keep the map in step with the stream's records: an interpreter
        mapped, an exec, an exit."""
        for _time, event in metas:
            if isinstance(event, MmapEvent):
                if event.pid not in self.versions:    # find_interpreter looks at names first
                    self.add(event.pid, [event.mapping])
            elif isinstance(event, CommEvent) and event.exec and self.forget(event.pid):
                # its record may come after the new image's MMAP2 records
                # (another CPU's buffer, read later) and after the -c
                # command's watch found its interpreter: what it maps now
                self.add(event.pid)
            elif isinstance(event, ExitEvent) and event.pid == event.tid:
                self.forget(event.pid)

    def at_exit(self, pid: int, _execs: int = 0) -> None:
        """pid stands at its exit, its memory still there (a -c command
        held by TracedCommand): every code object the kernel reported for
        it and the ring has not brought yet is read now."""
        version = self.versions.get(pid)
        if self.python_code is None or version is None:
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
                  copied: tuple | None = None) -> None:
        """A PYTHON_CODE record's entry: the code object is read now,
        while pid lives, and kept under its id; `copied`, what the kernel
        read of it at the sample (PythonCode.remember)."""
        version = self.versions.get(pid) or self.ended.get(pid)
        if self.python_code is not None and version is not None:
            try:
                self.python_code.remember(pid, code, version, code_id, identity, copied)
            except (OSError, ValueError, OverflowError):
                pass        # gone, or freed and reused already: a frame read mid-change
