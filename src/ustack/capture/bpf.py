"""The BPF capture backend: stacks counted in the kernel.

The perf events are opened exactly as for the perf backend (capture/perf.py:
per probe, thread and CPU, inherited, enable_on_exec for -c), so the kernel
scopes them the same way and the tracking records (MMAP2/COMM/FORK) still
reach the MappingTracker through the ring buffers. A program attached to the
events counts each hit in a hash map keyed by (pid/tid, probe, user stack id,
kernel stack id, return address at the entry slot); the events themselves
never sample: only metadata records travel through the buffers.

Where a program runs:
- uprobe and tracepoint events (tracefs): the kernel keeps ONE program list
  per trace event, run for every hit whatever perf event is scoped where; so
  the program is attached to one perf event per probe (more would count each
  hit more than once). Uprobe hits are already limited to the traced
  processes (the kernel installs the breakpoint only in their mm);
  tracepoints fire for every task, so the program looks the tgid up in a
  set of the traced processes, which a program on task:task_newtask
  extends with each child they fork (as perf's inherited events follow
  them).
- cpu-clock sampling (profile): the program is the event's overflow handler,
  per event, inherited like the event; attached to every event.

What a program returns: on a tracepoint, 0 would make the kernel drop the
hit for EVERY perf event on it, another tool's (a perf record, another
ustack) as well, so those programs return 1 (PASS_ON) and the capture's own
events on them never sample (capture/perf.py: NEVER_SAMPLE). A uprobe's
trace event is this run's own (kernel/uprobe_events.py: a group per ustack
process), its only perf events the capture's, which never sample: its
programs return 0 (DROP_SAMPLE), and the kernel skips making a record of
the hit for those events. On a sampling event, 0 only keeps that event's
own sample out of our buffer."""
from __future__ import annotations

import os
import struct

from ..defaults import BPF_BUFFER_PAGES, DEFAULT_STACK_STORAGE
from ..model import Losses, MmapEvent, RawSample
from .bpf_counter import (BpfCounter, ExecArming, InBackground, bpf_program_object,
                          cut_reason, ring_bytes, with_ring_records)
from .perf import PerfCapture


def _compiled_fetches(probes: list) -> tuple:
    """Each probe's fetch-args compiled for the trace program (None for
    a probe without); bpf_fetchargs is imported only where one has some."""
    if not any(getattr(p, "fetch_args", ()) for p in probes):
        return ()
    from .bpf_fetchargs import compile_args
    return tuple(compile_args(p) if getattr(p, "fetch_args", ()) else None
                 for p in probes)


