"""Decode a private ftrace instance's trace_pipe_raw pages into RawSamples.

Two kinds of records make one sample:
- syscalls and tracepoints (and uprobes under --unwind fp) are followed on
  the same CPU by a `user_stack` record (the `userstacktrace` option): a
  frame-pointer walk of at most 8 return addresses, and the tgid;
- a uprobe whose fetch-args copied %ip, %sp, %bp and stack words carries
  what a DWARF unwinder needs in its own record, laid out by its format.
The sched_process_fork/exec records (see follow_processes; from the run's
processes' instance, PROCESSES_CPU, where no user stack follows them) and
each sample are handed, in time order across CPUs, to a watch that says
what they mean for the process's maps (ftrace has no mmap records).
Each CPU has its own buffer, read one after the other: a fork written on
the CPU read first can be missed by a pass that finds its child's samples
on the next one. So records wait until a horizon chunk (see
horizon_chunk) says every CPU has been read past their time: a child's
samples then never go out before the fork that explains them.
Losses are counted exactly from the ring buffer's overrun totals and the
pairs broken by an overwrite (see TracefsRecords.lost)."""
from __future__ import annotations

import bisect
import struct
from collections import deque
from operator import itemgetter

from ..model import FTRACE_STACK_FULL, RawSample, UstackError
from . import procfs
from . import trace_format as tf
from .ftrace_ring import records

FTRACE_STACK_ENTRIES = 8
TGID_CACHE = 65536                   # threads whose tgid the reader remembers
CPU_PREFIX = struct.Struct("<I4x")   # chunk prefix: which CPU the page is from
HORIZON_CPU = 0xFFFFFFFF             # a chunk of this "CPU" holds a horizon
# a chunk's CPU with this bit: a page of the processes' instance, whose
# fork and exec records have no user stack after them
PROCESSES_CPU = 1 << 16
EVERYTHING = (1 << 64) - 1           # a horizon past every record read
_Q = struct.Struct("<Q")
_FULL = _Q.pack(FTRACE_STACK_FULL)
_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")
_COMMON = struct.Struct("<HBBi")     # common_type, flags, preempt_count, pid
_TIME = itemgetter(0)


def horizon_chunk(ns: int) -> bytes:
    """A chunk saying that every CPU's buffer was read after `ns` (the
    trace clock's time when a pass over them began): the records stamped
    before it are all in, and go out in time order."""
    return CPU_PREFIX.pack(HORIZON_CPU) + _Q.pack(min(ns, EVERYTHING))


class EventLayout:
    """What the reader needs about one event id: where the fields ustack
    fetched for itself sit in its record (None: not fetched)."""
    __slots__ = ("probe", "args", "keep", "ip", "sp", "bp", "stack",
                 "stack_len", "return_address")

    def __init__(self, probe: int):
        self.probe = probe               # index of the probe in the run's list
        self.args = None                 # ArgsDecoder of the user's fetch-args
        self.keep = False                # the record is needed after parsing
        self.ip = self.sp = self.bp = self.stack = None
        self.return_address = None
        self.stack_len = 0

    @property
    def dwarf(self) -> bool:
        return self.stack is not None


