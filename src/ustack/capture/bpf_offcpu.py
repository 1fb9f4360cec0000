"""Off-CPU time in the kernel (bcc's offcputime/offwaketime, with the
in-kernel DWARF unwinder of bpf_unwind.py): where threads block, weighted
by how long they stay off the CPU.

Two programs:
- sched_switch, on the raw tracepoint (its arguments: preempt, prev, next,
  prev's state; the pids read from the tasks at BTF's offsets). Not the
  classic tracepoint: a program there is skipped while any BPF program or
  bpf(2) map call holds the CPU's bpf_prog_active — ustack's own map
  updates when a new program maps its libraries, preempted by that program
  going to sleep, lost its first block (a raw tracepoint's program guards
  only against itself). Current is `prev`, the thread leaving the CPU. First
  the thread coming in (`next`): if it was seen leaving, its time off the
  CPU (now - then) is added to OFFCPU[(its pid_tgid, kernel stack, user
  stack hash, waker's pid_tgid, kernel stack, user stack hash)] when it
  lies within [min, max]. The same of `prev` if it is still in START: the
  kernel did not report its switch-in (6.18 on a loaded machine, about a
  block in a hundred, unseen by ftrace and perf as well), and its time
  off the CPU is then the time since it left less the CPU time it used
  since (task->se.sum_exec_runtime, kept in START). Then `prev`, if it is a thread of interest
  (the target's; system-wide: anyone but ustack, the idle task and kernel
  threads unless kernel stacks are asked for) and its state is one asked
  for: its user stack is unwound (src/ustack/bpf/unwind.h's walk: bpf_task_pt_regs
  gives the registers it will return to user space with), stored in
  STACKS, and START[tid] = (now, pid_tgid, stack hash, kernel stack id,
  CPU time used).
- sched:sched_waking (--wakers), on the classic tracepoint (its record's
  field offsets from the format file). It runs in the waker's context (unlike
  sched_wakeup, which may run on the wakee's CPU): for a wakee in START,
  the waker's stack is unwound and WAKERS[wakee tid] = (waker's
  pid_tgid, stack hash, kernel stack id), taken at the wakee's switch-in.
  A wakeup from an interrupt names whatever ran then (bcc does the same);
  from the idle task, no waker.
A Python process's stacks get its Python frames (bpf/python.h, as the
unwinder's do; capture/bpf_python.py), their new code objects reported
through a ring of their own.
A walk that cannot finish at the switch goes to user space whole: the
scheduler's tracepoints run with interrupts off, where the kernel's
find_vma answers once per CPU until an irq_work unlocks the memory map
(VMA_BUSY: a fresh process's first blocks, each meeting a region of its
map not cached yet), or an object's rows are not loaded yet. The program
writes the thread's registers and stack into the ring (a deferred record,
as count's and profile's) and sums the block under the record's id in
place of a stack hash; ustack unwinds the record and the block is
reported under that stack, its time exact (as wakers' stacks).
Nothing but the sums, the distinct stacks and those records leaves the
kernel. The programs are src/ustack/bpf/offcpu.bpf.c's."""
from __future__ import annotations

import os
import struct

from ..bpf import object_path
from ..kernel import bpf_syscall
from ..kernel.bpf_object import bpf_object
from ..kernel.trace_format import parse_format
from ..kernel.tracefs import event_format
from ..model import KERNEL_UNWIND_STOP, Losses, RawSample
from .bpf_capture import uncounted
from .bpf_dwarf import UnwindCountCapture
from .bpf_python import CODE_RING_BYTES
from .bpf_unwind import (DEFAULT_ROWS, DEFER_STACK, KernelUnwinder, deferral_ring_bytes,
                         kernel_rodata, ring_samples, unwind_fresh)
from .kernel_offsets import Offsets
from .runtime_passes import MODE_PASS_PROGRAMS, runtime_maps
from .script_passes import script_options
from ..values import value


def offcpu_object():
    """src/ustack/bpf/offcpu.bpf.c's object: its programs and the layouts
    (ustack.h) this module reads."""
    return bpf_object(object_path("offcpu"))


