"""The default capture backend: perf_event_open with user callchains.

One event per (probe, thread, CPU) for -p (inherit=1 follows threads and
children created later: the kernel refuses to mmap an inherited event with
cpu=-1, hence per CPU), per (probe, CPU) for -c (armed with enable_on_exec)
and for system-wide tracing. All events of a CPU write into one ring buffer
(PERF_EVENT_IOC_SET_OUTPUT); the IDENTIFIER field says which probe fired.
Uprobes are tracefs-defined probe events (see kernel/uprobe_events.py for
why not the uprobe PMU)."""
from __future__ import annotations

import errno
import os
import resource
import select
import time

from ..defaults import DEFAULT_BUFFER_PAGES, DEFAULT_STACK_SIZE
from ..interrupt import Interrupted
from ..kernel import credentials
from ..kernel import perf_event as pe
from ..kernel import procfs
from ..kernel.perf_records import (BASE_SAMPLE_TYPE, MAPPED, PROCESS_GONE, EventLayout,
                                   RecordReader, count_samples, moments)
from ..kernel.ring import PAGE, RingBuffer
from ..kernel.tracefs import tracepoint_id
from ..kernel import trace_format as tf
from ..kernel.leftovers import remove_stale_tracing
from ..kernel.uprobe_events import UprobeEvents, event_format
from ..model import (Losses, ProfileProbe, TracepointProbe, UprobeProbe,
                     UstackError, python_sample)
from ..probes.fetchargs import probe_kinds
from ..target.process import Target
from .contract import Capture

# ip, sp, bp, bx: all that CFI-based unwinding on x86-64 reads (CFA is rsp, rbp,
# or rbx in ld.so's lazy-binding resolver)
DWARF_REGS_MASK = sum(1 << pe.X86_REGS.index(r) for r in ("bx", "bp", "sp", "ip"))
# and every general register where Python frames are read after the sample:
# one of them, or its copy saved on the stack by a callee, holds the eval
# loop's current frame, which tells whether the read is the sample's moment
PYTHON_REGS_MASK = DWARF_REGS_MASK | sum(1 << pe.X86_REGS.index(r) for r in (
    "ax", "bx", "cx", "dx", "si", "di", "r8", "r9", "r10", "r11", "r12", "r13", "r14", "r15"))
# build_id: each MMAP2 names the build-id of the file mapped, so a file is
# checked to be that one even after its process (and container) is gone
TRACKING_FLAGS = ("mmap", "mmap2", "comm", "comm_exec", "task", "build_id")
# The period of an event that must count (and carry BPF or tracking
# records) but never write a sample: in-kernel counting on trace events.
NEVER_SAMPLE = 1 << 62
# bytes taken from a CPU's buffer per read: a reader behind (a 32 MiB DWARF
# buffer full) then holds a few MiB at a time, not all of every buffer
READ_MOST = 4 << 20
# Python frames read for samples not decoded yet; more are samples a run
# ended without decoding
PYTHON_PENDING = 1 << 16


def define_uprobe(uprobes: UprobeEvents, probe: UprobeProbe, own: tuple = ()):
    """Define `probe` in tracefs with the fetch-args `own` (ustack's) before
    the user's; return ('group/name', its tracepoint id, its record's fields
    by name, an ArgsDecoder of the user's fetch-args or None for none)."""
    event = uprobes.define(probe.path, probe.file_offset,
                           probe.spec.kind == "uretprobe", probe.symbol or "addr",
                           own + probe.fetch_args, probe.label, probe.ref_ctr_offset)
    fmt = event_format(event)
    fields = tf.parse_format(fmt)
    args = tf.ArgsDecoder(fields, probe_kinds(probe)) if probe.fetch_args else None
    return event, tf.event_id(fmt), fields, args


def lockable_pages(pages: int, explicit: bool) -> int:
    """The ring buffer pages per CPU of a run without root: `pages`, or
    the most a user may lock (perf_event_mlock_kb, ulimit -l) when less;
    a UstackError when the user asked for more (`explicit`)."""
    cpus = len(pe.cpus_online())
    most = 1
    while cpus * (2 * most + 1) <= credentials.lockable_buffer_pages(cpus):
        most *= 2
    if pages <= most:
        return pages
    if explicit:
        raise UstackError(f"--buffer-pages {pages} is more than a user without root "
                          f"may lock here ({most} per CPU: perf_event_mlock_kb and "
                          "ulimit -l); take that or less")
    return most