class TracefsRecords:
    """Pages in, RawSamples and metadata out."""

    def __init__(self, layouts: dict):
        self.layouts = layouts           # event id -> EventLayout
        self.user_stack_id = -1
        # where a user_stack record keeps the tgid and its return addresses
        # (set_user_stack reads them from the event's format)
        self.tgid_at, self.callers_at = 8, 16
        self.stack_entries = FTRACE_STACK_ENTRIES
        self.lost_entries = 0            # ring-buffer entries the kernel lost
        self.metas: deque = deque()      # events read from /proc for us
        # read from /proc at a process's exit: (pid, execs, events), held
        # until the records have shown that many of its execs, so they
        # follow the exec they belong after whichever CPU's page holds it
        self._held: deque = deque()
        self._execs: dict = {}           # pid -> [exec records read, the last one's time]
        self._pending: dict = {}         # cpu -> event waiting for its user stack
        # entries whose partner the ring buffer overwrote, for exact losses
        self.orphan_stacks = 0           # user stacks whose event is gone
        self.stackless = 0               # events whose user stack is gone
        self._tgids: dict = {}
        # sched_process_fork/exec: event id -> (kind, field offsets), and the
        # watch told of them and of each sample (see follow_processes)
        self._lifecycle: dict = {}
        self.watch = None
        self._out_metas: list = []       # the metadata list of the read() under way
        # records read but not decoded: per CPU, [(time, cpu, chunk, offset,
        # length)] in the buffer's order; those before the horizon are decoded
        self._queued: dict = {}
        # False: a page's records are decoded as it is read; the capture sets
        # True, and they wait for a horizon chunk
        self.ordered = False

    def set_user_stack(self, fmt: str) -> None:
        """The ftrace/user_stack event's id and layout, from its format
        (an ftrace-internal event: it has a format file but no id file)."""
        fields = tf.parse_format(fmt)
        try:
            tgid, callers = fields["tgid"], fields["caller"]
        except KeyError as e:
            raise UstackError(f"this kernel's ftrace/user_stack has no {e} field")
        self.user_stack_id = tf.event_id(fmt)
        self.tgid_at, self.callers_at = tgid.offset, callers.offset
        self.stack_entries = callers.count

    def follow_processes(self, watch, fork_format: str = "", exec_format: str = "") -> None:
        """Decode sched_process_fork and sched_process_exec records (the
        capture enables them; none without their formats) into calls of
        watch.fork(time, parent tid, child, metas) and watch.exec(time, pid,
        filename, metas); and call watch.sample(sample, metas) for each
        sample, in the records' order."""
        self.watch = watch
        if not fork_format or not exec_format:
            return
        fork, exe = tf.parse_format(fork_format), tf.parse_format(exec_format)
        try:
            self._lifecycle = {
                tf.event_id(fork_format): ("fork", fork["parent_pid"].offset,
                                           fork["child_pid"].offset),
                tf.event_id(exec_format): ("exec", exe["pid"].offset,
                                           exe["filename"].offset)}
        except KeyError as e:
            raise UstackError(f"this kernel's sched_process_fork/exec have no {e} field")

    def after_execs(self, pid: int, execs: int, events: list) -> None:
        """Metadata events of process `pid` that belong after its `execs`-th
        exec record (counted from when the records were switched on): they
        go out once that record has been read, or at the end of the run."""
        self._held.append((pid, execs, events))

    def _release_held(self, metas: list, all_of_them: bool = False) -> None:
        """Held events whose exec record has been read go out at its time
        (the pieces' metadata is put in time order: time 0 would put them
        before the exec, into the program the process ran before it)."""
        for _ in range(len(self._held)):
            pid, execs, events = self._held.popleft()
            seen, at = self._execs.get(pid, (0, 0))
            if all_of_them or seen >= execs:
                metas.extend((at, e) for e in events)
            else:
                self._held.append((pid, execs, events))

    def _process_event(self, kind: str, at: tuple, chunk, off: int, t: int) -> None:
        if kind == "fork":
            parent, child = (_I32.unpack_from(chunk, off + o)[0] for o in at)
            self.watch.fork(t, parent, child, self._out_metas)
            return
        pid = _I32.unpack_from(chunk, off + at[0])[0]
        self._execs[pid] = (self._execs.get(pid, (0, 0))[0] + 1, t)
        loc = _U32.unpack_from(chunk, off + at[1])[0]
        name = bytes(chunk[off + (loc & 0xFFFF):off + (loc & 0xFFFF) + (loc >> 16)])
        self.watch.exec(t, pid, name.split(b"\0", 1)[0].decode(errors="replace"),
                        self._out_metas)

    def _tgid(self, tid: int) -> int:
        """For an event without its user stack record (which says the tgid)."""
        pid = self._tgids.get(tid)
        if pid is None:
            if len(self._tgids) >= TGID_CACHE:
                self._tgids.clear()
            pid = self._tgids[tid] = procfs.tgid(tid)
        return pid

    def _emit(self, out: list, ev: list, pid, chain: bytes) -> None:
        layout, tid, t, cpu, extra = ev
        if layout is None:
            return                       # a process event: its stack is no sample
        if pid is None:
            pid = self._tgid(tid)
        regs = stack = None
        ret = b""
        args = ()
        if extra:
            q = _Q.unpack_from
            if layout.stack is not None:
                regs = {"ip": q(extra, layout.ip)[0], "sp": q(extra, layout.sp)[0],
                        "bp": q(extra, layout.bp)[0]}
                stack = memoryview(extra)[layout.stack:layout.stack + layout.stack_len]
            elif layout.return_address is not None:
                ret = extra[layout.return_address:layout.return_address + 8]
            if layout.args is not None:
                args = layout.args.decode(extra)
        sample = RawSample(layout.probe, pid, tid, t, cpu, chain, ret,
                           regs, stack, args)
        if self.watch is not None:
            self.watch.sample(sample, self._out_metas)
        out.append(sample)

    def read(self, chunk, metas: list, samples: list, start: int = 0,
             budget: int = 1 << 62) -> int:
        """Take one chunk (a CPU's page, or a horizon) whole, as
        RecordReader.read does a perf chunk, and decode the records that
        are before the horizon; an empty chunk means the end of the run:
        every record, and the events still waiting for a user stack, go
        out."""
        while self.metas:
            metas.append((0, self.metas.popleft()))
        self._out_metas = metas
        if not chunk:
            self._decode_queued(EVERYTHING, samples)
            for cpu in sorted(self._pending):
                self.stackless += 1
                self._emit(samples, self._pending.pop(cpu), None, b"")
            self._release_held(metas, all_of_them=True)
            return 0
        cpu = CPU_PREFIX.unpack_from(chunk, 0)[0]
        if cpu == HORIZON_CPU:
            self._decode_queued(_Q.unpack_from(chunk, CPU_PREFIX.size)[0], samples)
        else:
            queue = self._queued.setdefault(cpu, [])
            queue.extend((t, cpu, chunk, off, length)
                         for t, off, length in records(chunk, CPU_PREFIX.size))
            if not self.ordered:
                self._decode_queued(EVERYTHING, samples)
        if self._held:
            self._release_held(metas)
        return len(chunk)

    def _decode_queued(self, horizon: int, samples: list) -> None:
        """Decode the queued records stamped before `horizon`, in time order
        across CPUs (each CPU's in its buffer's order: the sort is stable,
        and merges the CPUs' runs). An event waits for the user stack that
        follows it on its CPU; a user stack completes its sample."""
        ready = []
        for queue in self._queued.values():
            n = len(queue)
            if n and queue[-1][0] >= horizon:
                n = bisect.bisect_left(queue, horizon, key=_TIME)
            if n == len(queue):
                ready += queue
                queue.clear()
            elif n:
                ready += queue[:n]
                del queue[:n]
        if not ready:
            return
        ready.sort(key=_TIME)
        pending = self._pending
        layouts, lifecycle = self.layouts, self._lifecycle
        ustack_id = self.user_stack_id
        tgid_at, callers_at = self.tgid_at, self.callers_at
        entries = self.stack_entries
        common = _COMMON.unpack_from
        for t, cpu, chunk, off, length in ready:
            typ, _flags, _pc, tid = common(chunk, off)
            if typ == ustack_id:
                ev = pending.pop(cpu, None)
                if ev is not None:
                    tgid = _U32.unpack_from(chunk, off + tgid_at)[0]
                    callers = chunk[off + callers_at:off + callers_at + 8 * entries]
                    n = 0
                    while n < entries and _Q.unpack_from(callers, 8 * n)[0]:
                        n += 1
                    chain = bytes(callers[:8 * n])
                    if n == entries:         # full: the walk may have gone on
                        chain += _FULL
                    self._emit(samples, ev, tgid, chain)
                else:
                    self.orphan_stacks += 1
                continue
            layout = layouts.get(typ)
            process = lifecycle.get(typ)
            if process is not None:
                self._process_event(process[0], process[1:], chunk, off, t)
                if cpu & PROCESSES_CPU:
                    continue                 # no user stack follows it there
            elif layout is None:
                continue
            ev = pending.pop(cpu, None)
            if ev is not None:               # it got no user stack (kernel task)
                self.stackless += 1
                self._emit(samples, ev, None, b"")
            extra = bytes(chunk[off:off + length]) if layout is not None and layout.keep else b""
            # a process event too waits for its user stack, which is no sample's
            pending[cpu] = [layout, tid, t, cpu, extra]

    @property
    def lost(self) -> int:
        """Events lost. The stats count ring-buffer entries, and
        userstacktrace writes two per event (the event, then its user
        stack): lost entries = 2 per event lost whole + 1 per event whose
        entry alone was lost (its stack was read as an orphan) + 1 per event
        read without its stack. Kernel threads (system-wide) write no stack
        entry: there this undercounts. An odd total means one event lost
        only half of its pair without the stats seeing it (a user stack the
        kernel skipped, or an event it dropped after writing the stack: seen
        once in 100 000 events in CI), so it rounds up: that event is lost
        either way."""
        entries = self.lost_entries + self.orphan_stacks - self.stackless
        return (max(0, entries) + 1) // 2