_OBJ = offcpu_object()
INTERRUPT_HASH = 1                  # WAKERS' hash of a wakeup from an interrupt (ustack.h)
# START's value: when, pid_tgid, stack hash, kernel stack id
START = _OBJ.layout("offcpu_start").struct
# WAKERS' value: the waker's pid_tgid, stack hash, kernel stack id
WAKER = _OBJ.layout("offcpu_waker").struct
# OFFCPU's key: the blocked thread's pid_tgid, kernel stack id, stack hash,
# then the waker's (all 0 without one); its value: nanoseconds, summed
OFF_KEY = _OBJ.layout("offcpu_key").struct
_KEY_FIELDS = _OBJ.layout("offcpu_key").fields
_U64 = struct.Struct("<Q")
# the stacks of the deferred records kept until the report (8 KiB each,
# more with --stack-size): past this a block's stack is said cut, its
# reason the id's low byte
MAX_DEFERRED_BYTES = 32 << 20

# slots of the error array: what could not be recorded (enum offcpu_error)
_ERRORS = _OBJ.enum("offcpu_error")
# the walks that go to user space (offcpu.bpf.c's defer_walk), whose
# status a deferred record's id ends with
_DEFERRED_WHY = {_OBJ.enum("unwind_status")[name] for name in ("VMA_BUSY", "NO_TABLE",
                                                                  "TABLE_FULL", "TRUNCATED")}

# sched_switch's prev_state (the kernel's TASK_REPORT bits); 0 is running
# (preempted, bit 0x100 then says so): ps/bcc's letters
STATES = {"R": 0, "S": 0x1, "D": 0x2, "T": 0x4, "t": 0x8, "X": 0x10, "Z": 0x20,
          "P": 0x40, "I": 0x80}
ALL_STATES = tuple(STATES)


@value
class OffcpuFilter:
    """What blocks count: their time off the CPU within [min_ns, max_ns]
    (None: no upper bound), the blocking thread's state one of `states`
    (STATES' letters), and whether to record who woke it."""
    min_ns: int = 1000
    max_ns: int | None = None
    states: tuple = ALL_STATES
    wakers: bool = False


def state_mask(states) -> tuple:
    """(whether R counts, the bits of the other states) of STATES letters."""
    return "R" in states, sum(STATES[s] for s in states if s != "R")


@value
class Blocked:
    """One OFFCPU entry: a thread's blocking stack (and its waker's) with
    the nanoseconds it spent off the CPU there."""
    pid: int
    tid: int
    chain: bytes                    # user frames, innermost first (bpf_unwind's)
    kernel_stack: int               # stack id, -1 for none
    waker_pid: int                  # 0: no waker recorded
    waker_tid: int
    waker_chain: bytes
    waker_kernel_stack: int
    ns: int
    woken_by_interrupt: bool = False
    deferred: object = None         # the blocked stack's deferred RawSample, if it went so
    waker_deferred: object = None   # the same of the waker's


class _Fields:
    """Offsets of a tracepoint record's fields (its format file)."""

    def __init__(self, group: str, name: str):
        self.fields = parse_format(event_format(group, name))

    def __getitem__(self, name: str) -> int:
        return self.fields[name].offset