class BpfCapture:
    """The capture that counts in the kernel: PerfCapture's events (so the
    same scoping and tracking records) with a BpfCounter attached. Its
    stream carries only metadata; `counted()` gives the stacks at the end,
    `calls()` funccount's totals."""
    unwind_note = ""
    interrupt = None        # the run's Interrupt, handed to the events
    python_code = None      # the run's PythonCode (symbols/python.py): names code objects

    def __init__(self, probes: list, target, buffer_pages=None, *,
                 stack_storage: int = DEFAULT_STACK_STORAGE, kernel: bool = False,
                 calls_only: bool = False, unwind_tables=None, stream: bool = False,
                 python: bool = False):
        self.probes = probes
        # Python frames in the stacks the kernel unwinds (capture/bpf_python.py)
        self.python = python and unwind_tables is not None
        # DWARF unwinding in the kernel (capture/bpf_unwind.py): the rows of
        # an object, from unwind/tables.for_image (None: frame pointers)
        self.unwind_tables = unwind_tables
        self.unwind_note = "unwound in the kernel" if unwind_tables else ""
        # trace: a record per event through a BPF ring buffer (with unwind_tables)
        self.stream = stream and unwind_tables is not None
        # per probe, its fetch-args as the trace program fetches them
        self.fetches = _compiled_fetches(probes) if self.stream else ()
        self.cut: dict = {}                 # why -> events whose stack was cut short
        self.target = target
        self.stack_storage = stack_storage
        self.kernel = kernel
        self.calls_only = calls_only
        self.events = PerfCapture(probes, target, buffer_pages or BPF_BUFFER_PAGES,
                                  with_stacks=False)
        self.buffer_pages = self.events.buffer_pages
        self.decode = self._decode if unwind_tables else self.events.decode
        # the unwinder's ring: trace's records, the stacks it deferred to us
        self.read_chunks = self._read_chunks if unwind_tables else self.events.read_chunks
        self.flush_lost = self.events.flush_lost
        self.stop = self._stop if unwind_tables else self.events.stop
        self.counter = None
        self.arming = None                  # ExecArming of a -c command

    def open(self) -> None:
        target = self.target
        events = programs = None
        if self.interrupt is not None:
            self.events.interrupt = self.interrupt
        try:
            if target.scope == "command":
                self.arming = ExecArming(target.pid)
            # The events open in a thread while this one makes the maps and
            # loads the rows: registering a uprobe waits for an RCU grace
            # period in the kernel (10-20 ms here), and ctypes lets go of
            # the GIL there.
            events = InBackground(self.events.open)
            self.counter = self._new_counter()
            self.counter.interrupt = self.events.interrupt
            if self.arming is not None:
                self.counter.arm_on_exec(self.arming)
            # the verifier (~8 ms for the unwinder) works while rows load
            programs = InBackground(self.counter.load_programs)
            if self.unwind_tables is not None:
                from .bpf_unwind import objects_of_target
                objects = self.counter.objects
                objects.add_vdso()
                paths = objects_of_target(target, self.probes)
                for path in paths:
                    self.interrupt.check()
                    objects.add_path(path)
                if self._python() is not None:
                    self._follow_python(paths)
            programs.result()
            events.result()
            self.counter.attach(self.events)
        except BaseException:
            for job in (programs, events):  # never close what is still opening
                if job is not None:
                    job.result(quiet=True)
            if not self.events.interrupt.requested:
                self.close()            # else the caller does (in the background)
            raise

    def _new_counter(self):
        """The maps and programs that count (a subclass may count otherwise)."""
        target = self.target
        tgid = target.pid if target.scope != "system" else None
        if self.unwind_tables is not None:
            from .bpf_unwind import UnwindCounter, deferral_ring_bytes
            return UnwindCounter(
                self.probes, self.unwind_tables, stack_storage=self.stack_storage,
                kernel=self.kernel, filter_tgid=tgid, trace=self.stream,
                fetches=self.fetches, python=self.python,
                ring_bytes=(ring_bytes if self.stream else deferral_ring_bytes)(
                    self.buffer_pages))
        return BpfCounter(self.probes, stack_storage=self.stack_storage,
                          kernel=self.kernel, filter_tgid=tgid,
                          calls_only=self.calls_only)

    def _python(self):
        """The counter's bpf_python.PythonProcs, None where its programs
        merge no Python frames (a counter of another kind: memleak's)."""
        return getattr(self.counter, "python", None)

    def _follow_python(self, paths: list) -> None:
        """The Python processes running at the start (-p, system-wide); a
        command's interpreter read before it runs (`paths`: its objects)."""
        from ..kernel import procfs
        python = self._python()
        python.python_code = self.python_code
        scope = self.target.scope
        if scope == "command" and python.warm(paths) and self.arming is not None:
            python.watch_command(self.target.pid, self.arming.map)
        python.add_running([self.target.pid] if scope == "pid" else
                           procfs.pids() if scope == "system" else [])

    def start(self) -> None:
        self.events.start()

    def count_samples(self, chunk: bytes, start: int) -> int:
        """The samples of a chunk from `start`, undecoded: the unwinder's
        ring holds one per record (a u32 length, then the record), but
        for those naming Python code objects."""
        if type(chunk).__name__ != "RingChunk":
            return self.events.count_samples(chunk, start)
        from .bpf_unwind import PYTHON_CODE, RECORD
        n, off, end = 0, start, len(chunk)
        while off + 4 <= end:
            size = struct.unpack_from("<I", chunk, off)[0]
            if off + 4 + RECORD.size > end or RECORD.unpack_from(chunk, off + 4)[-1] != PYTHON_CODE:
                n += 1
            off += 4 + size
        return n

    def release(self) -> None:
        """close() for this process alone (see PerfCapture.release)."""
        self.events.uprobes.forget()
        self.close()

    def close(self) -> None:
        self.events.close()
        if self.counter is not None:
            self.counter.close()        # after the events
            self.counter = None
        if self.arming is not None:
            self.arming.close()
            self.arming = None

    def losses(self) -> Losses:
        events = self.events.losses()
        uncounted = ()
        skipped = self.counter.skipped() if self.counter is not None else 0
        if self.counter is not None and self.stream:
            errors = self.counter.errors_seen()          # the unwinder's, by name
            return Losses(events.lost + errors["UW_RING_FULL"], events.throttled, (),
                          tuple(self.cut.items()), deferral_full=errors["UW_UNDEFERRED"],
                          skipped=skipped)
        if self.counter is not None and self.unwind_tables is not None:
            errors = self.counter.errors_seen()
            stacks_full, counts_full, deferral_full = (errors[name] for name in (
                "UW_STACKS_FULL", "UW_COUNTS_FULL", "UW_UNDEFERRED"))
            uncounted = tuple((why, n) for why, n in (
                ("found the stack map full", stacks_full),
                ("found the count map full", counts_full)) if n)
            return Losses(events.lost, events.throttled, uncounted,
                          tuple(self.cut.items()), deferral_full=deferral_full,
                          skipped=skipped)
        elif self.counter is not None and not self.calls_only:
            errors = self.counter.errors_seen()
            slots = bpf_program_object("counts").enum("count_error")
            collided, stacks_full, counts_full = (errors[slots[name]] for name in (
                "ERR_COLLISION", "ERR_STACKS_FULL", "ERR_COUNTS_FULL"))
            uncounted = tuple((why, n) for why, n in (
                ("had a stack id collision", collided),
                ("found the stack map full", stacks_full),
                ("found the count map full", counts_full)) if n)
        return Losses(events.lost, events.throttled, uncounted, skipped=skipped)

    def counted(self, reset: bool = False) -> list:
        """(RawSample, count) of every stack counted so far; a sample's time
        and CPU are 0 and -1 (the kernel kept neither)."""
        counter = self.counter
        out = []
        if self.unwind_tables is not None:
            for pid, tid, probe, chain, kstack, n in counter.unwound(reset):
                kernel = counter.stack_bytes(kstack) if self.kernel else b""
                out.append((RawSample(probe, pid, tid, 0, -1, chain, b"",
                                      kernel=kernel), n))
                why = cut_reason(chain)
                if why is not None:
                    self.cut[why] = self.cut.get(why, 0) + n
            return out
        for c in counter.counted(reset):
            slot = getattr(self.probes[c.probe], "return_address_slot", None)
            sample = RawSample(
                c.probe, c.pid, c.tid, 0, -1, counter.stack_bytes(c.user_stack),
                c.return_address.to_bytes(8, "little") if slot is not None else b"",
                kernel=counter.stack_bytes(c.kernel_stack) if self.kernel else b"")
            out.append((sample, c.count))
        return out

    def calls(self, reset: bool = False) -> list:
        """Calls per probe (funccount), in probe order."""
        return self.counter.calls(reset)

    def _stop(self) -> None:
        """The events and the unwinder's ring both end here."""
        self.events.stop()
        if self.counter is not None and self.counter.ring is not None:
            self.counter.ring.freeze()

    def _read_chunks(self, timeout_ms: int) -> list:
        """The perf buffers' chunks, then what the unwinder's ring holds."""
        from .bpf_unwind import RingChunk       # the unwinder only where it runs
        return with_ring_records(self.events.read_chunks(timeout_ms), self.counter,
                                 RingChunk)

    def _object_bytes(self, dev: int, inode: int, offset: int, size: int) -> bytes | None:
        """`size` bytes at `offset` of an object whose unwind rows are
        loaded, by its (kernel dev, inode); None for another file."""
        entry = self.counter.objects.loaded.get((dev, inode)) if self.counter else None
        if entry is None:
            return None
        try:
            with open(entry[0], "rb") as f:
                return os.pread(f.fileno(), size, offset)
        except OSError:
            return None

    def _decode(self, chunk, metas: list, samples: list, offset: int, limit: int) -> int:
        """The stream's decoder, loading the rows of each newly mapped
        object (dlopen, a new process) as its MMAP2 record passes; the
        unwinder's records (trace's, and the stacks it deferred to us)
        become RawSamples."""
        from .bpf_unwind import RingChunk, ring_samples
        if isinstance(chunk, RingChunk):
            before = len(samples)
            python = self._python()
            offset = ring_samples(chunk, samples, offset, limit, self.counter.stack_bytes,
                                  self.fetches, self._object_bytes,
                                  python.code_seen if python is not None else None)
            for s in samples[before:]:
                why = cut_reason(s.callchain)
                if why is not None:
                    self.cut[why] = self.cut.get(why, 0) + 1
            return offset
        before = len(metas)
        offset = self.events.decode(chunk, metas, samples, offset, limit)
        if self.counter is not None:
            for _time, event in metas[before:]:
                if isinstance(event, MmapEvent):
                    self.counter.objects.add_mapping(event.mapping, event.pid)
            python = self._python()
            if python is not None:
                python.follow(metas[before:])
        return offset
