"""The BPF captures' common part: perf events for scoping and tracking,
programs attached to them, and the run's kernel objects in one owner.
One subclass per mode: bpf_count (frame pointers, counted), bpf_dwarf
(unwound in the kernel: counted, or a record per event), bpf_latency,
bpf_offcpu.

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

from ..defaults import BPF_BUFFER_PAGES, DEFAULT_STACK_SIZE, DEFAULT_STACK_STORAGE
from ..kernel import bpf_syscall, procfs
from ..model import CommEvent, ExitEvent, Losses, MmapEvent, RawSample, UnwoundSample
from .bpf_counter import InBackground, arm_on_exec, cut_reason, with_ring_records
from .contract import Capture
from .perf import PerfCapture
from .run_objects import RunObjects
from . import uprobe_links
from ..unwind.runtime_files import may_be


class BpfCapture(Capture):
    """PerfCapture's events (so the same scoping and tracking records)
    with a counter's programs attached (`_new_counter`, per mode). Its
    stream carries the metadata, and what the counter's ring holds
    (`ring_chunk` chunks, `_decode_ring`); `counted()` gives what the
    kernel counted at the end. Every map, program, link and ring of the
    run is kept in `owned` and closed by close()."""
    counts_in_kernel = True
    ring_chunk = None       # the type of the counter's ring chunks, where it has one
    # the run's RuntimeNames (symbols/runtime_names.py): the names tables
    # of code objects, JS functions, PHP functions, Perl subs, Ruby iseqs,
    # each taken (and made) when the counter meets its runtime
    names = None
    # an unwind.python_live.LiveFrames the session gives a capture that
    # defers stacks: a deferred sample's Python frames are read from its
    # process as its record is decoded (the kernel walked none); made by
    # wire_python_frames() when the run meets Python
    python_frames = None
    wire_python_frames = None
    # the run's mapping tracker (target/mappings.py), where a deferred
    # stack's frames lie: the objects its copy went through (settle)
    mappings = None
    links_uprobes = False   # a mode whose programs can sit behind uprobe_multi links
    # a mode whose programs hand the stacks they cannot walk yet to user
    # space: a whole-machine run of it loads objects' rows as they are sampled
    defers_stacks = False
    # a mode whose programs hand user space the stacks through an object
    # whose rows did not fit the table (memleak too, which loads no rows lazily)
    defers_table_full = False

    def __init__(self, probes: list, target, buffer_pages=None, *,
                 stack_storage: int = DEFAULT_STACK_STORAGE, kernel: bool = False,
                 unwind_tables=None, python: bool = False, weighted: bool = False,
                 js: bool = False, php: bool = False, unwind_memory: int | None = None,
                 stack_size: int = DEFAULT_STACK_SIZE, perl: bool = False,
                 ruby: bool = False):
        self.probes = probes
        # --stack-size: the bytes of stack a deferred record carries (bpf_unwind)
        self.stack_size = stack_size
        self.weighted = weighted            # count --weight: sums, not hits
        self.target = target
        self.stack_storage = stack_storage
        self.kernel = kernel
        # DWARF unwinding in the kernel (capture/bpf_unwind.py): the rows of
        # an object, from unwind/tables.for_image (None: frame pointers)
        self.unwind_tables = unwind_tables
        # bytes of in-kernel rows: --unwind-memory, else sized at open()
        # by what the targets map (bpf_unwind.rows_capacity)
        self.unwind_memory = unwind_memory
        self.rows_capacity = None
        self._first_objects: list = []     # host paths whose rows load before the start
        self._full_named: list = []         # objects the header named full
        self._stopped = False
        self._row_objects = None            # the counter's UnwindObjects, kept past close()
        # Python frames in the stacks it unwinds (bpf/python.h, capture/bpf_python.py)
        self.python = python
        # JS frames named in the stacks it unwinds (bpf/v8.h, capture/bpf_v8.py)
        self.js = js
        # PHP frames in the stacks it unwinds (bpf/php.h, capture/bpf_php.py)
        self.php = php
        # Perl frames merged into the stacks it unwinds (bpf/perl.h, capture/bpf_perl.py)
        self.perl = perl
        # Ruby frames in the stacks it unwinds (bpf/ruby.h, capture/bpf_ruby.py)
        self.ruby = ruby
        self.cut: dict = {}                 # why -> events whose stack was cut short
        # many uprobes go behind uprobe_multi links, without perf events
        # (a weight is read per probe, by a program of its own: no links)
        self.linked = uprobe_links.linked(probes) \
            if self.links_uprobes and not weighted else frozenset()
        self.events = PerfCapture([p for i, p in enumerate(probes) if i not in self.linked],
                                  target, buffer_pages or BPF_BUFFER_PAGES,
                                  with_stacks=False)
        self.buffer_pages = self.events.buffer_pages
        self.owned = RunObjects()
        self.counter = None
        self.armed = None                   # the map a -c command's exec arms
        # whole-machine: rows loaded as the walk wants them (lazy_rows.py)
        self.lazy_rows = None

    def _new_counter(self):
        """The maps and programs of this mode, kept in self.owned."""
        raise NotImplementedError

    @property
    def reach_note(self) -> str:
        """For the header: a -p/-c run's uprobes behind links fire in the
        traced processes only (uprobe_links.py), not in the ones they fork."""
        if not self.linked or self.target.scope == "system":
            return ""
        return (f"its {len(self.linked)} uprobes (uprobe_multi links) fire in the traced "
                "process, not in processes it forks")

    def _tgid(self):
        """The traced process for a program filtering on it (-p, -c)."""
        return self.target.pid if self.target.scope != "system" else None

    def open(self) -> None:
        target = self.target
        events = programs = None
        interpreters: list = []
        scanned: dict | None = None     # pid -> its objects' paths (a whole machine's scan)
        mapped = None                       # a whole-machine run's ObjectPaths
        if self.interrupt is not None:
            self.events.interrupt = self.interrupt
        try:
            if target.scope == "command":
                self.armed = arm_on_exec(target.pid, self.owned)
            # The events open in a thread while this one makes the maps and
            # loads the rows: registering a uprobe waits for an RCU grace
            # period in the kernel (10-20 ms here), and ctypes lets go of
            # the GIL there.
            events = InBackground(self.events.open)
            lazy = target.scope == "system" and self.defers_stacks
            if self.unwind_tables is not None:
                from .bpf_unwind import interpreters_objects, objects_of_target, rows_capacity
                self._first_objects = objects_of_target(target, self.probes,
                                                        running=not lazy)
                if lazy:
                    # the table holds what the machine maps (a scan of
                    # ~130 processes' maps and ~120 objects' headers: ~0.15 s),
                    # within MAX_UNWIND_MEMORY; their rows load as sampled
                    from .lazy_rows import ObjectPaths
                    mapped = ObjectPaths()
                    scanned = mapped.scan()
                    interpreters = interpreters_objects(scanned)
                    self.rows_capacity = rows_capacity(list(dict.fromkeys(
                        self._first_objects + interpreters + list(mapped.paths.values()))),
                        self.unwind_memory)
                else:
                    self.rows_capacity = rows_capacity(self._first_objects,
                                                       self.unwind_memory, interpreters)
            self.counter = self._new_counter()
            self.counter.interrupt = self.events.interrupt
            for runtime in _FOLLOW:     # those the counter made already
                self._follow_runtime(runtime)
            self.counter.on_runtime = self._follow_runtime     # the rest as met
            # the verifier (~5 ms for the unwinder) works while rows load
            programs = InBackground(self.counter.load_programs)
            lazy = lazy and self.counter.objects is not None
            if lazy:
                # the loader starts on the running Pythons' objects while the
                # programs load and attach (lazy_rows.py)
                from .lazy_rows import LazyRows
                self.lazy_rows = LazyRows(self.counter.objects, mapped, first=interpreters)
                self.lazy_rows.start()
            if self.counter.objects is not None:
                objects = self.counter.objects
                objects.may_evict = self.defers_stacks     # see _keep_rows
                objects.add_vdso()
                note_jvms(objects, target, scanned)
                # where stacks can be deferred, rows still to be built are
                # built after the start (lazy_rows.py): the probes are live
                # at once, whatever the objects' size and the cache's state
                later, cached_only = [], self.defers_stacks and not lazy
                if target.scope == "command" and any(map(read_late, self._first_objects)):
                    cached_only = False
                for path in self._first_objects:
                    self.interrupt.check()
                    if not objects.add_path(path, cached_only=cached_only):
                        later.append(path)
                if later:
                    self._load_later(objects, later)
                full = objects.full_note(self.defers_table_full)
                if full:
                    self.unwind_note += "; " + full
                self._full_named = list(objects.full)
                self._row_objects = objects
                objects.started()
                self._keep_rows(objects)
            programs.result()
            if lazy:
                # the running interpreters' stacks walked in the kernel from
                # the first sample: the Ruby, PHP and Perl frames of a copy
                # are read later, from the live process (lazy_rows.py)
                self.lazy_rows.wait_first(self.events.interrupt)
            if self.counter.passes is not None:
                # the runtimes of the objects loaded so far walked from the
                # first event, as when their passes were in every program
                self.counter.passes.settle()
            events.result()
            self.counter.attach(self.events)
            if self.counter.ring is not None:
                self.events.wake_on(self.counter.ring.fd)   # its records end the drain's wait
            if lazy:
                from .bpf_unwind import ROW_SIZE
                sized = ("what the machine maps" if self.unwind_memory is None
                         else "--unwind-memory")
                self.unwind_note += (", tables loaded as objects are sampled (room for "
                                     f"{self.rows_capacity * ROW_SIZE / (1 << 20):.0f} MiB "
                                     f"of rows: {sized}; "
                                     f"{self.counter.objects.table_bytes / (1 << 20):.0f} "
                                     "MiB made, more as needed)")
        except BaseException:
            for job in (programs, events):  # never close what is still opening
                if job is not None:
                    job.result(quiet=True)
            if not self.events.interrupt.requested:
                self.close()            # else the caller does (in the background)
            raise

    def _load_later(self, objects, paths: list) -> None:
        """The rows of a -p/-c target's objects the cache does not hold,
        built and loaded by a thread, the smallest first (libc's in a
        fraction of a second, libLLVM's in seconds); meanwhile their
        stacks are deferred, unwound by ustack from their copies."""
        from .bpf_unwind import rows_estimate
        from .lazy_rows import LazyRows, ObjectPaths
        pid = self.target.pid
        paths = sorted(paths, key=rows_estimate)
        self.lazy_rows = LazyRows(objects, ObjectPaths(lambda: [pid] if pid else []),
                                  first=paths)
        self.lazy_rows.start()

    def _keep_rows(self, objects) -> None:
        """Where no loader runs (-p, -c with every row at hand) and the
        table is short of room (an object did not fit, or idle ones were
        evicted for one): a loader that brings them back as they are
        sampled (lazy_rows.py, UnwindObjects.retry_full)."""
        if self.lazy_rows is not None or not self.defers_stacks or not (
                objects.full or objects.evicted) or self._stopped \
                or self.events.interrupt.requested:
            return
        from .lazy_rows import LazyRows, ObjectPaths
        pid = self.target.pid
        self.lazy_rows = LazyRows(objects, ObjectPaths(lambda: [pid] if pid else []),
                                  keeper=True)
        self.lazy_rows.start()

    def start(self) -> None:
        self.events.start()

    def read_chunks(self, timeout_ms: int) -> list:
        """The perf buffers' chunks, then what the counter's ring holds."""
        chunks = self.events.read_chunks(timeout_ms)
        if self.ring_chunk is None:
            return chunks
        return with_ring_records(chunks, self.counter, self.ring_chunk)

    def decode(self, chunk, metas: list, samples: list, offset: int, limit: int) -> int:
        """The ring's records by `_decode_ring`; the events' metadata, the
        rows of each newly mapped object (dlopen, a new process) loaded as
        its MMAP2 record passes, where the counter unwinds."""
        if self.ring_chunk is not None and isinstance(chunk, self.ring_chunk):
            return self._decode_ring(chunk, samples, offset, limit)
        before = len(metas)
        offset = self.events.decode(chunk, metas, samples, offset, limit)
        objects = self.counter.objects if self.counter is not None else None
        if objects is not None:
            lazy = self.lazy_rows
            for _time, event in metas[before:]:
                if not isinstance(event, MmapEvent):
                    continue
                objects.note_mapping(event.mapping, event.pid)
                if lazy is None:
                    objects.add_mapping(event.mapping, event.pid)
                elif self.target.scope == "system":     # the loader builds what the walk wants
                    lazy.note_mapping(event.mapping, event.pid)
                elif not objects.add_mapping(event.mapping, event.pid, cached_only=True):
                    # -p/-c with rows still to build (a -c command's exec
                    # maps them again): the loader's, not this thread's
                    lazy.note_mapping(event.mapping, event.pid)
            if self.lazy_rows is None:
                self._keep_rows(objects)
        python = self.counter.python if self.counter is not None else None
        if python is not None and len(metas) > before:
            python.follow(metas[before:])      # an exec, an exit
            if self.python_frames is not None:
                self._follow_frames(metas[before:])
        return offset

    def _follow_frames(self, metas: list) -> None:
        """python_frames forgets a process at its exec and exit, and looks
        again at one that maps an object."""
        for _time, event in metas:
            if isinstance(event, MmapEvent):
                self.python_frames.mapped(event.pid)
            elif (isinstance(event, CommEvent) and event.exec) or \
                    (isinstance(event, ExitEvent) and event.pid == event.tid):
                self.python_frames.forget(event.pid)

    def _names(self, kind: str):
        """The run's names table of `kind` (RuntimeNames), or None."""
        return self.names.get(kind) if self.names is not None else None

    def _follow_runtime(self, runtime: str) -> None:
        """Wire the counter's objects of `runtime` (made at its first object)."""
        getattr(self, _FOLLOW[runtime])()

    def _follow_python(self) -> None:
        """Where the counter merges Python frames (bpf/python.h,
        capture/bpf_python.py): the interpreters are known by their objects
        as their rows load, so nothing is done per process; a -c command
        held at its exit has its last code objects read there."""
        python = self.counter.python
        if python is None:
            return
        python_code = python.python_code = self._names("python")
        if python_code is not None:
            python_code.by_id = True       # the kernel's ids name its frames' code
        if self.python_frames is None and self.wire_python_frames is not None:
            self.wire_python_frames()
        if self.target.scope == "command":     # (ptrace's modules: not a -p run's)
            from ..target.traced_command import TracedCommand
            if isinstance(self.target, TracedCommand):
                self.target.on_exit = python.at_exit      # held at its exit: Session

    def _follow_php(self) -> None:
        """Where the counter merges PHP frames (bpf/php.h, capture/bpf_php.py):
        the interpreters are known by their objects as their rows load; the
        names the kernel copies go to the run's PhpFunctions."""
        php = getattr(self.counter, "php", None)
        if php is None:
            return
        functions = php.functions = self._names("php")
        if functions is not None:
            functions.active = True    # its stacks carry PHP words
            functions.refresh = php.harvest

    def _follow_v8(self) -> None:
        """Where the counter names JS frames (bpf/v8.h, capture/bpf_v8.py):
        the V8s are known by their objects as their rows load, so nothing
        is done per process. (A -c command held at its exit would not have
        its last functions read there, as Python's code objects are: node
        frees its heap before it exits.)"""
        v8 = self.counter.v8
        if v8 is None:
            return
        functions = v8.functions = self._names("js")
        if functions is not None:
            functions.active = True     # its stacks carry JS words
            functions.refresh = v8.harvest

    def _follow_perl(self) -> None:
        """Where the counter merges Perl frames (bpf/perl.h, capture/bpf_perl.py):
        the kernel copies the subs' names, which the run's PerlSubs takes."""
        perl = getattr(self.counter, "perl", None)
        if perl is None:
            return
        subs = perl.subs = self._names("perl")
        if subs is not None:
            subs.active = True     # its stacks carry Perl words
            subs.refresh = perl.harvest

    def _follow_ruby(self) -> None:
        """Where the counter merges Ruby frames (bpf/ruby.h,
        capture/bpf_ruby.py): the VMs are known by their objects as their
        rows load; the iseqs the kernel saw are read while their processes
        live. (A -c command held at its exit would not have its last iseqs
        read there, as Python's code objects are: ruby frees them as it
        exits.)"""
        ruby = getattr(self.counter, "ruby", None)
        if ruby is None:
            return
        iseqs = ruby.iseqs = self._names("ruby")
        if iseqs is not None:
            iseqs.active = True     # its stacks carry Ruby words
            iseqs.refresh = ruby.harvest
            if ruby.runtimes:
                ruby.start_harvest()

    def _decode_ring(self, chunk, samples: list, offset: int, limit: int) -> int:
        raise NotImplementedError

    def count_samples(self, chunk, start: int) -> int:
        """The samples of a chunk from `start`, undecoded: a ring holds
        one per record (RingBuf.read's layout), but for those naming
        Python code objects."""
        if self.ring_chunk is None or not isinstance(chunk, self.ring_chunk):
            return self.events.count_samples(chunk, start)
        from .bpf_unwind import code_record
        n, off, end = 0, start, len(chunk)
        while off + bpf_syscall.RING_RECORD_HEADER <= end:
            size = struct.unpack_from("<I", chunk, off)[0]
            n += not code_record(chunk, off + bpf_syscall.RING_RECORD_HEADER, size)
            off = bpf_syscall.ring_next(off, size)
        return n

    def stop(self) -> None:
        """The events and the counter's ring both end here."""
        self._stopped = True                # no loader started after this (_keep_rows)
        self.events.stop()
        if self.lazy_rows is not None:
            self.lazy_rows.stop()
        if self.counter is not None and self.counter.ring is not None:
            self.counter.ring.freeze()

    def flush_lost(self) -> None:
        self.events.flush_lost()

    def settle(self, sample, unwind):
        """A stack the in-kernel unwinder deferred (capture/bpf_unwind.py:
        an object mapped before its rows were loaded), unwound now while
        its mappings are at hand; complete, as the callchain the kernel
        would have counted, so that equal stacks count under one key."""
        if sample.regs is None and not isinstance(sample, UnwoundSample):
            return sample               # walked in the kernel (trace's records)
        unwound, kernel, keyable = unwind(sample)
        objects = self._row_objects
        if objects is not None and self.mappings is not None and objects.short_of_room:
            self._met_in_copy(objects, sample.pid, unwound.callchain)
        if not keyable:
            return unwound
        return RawSample(sample.probe, sample.pid, sample.tid, 0, -1, unwound.callchain,
                         kernel=kernel)

    def _met_in_copy(self, objects, pid: int, callchain: bytes) -> None:
        """The objects a deferred stack went through, as met: the walk
        stopped at the first without rows and stamped none beneath it
        (libc, the executable), which would look idle to eviction while
        every stack of the process goes through them."""
        find = self.mappings.find
        paths = set()
        for (addr,) in struct.iter_unpack("<Q", callchain[:len(callchain) // 8 * 8]):
            m = find(pid, addr)
            if m is not None:
                paths.add(m.open_path)
        objects.met_in_copy(paths)

    def losses(self) -> Losses:
        events = self.events.losses()
        if self.counter is None:
            return Losses(events.lost, events.throttled)
        return self._losses(events, self.owned.errors(), self.counter.skipped())

    def _losses(self, events: Losses, errors: dict, skipped: int) -> Losses:
        """Losses from the events', the programs' error counters by name
        (RunObjects.errors) and the runs the kernel skipped."""
        return Losses(events.lost, events.throttled, skipped=skipped)

    def _note_cut(self, chain: bytes, n: int) -> None:
        why = cut_reason(chain)
        if why is not None:
            self.cut[why] = self.cut.get(why, 0) + n

    def defines_probes(self) -> bool:
        return self.events.defines_probes()

    def unmap(self) -> None:
        """Drop this process's mappings of the perf buffers and the rings
        (read no more): before the closer is forked (closer.py)."""
        self.events.unmap()
        for ring in self.owned.rings:
            ring.unmap()

    def release(self) -> None:
        """close() for this process alone (see PerfCapture.release)."""
        self.events.uprobes.forget()
        self.close()

    def end_notes(self) -> list:
        """What the summary says of the run's unwind rows: objects that
        did not fit after the header was printed, those loaded as sampled."""
        objects = self._row_objects
        notes = []
        if objects is not None and not set(objects.full) <= set(self._full_named):
            notes.append(objects.full_note(self.defers_table_full, self._full_named))
        if objects is not None:
            notes += [note for note in (objects.growth_note(), objects.churn_note()) if note]
        lazy = self.lazy_rows
        if lazy is None or lazy.keeper:
            return notes
        why = ("as their code was sampled" if self.target.scope == "system"
               else "built after the start")
        return notes + [f"Unwind rows of {lazy.loaded} objects were loaded during the run, "
                f"{why}"
                + (f" ({lazy.pending} more were wanted when it ended: their stacks "
                   f"were unwound by ustack)" if lazy.pending else "")]

    def close(self) -> None:
        if self.lazy_rows is not None:
            self.lazy_rows.stop()
        if self.counter is not None and self.counter.objects is not None:
            self.counter.objects.close()    # the loader writes no more
        self.events.close()
        self.owned.close()              # after the events
        self.counter = None
        if self.python_frames is not None:
            self.python_frames.close()


def note_jvms(objects, target, scanned: dict | None = None) -> None:
    """The JVMs running now among the run's processes into the unwinder's
    JVM_PROCESSES (a -c command's, and those started later, come by the
    MMAP2 record of their libjvm, or their first walk through it).
    `scanned`: pid -> its objects' paths, when the run read every
    process's maps already (lazy_rows.ObjectPaths.scan)."""
    from .bpf_unwind import LIBJVM, jvm_processes
    if scanned is not None:
        jvms = [pid for pid, paths in scanned.items()
                if any(os.path.basename(p) == LIBJVM for p in paths)]
    else:
        jvms = jvm_processes([target.pid] if target.scope == "pid" else
                             procfs.pids() if target.scope == "system" else [])
    for pid in jvms:
        objects.add_jvm(pid)


def uncounted(errors: dict, reasons: tuple) -> tuple:
    """(why, n) for each (why, error name) of `reasons` counted nonzero."""
    return tuple((why, errors[name]) for why, name in reasons if errors[name])


# a runtime (runtime_objects.RUNTIMES) -> what wires its objects to the run
_FOLLOW = {"python": "_follow_python", "v8": "_follow_v8", "php": "_follow_php",
           "perl": "_follow_perl", "ruby": "_follow_ruby"}


# An interpreter whose frames a copied stack gets by reading the live
# process when the copy is unwound. A -c command's objects are built after
# it starts, their first events deferred; but a deferred copy is unwound
# only once its rows are in, ~0.5 s later, when the script is elsewhere
# and the read is refused: with an empty cache, 11-19 of a Ruby script's
# first 200 samples kept their VM calls as C frames. A command that runs
# one has its objects (the interpreter's and the libraries it needs, a few
# MiB) built before it starts instead.
_READ_LATE = ("python", "php", "perl", "ruby")


def read_late(path: str) -> bool:
    return any(may_be(runtime, path) for runtime in _READ_LATE)