class OffcpuCounter(KernelUnwinder):
    """The unwinder's maps and programs, plus START, WAKERS and OFFCPU;
    probe 0 is sched_switch, probe 1 (with wakers) sched_waking."""

    def __init__(self, probes: list, owned, tables, *, filter_: OffcpuFilter,
                 stack_storage: int, kernel: bool = False, filter_tgid=None, armed=None,
                 exclude_tgid: int | None = None, python: bool = False, js: bool = False,
                 rows: int = DEFAULT_ROWS, buffer_pages: int = 0,
                 stack_size: int = DEFER_STACK, php: bool = False, perl: bool = False,
                 ruby: bool = False):
        self.filter = filter_
        self.exclude_tgid = exclude_tgid
        # its ring: the deferred records, and those of new code objects
        super().__init__(probes, owned, tables, stack_storage=stack_storage, kernel=kernel,
                         filter_tgid=filter_tgid, armed=armed, python=python, js=js, rows=rows,
                         php=php, perl=perl, ruby=ruby,
                         ring_bytes=max(deferral_ring_bytes(buffer_pages, stack_size),
                                        CODE_RING_BYTES), stack_size=stack_size)
        self.deferred: dict = {}        # a deferred record's id -> its RawSample
        self.deferred_bytes = 0         # their stacks' bytes, up to MAX_DEFERRED_BYTES
        self.fresh: list = []           # ids of those not unwound yet (unwind_deferred)
        self.not_kept: set = set()      # ids of the records past it
        obj = offcpu_object()
        self.start = owned.map(obj.make_map("start"))
        self.wakers = owned.map(obj.make_map("wakers"))
        self.offcpu = owned.map(obj.make_map("offcpu", max(10240, 2 * stack_storage)))
        self.off_errors = owned.error_counters(owned.map(obj.make_map("off_errors")),
                                               _ERRORS)
        if self.passes is not None:     # offcpu.bpf.c's own (no deferred Python pass)
            self.passes.programs = MODE_PASS_PROGRAMS

    def _program(self, index: int, probe) -> int:
        """offcpu.bpf.c's offcpu_switch (probe 0) or offcpu_waking."""
        fd = self.owned.program(self._load(
            "offcpu_switch" if index == 0 else "offcpu_waking", index, f"ustack_off{index}"))
        try:
            self.verified[index] = bpf_syscall.verified_insns(fd)
        except OSError:
            pass
        return fd

    def _pass_program(self, program: str, passes: bpf_syscall.Map, probe,
                      by_cookie: bool) -> int:
        """A runtime's pass program (passes.h) for sched_switch's program
        (a raw tracepoint's) or sched_waking's, whose event it ends."""
        index = self.probes.index(probe)
        return self.owned.program(self._load(
            program, index, f"ustack_{program}"[:15], passes,
            bpf_syscall.PROG_RAW_TRACEPOINT if index == 0 else bpf_syscall.PROG_TRACEPOINT))

    def _load(self, program: str, index: int, name: str, passes=None,
              prog_type: int | None = None) -> int:
        """One of offcpu.bpf.c's programs for probe `index` (0
        sched_switch, 1 sched_waking), its fd; `passes`: a pass program's
        PASSES array, else the run's for that probe (runtime_passes.py:
        the walk's program goes on in the passes of the runtimes met)."""
        obj = offcpu_object()
        if passes is None and self.passes is not None:
            passes = self.passes.array_for(self.probes[index], kind=str(index))
        named = {**self.unwind_maps.named(), "start": self.start, "wakers": self.wakers,
                 "offcpu": self.offcpu, "off_errors": self.off_errors}
        for key, m in (("kernel_stacks", self.kstacks), ("armed", self.armed),
                       ("tgids", self.tgids), ("ring", self.ring), ("passes", passes)):
            if m is not None:
                named[key] = m
        named.update(runtime_maps(self))
        flt, off = self.filter, Offsets.of_this_kernel()
        running, bits = state_mask(flt.states)
        inline = passes is None         # the runtimes' passes verified in this program
        wanted = {"OFF_ONLY_TRACED": self.tgids is not None,
                  "OFF_WAIT_FOR_EXEC": self.armed is not None,
                  "OFF_EXCLUDE": self.exclude_tgid is not None,
                  "OFF_USER_ONLY": not self.kernel,
                  "OFF_KERNEL_STACK": self.kstacks is not None,
                  "OFF_WAKERS": flt.wakers, "OFF_MAX": flt.max_ns is not None,
                  "OFF_STATES": not (running and bits == sum(STATES.values())),
                  "OFF_RUNNING": running, "OFF_PYTHON": inline and self.python is not None,
                  "OFF_V8": inline and self.v8 is not None, "OFF_DEFER": self.ring is not None,
                  "OFF_PASS_CALLS": not inline,
                  **{k: inline and on for k, on in script_options(self, "OFF").items()}}
        options = obj.enum("offcpu_option")
        rodata = {**kernel_rodata(off, self.unwind_maps), "off_options": sum(
                      options[k] for k, on in wanted.items() if on),
                  "min_ns": flt.min_ns, "max_ns": flt.max_ns or 0,
                  "exclude_tgid": self.exclude_tgid or 0, "state_bits": bits,
                  "task_pid": off.task_pid, "task_exit_state": off.task_exit_state,
                  "task_stack": off.task_stack, "task_fsbase": off.task_fsbase,
                  "task_runtime": off.task_runtime,
                  "waking_pid": _Fields("sched", "sched_waking")["pid"] if index else 0,
                  "defer_stack": self.defer_stack, "pass_of_waking": int(index == 1)}
        before = set(named)
        try:
            fd = obj.load(program, named, rodata, prog_type, name=name)
        finally:
            for key in set(named) - before:     # declared maps this run does not use
                named[key].close()
        return fd

    def attach(self, capture) -> None:
        """sched_switch's program on the raw tracepoint; sched_waking's on an
        event of its own, as BpfCounter attaches trace events."""
        self.load_programs()
        for index, probe in enumerate(self.probes):
            fd = self.loaded[index]
            if index == 0:
                self.owned.link(bpf_syscall.attach_raw_tracepoint("sched_switch", fd))
            else:
                bpf_syscall.attach(self._anchor(capture, probe), fd)

    # -- reading ------------------------------------------------------------------
    def take_deferred(self, samples: list) -> None:
        """The deferred records ring_samples made (their id is the weight
        it read), kept by id for blocked()."""
        for s in samples:
            if s.regs is None or not s.args:
                continue
            record_id = s.args[0][2] & (1 << 64) - 1
            if self.deferred_bytes + len(s.stack) <= MAX_DEFERRED_BYTES:
                self.deferred[record_id] = s
                self.deferred_bytes += len(s.stack)
                self.fresh.append(record_id)
            else:
                self.not_kept.add(record_id)

    def unwind_deferred(self, unwind) -> None:
        """The deferred records kept since last time, unwound now
        (bpf_unwind.unwind_fresh); their copies' bytes given back."""
        self.deferred_bytes -= unwind_fresh(self.deferred, self.fresh, unwind)

    def _walked_chain(self, h: int) -> bytes:
        """The stack walked in the kernel under hash `h`; for the id of a
        deferred record not kept, or not read when the run ended (Ctrl-C
        leaves the ring a second), a stack cut before its first frame
        saying why its walk went to user space."""
        if h in self.not_kept or (h & 0xFF in _DEFERRED_WHY and h not in self.spilled
                                  and self.unwind_maps.stacks.lookup(_U64.pack(h)) is None):
            return _U64.pack(KERNEL_UNWIND_STOP + (h & 0xFF))
        return self._chain(h)

    def blocked(self, reset: bool = False) -> list:
        """Every OFFCPU entry, as Blocked; `reset` (an interval of
        --every): each entry taken out of the map as it is read, so the
        next read holds what was counted since (the deferred records stay:
        bounded by MAX_DEFERRED_BYTES)."""
        chains: dict = {}

        def chain(h: int) -> bytes:
            if h not in chains:
                chains[h] = b"" if h in self.deferred else self._walked_chain(h)
            return chains[h]

        out = []
        for k, v in self.offcpu.items(take=reset):
            key = dict(zip(_KEY_FIELDS, OFF_KEY.unpack(k)))
            pid_tgid, kstack, h, wpid_tgid, wkstack, wh = (key[f] for f in (
                "pid_tgid", "kernel_stack", "hash", "waker_pid_tgid", "waker_kernel_stack",
                "waker_hash"))
            interrupt = not wpid_tgid and wh == INTERRUPT_HASH
            waker = bool(wpid_tgid or wh) and not interrupt
            out.append(Blocked(pid_tgid >> 32, pid_tgid & 0xFFFFFFFF, chain(h), kstack,
                               wpid_tgid >> 32, wpid_tgid & 0xFFFFFFFF,
                               chain(wh) if waker else b"", wkstack,
                               _U64.unpack(v)[0], interrupt, self.deferred.get(h),
                               self.deferred.get(wh) if waker else None))
        return out