def tracepoint_fields(probe: TracepointProbe):
    """An ArgsDecoder of the fields a tracepoint's events carry (--weight),
    or None for none."""
    if not probe.fields:
        return None
    from ..kernel.tracefs import event_format as tracepoint_format
    fields = tf.parse_format(tracepoint_format(probe.group, probe.name))
    return tf.ArgsDecoder(fields, {name: "dec" for name in probe.fields})


def _raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


class PerfCapture(Capture):
    """Opens the events, owns the fds and ring buffers, hands out chunks
    and decodes them into the run's stream (RawSamples and metadata).
    `python_frames`: an unwind.python_live.LiveFrames the session gives
    to have each DWARF sample's Python frames read as it comes off the
    ring (a PythonSample then), or None. `names`: the run's RuntimeNames
    (symbols/runtime_names.py), whose Ruby, PHP and Perl tables are told
    that the stacks carry their runtime's frames where `scripts` asks for
    them and the samples are copies: ustack unwinds those while their
    process lives, reading its Ruby, PHP and Perl frames
    (unwind/script_live.py)."""
    python_frames = None
    names = None

    def __init__(self, probes: list, target: Target,
                 buffer_pages: int = DEFAULT_BUFFER_PAGES,
                 modes: tuple = (), stack_size: int = DEFAULT_STACK_SIZE,
                 with_stacks: bool = True, user_only: bool = False,
                 scripts: tuple = (False, False, False)):
        self.probes = probes
        self.scripts = scripts          # (Ruby, PHP, Perl) frames wanted
        # a run without root: every event excludes the kernel (what
        # perf_event_paranoid 2 allows a user), and no tracefs is touched
        self.user_only = user_only
        # False: a BPF program counts the stacks (capture/bpf_capture.py) and no
        # sample is written; the buffers carry only the tracking records
        self.with_stacks = with_stacks
        # per probe: 'dwarf' samples carry registers and a stack copy
        self.modes = tuple(modes) or ("fp",) * len(probes)
        self.stack_size = stack_size
        self.target = target
        self.buffer_pages = buffer_pages
        self.fds: list = []
        self.sample_fds: list = []        # the probes' events: their losses are events
        self.tracking_fds: list = []      # a dummy event per CPU for the records below
        self.buffers: dict = {}           # cpu -> RingBuffer
        self.layouts: dict = {}           # event id -> EventLayout
        self.opened: list = []            # (probe, fd) of every event, in order
        self.uprobes = UprobeEvents()
        self._uprobe_ids: dict = {}       # (path, offset, kind, args) -> tracepoint id
        self._args: dict = {}             # tracepoint id -> ArgsDecoder
        self._attrs: dict = {}            # probe index -> (attr, layout)
        self._reader = RecordReader(self.layouts)
        self._python: dict = {}           # (tid, time) -> what python_frames read
        self._python_ids: frozenset | None = None   # the events whose samples it reads
        self._poll = select.poll()
        # the kernel's count of records our events could not write (read at
        # stop()); None where it cannot say (before Linux 6.0)
        self._count_lost = True
        self.kernel_lost: int | None = None
        self.records_lost = 0             # fork/comm/mmap records the buffers dropped

    def losses(self) -> Losses:
        """The kernel's per-event lost counters where it has them (exact
        even when the last PERF_RECORD_LOST was never written), else the
        LOST records read."""
        lost = self.kernel_lost if self.kernel_lost is not None else self._reader.lost
        return Losses(lost=lost, throttled=self._reader.throttled,
                      records_lost=self.records_lost)

    def _follow_scripts(self) -> None:
        """The names tables of the script runtimes asked for, told their
        frames come: in DWARF copies, which ustack unwinds as they come."""
        if "dwarf" not in self.modes or self.names is None:
            return
        for wanted, kind in zip(self.scripts, ("ruby", "php", "perl")):
            if wanted:
                self.names.get(kind).active = True

    # -- attributes per probe kind ---------------------------------------
    def _scope_flags(self) -> list:
        flags = ["exclude_callchain_kernel", "sample_id_all"]
        if self.user_only:
            flags += ["exclude_kernel", "exclude_hv"]
        scope = self.target.scope
        if scope in ("pid", "command"):
            flags.append("inherit")
        if scope == "command":
            flags += ["disabled", "enable_on_exec"]
        return flags

    def _tracking_attr(self):
        """A dummy event that writes the fork/comm/mmap records and no
        sample: the probes' own lost counts are then lost events only
        (the kernel counts every record an event failed to write)."""
        return pe.make_attr(pe.TYPE_SOFTWARE, pe.SW_DUMMY,
                            sample_type=BASE_SAMPLE_TYPE & ~pe.SAMPLE_CALLCHAIN,
                            flags=self._scope_flags() + list(TRACKING_FLAGS),
                            read_format=pe.FORMAT_LOST if self._count_lost else 0,
                            clock_monotonic=True)

    def _attr(self, index: int):
        """The perf_event_attr for one probe, and the layout of its samples."""
        probe = self.probes[index]
        flags = self._scope_flags()
        sample_type = BASE_SAMPLE_TYPE
        stack = regs = 0
        slot = None
        if not self.with_stacks:
            sample_type &= ~pe.SAMPLE_CALLCHAIN
        elif self.modes[index] == "dwarf":
            # registers + a copy of the stack for the DWARF unwinder; the
            # kernel's frame-pointer walk would be wasted work
            sample_type |= pe.SAMPLE_REGS_USER | pe.SAMPLE_STACK_USER
            regs = DWARF_REGS_MASK if self.python_frames is None else PYTHON_REGS_MASK
            stack = self.stack_size
            flags.append("exclude_callchain_user")
        elif getattr(probe, "return_address_slot", None) is not None:
            slot = probe.return_address_slot
            stack = 8 * (slot + 1)
            sample_type |= pe.SAMPLE_STACK_USER
        # (a profile's frequency overrides the period)
        period = 1 if self.with_stacks else NEVER_SAMPLE
        common = dict(sample_type=sample_type, flags=flags, period=period,
                      read_format=pe.FORMAT_LOST if self._count_lost else 0,
                      wakeup_watermark=self.buffer_pages * PAGE // 4,
                      max_stack=pe.max_stack(), regs_user=regs, stack_user=stack,
                      # the clock of the in-kernel unwinder's ring records too
                      clock_monotonic=True)
        layout = EventLayout(index, stack, regs, slot)
        if isinstance(probe, UprobeProbe):
            ident = self.uprobe_id(probe)
            if probe.fetch_args:         # the values come in the RAW record
                common["sample_type"] |= pe.SAMPLE_RAW
                layout = EventLayout(index, stack, regs, slot, self._args[ident])
            return pe.make_attr(pe.TYPE_TRACEPOINT, ident, **common), layout
        if isinstance(probe, TracepointProbe):
            fields = tracepoint_fields(probe)
            if fields is not None:       # the values come in the RAW record
                common["sample_type"] |= pe.SAMPLE_RAW
                layout = EventLayout(index, stack, regs, slot, fields)
            return pe.make_attr(pe.TYPE_TRACEPOINT,
                                tracepoint_id(probe.group, probe.name),
                                **common), layout
        if isinstance(probe, ProfileProbe):
            return pe.make_attr(pe.TYPE_SOFTWARE, pe.SW_CPU_CLOCK,
                                freq=probe.hz, **common), layout
        raise TypeError(probe)

    def uprobe_id(self, probe: UprobeProbe) -> int:
        """Tracepoint id of the tracefs uprobe for `probe`, made on first use."""
        key = (probe.path, probe.file_offset, probe.spec.kind, probe.fetch_args)
        if key not in self._uprobe_ids:
            _event, ident, _fields, args = define_uprobe(self.uprobes, probe)
            self._uprobe_ids[key] = ident
            if args is not None:
                self._args[ident] = args
        return self._uprobe_ids[key]

    def _open_one(self, index: int, pid: int, cpu: int) -> None:
        self.interrupt.check()
        probe = self.probes[index]
        made = self._attrs.get(index)
        if made is None:
            made = self._attrs[index] = self._attr(index)
        attr, layout = made
        fd = self._open_attr(attr, pid, cpu, probe.label)
        self.sample_fds.append(fd)
        self.opened.append((probe, fd))
        if self.with_stacks:
            self.layouts[pe.event_id(fd)] = layout
        # else no layout: a profile sample written before the BPF program
        # is attached (an event of -p is live at once) has no callchain and
        # is skipped as not ours; the program counts every later hit
        self._into_ring(fd, cpu)

    def _open_tracking(self, pid: int, cpu: int) -> None:
        fd = self._open_attr(self._tracking_attr(), pid, cpu, "tracking")
        self.tracking_fds.append(fd)
        self._into_ring(fd, cpu)

    def _open_attr(self, attr, pid: int, cpu: int, what: str) -> int:
        try:
            fd = pe.open_event(attr, pid, cpu, what=what)
        except pe.PerfOpenError as e:
            if e.errno != errno.EINVAL or not attr.read_format:
                raise
            # a kernel before 6.0 has no FORMAT_LOST: count LOST records only
            self._count_lost = False
            for other, _layout in self._attrs.values():
                other.read_format = 0
            attr.read_format = 0
            fd = pe.open_event(attr, pid, cpu, what=what)
        self.fds.append(fd)
        return fd

    def _into_ring(self, fd: int, cpu: int) -> None:
        """The CPU's ring buffer, mapped on its first event; later ones write into it."""
        ring = self.buffers.get(cpu)
        if ring is None:
            try:
                ring = RingBuffer(fd, self.buffer_pages)
            except OSError as e:
                raise UstackError(f"cannot map a {self.buffer_pages}-page perf "
                                  f"buffer: {e.strerror}; try --buffer-pages 256")
            self.buffers[cpu] = ring
            self._poll.register(fd, select.POLLIN)
        else:
            pe.set_output(fd, ring.fd)

    def wake_on(self, fd: int) -> None:
        """read_chunks' wait also ends when `fd` (a BPF ring buffer, which
        wakes its reader once per record that finds it drained) has data."""
        self._poll.register(fd, select.POLLIN)

    def _open_for(self, pid: int, cpus: list) -> None:
        for cpu in cpus:
            self._open_tracking(pid, cpu)
            for index in range(len(self.probes)):
                self._open_one(index, pid, cpu)

    def open(self) -> None:
        _raise_fd_limit()
        self._follow_scripts()
        if not self.user_only:
            remove_stale_tracing()        # what a killed run left behind
        try:
            scope = self.target.scope
            cpus = pe.cpus_online()
            if scope == "system":
                self._open_for(-1, cpus)
            elif scope == "command":
                self._open_for(self.target.pid, cpus)
            else:
                traced = 0                  # every thread, inherited by new ones
                for tids in procfs.thread_batches(self.target.pid):
                    for tid in sorted(tids):
                        try:
                            self._open_for(tid, cpus)
                        except pe.PerfOpenError as e:
                            if e.errno != 3:        # ESRCH: thread just exited
                                raise
                        traced += 1
                if not traced:
                    raise UstackError(f"no such process: {self.target.pid}")
        except Interrupted:
            raise                       # the caller closes (in the background)
        except BaseException:
            self.close()
            raise

    def start(self) -> None:
        if self.target.scope == "command":
            self.target.release()       # execve enables the events
            self.target.resume()

    def read_chunks(self, timeout_ms: int) -> list:
        """Wait up to timeout_ms for data, then drain every buffer."""
        try:
            for fd, ev in self._poll.poll(timeout_ms):
                if ev & (select.POLLHUP | select.POLLERR):
                    self._poll.unregister(fd)   # its task exited; keep reading
        except InterruptedError:
            pass
        chunks = []
        for ring in self.buffers.values():
            chunk = ring.read(READ_MOST)
            if chunk:
                chunks.append(chunk)
                if self.python_frames is not None:
                    self._read_python(chunk)
        return chunks

    def _read_python(self, chunk) -> None:
        """Read the Python frames of each DWARF sample's thread now, while
        it may still be where the sample found it (decoding comes later);
        follow the processes' execs, exits and new mappings."""
        ids = self._python_ids
        if ids is None:
            ids = self._python_ids = frozenset(
                i for i, layout in self.layouts.items() if layout.regs_mask)
        frames, pending = self.python_frames, self._python
        for what, pid, tid, t in moments(chunk, ids):
            if what == PROCESS_GONE:
                frames.forget(pid)
            elif what == MAPPED:
                frames.mapped(pid)
            else:
                read = frames.read(pid, tid)
                if read is not None:
                    if len(pending) >= PYTHON_PENDING:
                        pending.clear()
                    pending[(tid, t)] = read

    def decode(self, chunk, metas: list, samples: list, start: int = 0,
               budget: int = 1 << 62) -> int:
        """RecordReader.read, each sample whose Python frames were read a
        PythonSample."""
        first = len(samples)
        off = self._reader.read(chunk, metas, samples, start, budget)
        pending = self._python
        if pending:
            for i in range(first, len(samples)):
                s = samples[i]
                read = pending.pop((s.tid, s.time_ns), None)
                if read is not None:
                    samples[i] = python_sample(s, read)
        return off

    def flush_lost(self) -> None:
        """Make the kernel report losses it is still holding back.

        The kernel writes a LOST record only when the next record fits in the
        buffer; after a target exits nothing more comes, so the last loss
        would stay silent. A short-lived cpu-clock event per CPU, writing
        into each drained buffer (its samples have an id no layout knows,
        so they are skipped), makes the kernel emit that LOST record.
        (Not without root: a CPU's events are root's to open.)"""
        if self.user_only:
            return
        fds = []
        try:
            for cpu, ring in self.buffers.items():
                attr = pe.make_attr(pe.TYPE_SOFTWARE, pe.SW_CPU_CLOCK,
                                    sample_type=BASE_SAMPLE_TYPE, period=100_000,
                                    flags=("sample_id_all",
                                           "exclude_callchain_kernel",
                                           "exclude_callchain_user"))
                fd = pe.open_event(attr, -1, cpu, what="cpu-clock")
                fds.append(fd)
                pe.set_output(fd, ring.fd)
            time.sleep(0.02)              # many 0.1 ms ticks on every CPU
        except (OSError, UstackError):
            pass                          # best effort: losses so far are counted
        finally:
            for fd in fds:
                os.close(fd)

    def stop(self) -> None:
        # What was lost, from the kernel's per-event counters: exact whether
        # or not the last PERF_RECORD_LOST was ever written (the kernel
        # writes one only in front of a later record that fits, which
        # flush_lost() has to provoke) and read.
        if self._count_lost and self.fds:
            try:
                self.kernel_lost = sum(pe.read_lost(fd) for fd in self.sample_fds)
                self.records_lost = sum(pe.read_lost(fd) for fd in self.tracking_fds)
            except OSError:
                self.kernel_lost = None
        for fd in self.fds:
            try:
                pe.disable(fd)
            except OSError:
                pass

    def count_samples(self, chunk: bytes, start: int) -> int:
        """The samples of a chunk from `start`, undecoded."""
        return count_samples(chunk, start)

    def defines_probes(self) -> bool:
        return bool(self.uprobes.names)

    def release(self) -> None:
        """close() in a process whose descriptors another one holds copies
        of (capture/closer.py): only this process's hold goes; the other
        closes the events and removes the probes."""
        self.uprobes.forget()
        self.close()

    def unmap(self) -> None:
        """Drop this process's mappings of the ring buffers (read no more)."""
        for ring in self.buffers.values():
            ring.close()
        self.buffers.clear()

    def close(self) -> None:
        if self.python_frames is not None:
            self.python_frames.close()
        self.unmap()
        for fd in self.fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self.fds.clear()
        self.sample_fds.clear()
        self.tracking_fds.clear()
        self.uprobes.close()            # only after the events are closed