class OffcpuCapture(UnwindCountCapture):
    """BpfCapture's events (the sched tracepoints, scoped like the run, so
    the mapping tracker gets its records) with an OffcpuCounter attached;
    `blocked()` reads the sums at the end, the deferred records' stacks
    given as their copies."""
    # whole-machine: every object's rows load before the start (a lazy
    # loader would defer the first blocks of every process, ~8 KiB each)
    defers_stacks = False
    defers_table_full = True    # through its ring (offcpu.bpf.c's defer_walk)
    # its deferred records get their Python frames read from the process
    # as they are decoded (unwind/python_live.wire), as count's do
    reads_python_frames = True

    def __init__(self, probes: list, target, opts, unwind_tables):
        super().__init__(probes, target, opts.buffer_pages,
                         stack_storage=opts.stack_storage, kernel=opts.kernel_stacks,
                         unwind_tables=unwind_tables, python=opts.python,
                         js=opts.js_named, unwind_memory=opts.unwind_memory,
                         stack_size=opts.stack_size, php=opts.php_named,
                         perl=opts.perl_merged, ruby=opts.ruby_named)
        self.filter = opts.offcpu or OffcpuFilter()
        # deferred records the full ring refused while the run read it: the
        # programs go on until the report is made, unread
        self.undeferred_while_read = None

    def _new_counter(self) -> OffcpuCounter:
        system = self.target.scope == "system"
        return OffcpuCounter(self.probes, self.owned, self.unwind_tables,
                             filter_=self.filter, stack_storage=self.stack_storage,
                             kernel=self.kernel, filter_tgid=self._tgid(), armed=self.armed,
                             exclude_tgid=os.getpid() if system else None,
                             python=self.python, js=self.js,
                             rows=self.rows_capacity or DEFAULT_ROWS,
                             buffer_pages=self.buffer_pages, stack_size=self.stack_size,
                             php=self.php, perl=self.perl, ruby=self.ruby)

    def _decode_ring(self, chunk, samples: list, offset: int, limit: int) -> int:
        """The ring's records of new code objects and deferred stacks,
        read (no samples: the deferred ones are kept for blocked())."""
        counter = self.counter
        python, frames = counter.python, self.python_frames
        deferred: list = []
        offset = ring_samples(chunk, deferred, offset, limit,
                              counter.stack_bytes if self.kernel else lambda _id: b"",
                              python_code=python.code_seen if python is not None else None,
                              weighted=True,
                              python_read=frames.read if frames is not None and python is not None
                              else None)
        counter.take_deferred(deferred)
        return offset

    def unwind_deferred(self, unwind) -> None:
        """OffcpuCounter.unwind_deferred, once the run has a counter."""
        if self.counter is not None:
            self.counter.unwind_deferred(unwind)

    def blocked(self, reset: bool = False) -> list:
        """(RawSample of the blocked thread, RawSample of its waker or None,
        nanoseconds) per OFFCPU entry; the cut stacks counted by reason. A
        wakeup from an interrupt has a waker of pid 0 and no user stack.
        `reset`: the entries taken out (OffcpuCounter.blocked)."""
        counter = self.counter
        out = []
        for b in counter.blocked(reset):
            kernel = counter.stack_bytes(b.kernel_stack) if self.kernel else b""
            sample = b.deferred or RawSample(0, b.pid, b.tid, 0, -1, b.chain, b"",
                                             kernel=kernel)
            waker = b.waker_deferred
            if waker is None and (b.waker_pid or b.waker_chain or b.woken_by_interrupt):
                waker = RawSample(1, b.waker_pid, b.waker_tid, 0, -1, b.waker_chain,
                                  b"", kernel=counter.stack_bytes(b.waker_kernel_stack)
                                  if self.kernel else b"")
            out.append((sample, waker, b.ns))
            self._note_cut(b.chain, 1)
        return out

    def counted(self, reset: bool = False) -> list:
        """(RawSample, nanoseconds) per blocked stack, wakers left out: what
        Session.counts() reads (its StackCounts' counts are then times)."""
        return [(sample, ns) for sample, _waker, ns in self.blocked(reset)]

    def stop(self) -> None:
        if self.counter is not None and self.undeferred_while_read is None:
            self.undeferred_while_read = self.owned.errors()["OFF_UNDEFERRED"]
        super().stop()

    def _losses(self, events: Losses, errors: dict, skipped: int) -> Losses:
        undeferred = self.undeferred_while_read
        return Losses(events.lost, events.throttled, uncounted(errors, (
            ("found the stack map full", "UW_STACKS_FULL"),
            ("found the thread map full", "OFF_START_FULL"),
            ("found the off-CPU map full", "OFF_COUNTS_FULL"),
            ("found the waker map full", "OFF_WAKERS_FULL"))), tuple(self.cut.items()),
            deferral_full=errors["OFF_UNDEFERRED"] if undeferred is None else undeferred,
            skipped=skipped)
