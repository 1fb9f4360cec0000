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
  lies within [min, max]. Then `prev`, if it is a thread of interest
  (the target's; system-wide: anyone but ustack, the idle task and kernel
  threads unless kernel stacks are asked for) and its state is one asked
  for: its user stack is unwound (UnwindProgram.walk: bpf_task_pt_regs
  gives the registers it will return to user space with), stored in
  STACKS, and START[tid] = (now, pid_tgid, stack hash, kernel stack id).
- sched:sched_waking (--wakers), on the classic tracepoint (its record's
  field offsets from the format file). It runs in the waker's context (unlike
  sched_wakeup, which may run on the wakee's CPU): for a wakee in START,
  the waker's stack is unwound and WAKERS[wakee tid] = (waker's
  pid_tgid, stack hash, kernel stack id), taken at the wakee's switch-in.
  A wakeup from an interrupt names whatever ran then (bcc does the same);
  from the idle task, no waker.
Nothing but the sums and the distinct stacks leaves the kernel."""
from __future__ import annotations

import errno
import os
import struct

from ..kernel import bpf
from ..kernel.bpf import (ADD, AND, JEQ, JGE, JGT, JLT, JNE, JSGE, JSLT, OR, RSH, SUB,
                          Asm, alu_imm, alu_reg, atomic_add, call, jmp_imm, jmp_reg,
                          ld_imm64, ld_map_fd, ldx, mov, mov_imm, st_imm, stx)
from ..kernel.trace_format import parse_format
from ..kernel.tracefs import event_format
from ..model import Losses, RawSample
from .bpf import BpfCapture, cut_reason, error_increment, unless_traced
from .bpf import PASS_ON
from .bpf_unwind import UnwindCounter
from ..values import value

MAP_DELETE = 3                      # helper bpf_map_delete_elem
# a task's kernel stack is THREAD_SIZE bytes (16 KiB on x86-64, 32 KiB with
# KASAN): a frame farther from task->stack is on an interrupt stack
THREAD_STACK_SPAN = 32 << 10
INTERRUPT_HASH = 1                  # WAKERS' hash of a wakeup from an interrupt
START_ENTRIES = 16384               # threads off the CPU at once (bcc: 10240)

# START's value: when, pid_tgid, stack hash, kernel stack id
START = struct.Struct("<QQQi4x")
# WAKERS' value: the waker's pid_tgid, stack hash, kernel stack id
WAKER = struct.Struct("<QQi4x")
# OFFCPU's key: the blocked thread's pid_tgid, kernel stack id, stack hash,
# then the waker's (all 0 without one); its value: nanoseconds, summed
OFF_KEY = struct.Struct("<Qi4xQQi4xQ")
_U64 = struct.Struct("<Q")

# slots of the error array: what could not be recorded
ERR_START_FULL, ERR_COUNTS_FULL, ERR_WAKERS_FULL = 0, 1, 2
ERR_SLOTS = 3

# sched_switch's prev_state (the kernel's TASK_REPORT bits); 0 is running
# (preempted, bit 0x100 then says so): ps/bcc's letters
STATES = {"R": 0, "S": 0x1, "D": 0x2, "T": 0x4, "t": 0x8, "X": 0x10, "Z": 0x20,
          "P": 0x40, "I": 0x80}
ALL_STATES = tuple(STATES)

# r10 offsets of the programs' own values (below the walk's -32..-1)
_TID = -72                          # u32: START's and WAKERS' key
_VALUE = -104                       # START or WAKERS value (32 bytes)
_OKEY = -160                        # OFFCPU's key (48 bytes)
_DELTA = -168                       # the time off the CPU
_FIELD = -176                       # a task's field read with probe_read_kernel

# sched_switch's raw arguments (u64 each): preempt, prev, next, prev's state
_PREEMPT, _PREV, _NEXT, _STATE = 0, 1, 2, 3
TASK_IDLE = 0x402                   # TASK_UNINTERRUPTIBLE | TASK_NOLOAD
TASK_REPORT = 0x7F                  # the state bits the tracepoint reports


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


class _Fields:
    """Offsets of a tracepoint record's fields (its format file)."""

    def __init__(self, group: str, name: str):
        self.fields = parse_format(event_format(group, name))

    def __getitem__(self, name: str) -> int:
        return self.fields[name].offset


class OffcpuCounter(UnwindCounter):
    """The unwinder's maps and programs, plus START, WAKERS and OFFCPU;
    probe 0 is sched_switch, probe 1 (with wakers) sched_waking."""

    def __init__(self, probes: list, tables, *, filter_: OffcpuFilter,
                 stack_storage: int, kernel: bool = False, filter_tgid=None,
                 exclude_tgid: int | None = None):
        self.filter = filter_
        self.exclude_tgid = exclude_tgid
        super().__init__(probes, tables, stack_storage=stack_storage, kernel=kernel,
                         filter_tgid=filter_tgid)
        try:
            self.start = self._map(bpf.MAP_HASH, 4, START.size, START_ENTRIES,
                                   "ustack_offstart")
            self.wakers = self._map(bpf.MAP_HASH, 4, WAKER.size, START_ENTRIES,
                                    "ustack_offwake")
            self.offcpu = self._map(bpf.MAP_HASH, OFF_KEY.size, 8,
                                    max(10240, 2 * stack_storage), "ustack_offcpu")
            self.off_errors = self._map(bpf.MAP_ARRAY, 4, 8, ERR_SLOTS, "ustack_offerr")
        except BaseException:
            self.close()
            raise

    def _program(self, index: int, probe) -> int:
        if index == 0:
            code, functions = self._switch_code(probe)
            return self.load(index, bpf.PROG_RAW_TRACEPOINT, code, functions, "ustack_off0")
        code, functions = self._waking_code(probe)
        return self.load(index, bpf.PROG_TRACEPOINT, code, functions, f"ustack_off{index}")

    def attach(self, capture) -> None:
        """sched_switch's program on the raw tracepoint; sched_waking's on an
        event of its own, as BpfCounter attaches trace events."""
        self.load_programs()
        for index, probe in enumerate(self.probes):
            fd = self.loaded[index]
            if index == 0:
                self.event_fds.append(bpf.attach_raw_tracepoint("sched_switch", fd))
            else:
                bpf.attach(self._anchor(capture, probe), fd)

    def _task_field(self, a: Asm, arg: int, offset: int, size: int) -> None:
        """r1 = the field at `offset` of the task in raw argument `arg`
        (r6 = the arguments), 0 if it cannot be read."""
        a.emit(st_imm(10, _FIELD, 0), mov(1, 10), alu_imm(ADD, 1, _FIELD),
               mov_imm(2, size), ldx(3, 6, 8 * arg), alu_imm(ADD, 3, offset),
               call(bpf.PROBE_READ_KERNEL), ldx(1, 10, _FIELD, size=size))

    # -- sched_switch ---------------------------------------------------------
    def _switch_code(self, probe) -> tuple:
        a = Asm()
        a.emit(mov(6, 1))
        self._switch_in(a)
        a.label("switch_out")
        self._task_field(a, _PREV, self.program.off.task_pid, 4)
        a.jump(jmp_imm, JEQ, 1, 0, to="out")              # the idle task
        self._state_filter(a)
        a.emit(call(bpf.GET_CURRENT_PID_TGID), mov(7, 0))
        self._thread_filter(a)
        a.emit(stx(10, -24, 7), st_imm(10, -16, 0, size=4), st_imm(10, -12, -1, size=4))
        self.program.walk(a, probe, self.kstacks)
        self.program.store_stack(a, then="stored")
        a.label("stored")
        # START[tid] = now, pid_tgid, hash, kernel stack id
        a.emit(call(bpf.KTIME_GET_NS), stx(10, _VALUE, 0), stx(10, _VALUE + 8, 7),
               ldx(1, 10, -8), stx(10, _VALUE + 16, 1), ldx(1, 10, -12, size=4),
               stx(10, _VALUE + 24, 1, size=4), stx(10, _TID, 7, size=4),
               ld_map_fd(1, self.start.fd), mov(2, 10), alu_imm(ADD, 2, _TID),
               mov(3, 10), alu_imm(ADD, 3, _VALUE), mov_imm(4, 0), call(bpf.MAP_UPDATE))
        a.jump(jmp_imm, JEQ, 0, 0, to="out")
        error_increment(a, self.off_errors, ERR_START_FULL)
        return self.program.finish(a, PASS_ON)

    def _switch_in(self, a: Asm) -> None:
        """`next`'s time off the CPU into OFFCPU, if it was seen leaving."""
        flt = self.filter
        self._task_field(a, _NEXT, self.program.off.task_pid, 4)
        a.jump(jmp_imm, JEQ, 1, 0, to="switch_out")
        a.emit(stx(10, _TID, 1, size=4), ld_map_fd(1, self.start.fd), mov(2, 10),
               alu_imm(ADD, 2, _TID), call(bpf.MAP_LOOKUP))
        a.jump(jmp_imm, JEQ, 0, 0, to="switch_out")
        a.emit(mov(9, 0), call(bpf.KTIME_GET_NS), ldx(1, 9, 0), alu_reg(SUB, 0, 1),
               stx(10, _DELTA, 0),
               ldx(1, 9, 8), stx(10, _OKEY, 1), ldx(1, 9, 24, size=4),
               stx(10, _OKEY + 8, 1, size=4), st_imm(10, _OKEY + 12, 0, size=4),
               ldx(1, 9, 16), stx(10, _OKEY + 16, 1),
               st_imm(10, _OKEY + 24, 0), st_imm(10, _OKEY + 32, -1, size=4),
               st_imm(10, _OKEY + 36, 0, size=4), st_imm(10, _OKEY + 40, 0))
        a.emit(ld_map_fd(1, self.start.fd), mov(2, 10), alu_imm(ADD, 2, _TID),
               call(MAP_DELETE))
        if flt.wakers:
            a.emit(ld_map_fd(1, self.wakers.fd), mov(2, 10), alu_imm(ADD, 2, _TID),
                   call(bpf.MAP_LOOKUP))
            a.jump(jmp_imm, JEQ, 0, 0, to="no_waker")
            a.emit(ldx(1, 0, 0), stx(10, _OKEY + 24, 1), ldx(1, 0, 16, size=4),
                   stx(10, _OKEY + 32, 1, size=4), ldx(1, 0, 8), stx(10, _OKEY + 40, 1),
                   ld_map_fd(1, self.wakers.fd), mov(2, 10), alu_imm(ADD, 2, _TID),
                   call(MAP_DELETE))
            a.label("no_waker")
        a.emit(ldx(1, 10, _DELTA), ld_imm64(2, flt.min_ns))
        a.jump(jmp_reg, JLT, 1, 2, to="switch_out")
        if flt.max_ns is not None:
            a.emit(ld_imm64(2, flt.max_ns))
            a.jump(jmp_reg, JGT, 1, 2, to="switch_out")
        # OFFCPU[key] += delta, creating the entry with delta when it is new
        a.emit(ld_map_fd(1, self.offcpu.fd), mov(2, 10), alu_imm(ADD, 2, _OKEY),
               call(bpf.MAP_LOOKUP))
        a.jump(jmp_imm, JNE, 0, 0, to="in_add")
        a.emit(ld_map_fd(1, self.offcpu.fd), mov(2, 10), alu_imm(ADD, 2, _OKEY),
               mov(3, 10), alu_imm(ADD, 3, _DELTA), mov_imm(4, bpf.NOEXIST),
               call(bpf.MAP_UPDATE))
        a.jump(jmp_imm, JEQ, 0, 0, to="switch_out")
        a.jump(jmp_imm, JNE, 0, -errno.EEXIST, to="in_full")
        a.emit(ld_map_fd(1, self.offcpu.fd), mov(2, 10), alu_imm(ADD, 2, _OKEY),
               call(bpf.MAP_LOOKUP))
        a.jump(jmp_imm, JNE, 0, 0, to="in_add")
        a.label("in_full")
        # counted, then on to prev (not the program's end)
        a.emit(st_imm(10, -48, ERR_COUNTS_FULL, size=4), ld_map_fd(1, self.off_errors.fd),
               mov(2, 10), alu_imm(ADD, 2, -48), call(bpf.MAP_LOOKUP))
        a.jump(jmp_imm, JEQ, 0, 0, to="switch_out")
        a.emit(mov_imm(1, 1), atomic_add(0, 0, 1))
        a.jump(bpf.ja, to="switch_out")
        a.label("in_add")
        a.emit(ldx(1, 10, _DELTA), atomic_add(0, 0, 1))

    def _state_filter(self, a: Asm) -> None:
        """Leave unless prev's state is one asked for, as the classic
        tracepoint reports it: running when preempted or TASK_RUNNING, I for
        TASK_IDLE, else its state and exit state's low bits (TASK_REPORT)."""
        running, bits = state_mask(self.filter.states)
        if running and bits == sum(STATES.values()):
            return
        a.emit(ldx(1, 6, 8 * _PREEMPT))
        a.jump(jmp_imm, JNE, 1, 0, to="st_running")
        a.emit(ldx(7, 6, 8 * _STATE))                    # an unsigned int, widened
        a.jump(jmp_imm, JEQ, 7, 0, to="st_running")
        a.jump(jmp_imm, JNE, 7, TASK_IDLE, to="st_other")
        a.emit(mov_imm(2, STATES["I"]))
        a.jump(bpf.ja, to="st_check")
        a.label("st_other")
        self._task_field(a, _PREV, self.program.off.task_exit_state, 4)
        a.emit(mov(2, 7), alu_reg(OR, 2, 1), alu_imm(AND, 2, TASK_REPORT))
        a.label("st_check")
        a.emit(alu_imm(AND, 2, bits))
        a.jump(jmp_imm, JEQ, 2, 0, to="out")
        a.jump(bpf.ja, to="st_ok")
        a.label("st_running")
        a.jump(bpf.ja, to="st_ok" if running else "out")
        a.label("st_ok")

    def _thread_filter(self, a: Asm) -> None:
        """Leave unless current (r7 = its pid_tgid) is a thread of interest:
        the target's or its children's (once it exec'd, for -c), else not
        ustack's; a kernel thread only when kernel stacks are asked for."""
        if self.tgids is not None:
            unless_traced(a, self.tgids, 7, -32)
        a.emit(mov(1, 7), alu_imm(RSH, 1, 32))
        if self.exclude_tgid is not None:
            a.jump(jmp_imm, JEQ, 1, self.exclude_tgid, to="out")
        if self.armed is not None:
            a.emit(st_imm(10, -32, 0, size=4), ld_map_fd(1, self.armed.fd), mov(2, 10),
                   alu_imm(ADD, 2, -32), call(bpf.MAP_LOOKUP))
            a.jump(jmp_imm, JEQ, 0, 0, to="out")
            a.emit(ldx(1, 0, 0))
            a.jump(jmp_imm, JEQ, 1, 0, to="out")
        if not self.kernel:
            a.emit(call(bpf.GET_CURRENT_TASK_BTF), ldx(1, 0, self.program.off.task_mm))
            a.jump(jmp_imm, JEQ, 1, 0, to="out")

    # -- sched_waking -----------------------------------------------------------
    def _waking_code(self, probe) -> tuple:
        f = _Fields("sched", "sched_waking")
        a = Asm()
        a.emit(mov(6, 1), ldx(1, 6, f["pid"], size=4), stx(10, _TID, 1, size=4),
               ld_map_fd(1, self.start.fd), mov(2, 10), alu_imm(ADD, 2, _TID),
               call(bpf.MAP_LOOKUP))
        a.jump(jmp_imm, JEQ, 0, 0, to="out")             # not a thread we follow
        a.emit(st_imm(10, -12, -1, size=4))
        self._in_interrupt(a, to="irq")
        a.emit(call(bpf.GET_CURRENT_PID_TGID), mov(7, 0), mov(1, 0), alu_imm(RSH, 1, 32))
        a.jump(jmp_imm, JEQ, 1, 0, to="irq")             # the idle task
        a.emit(stx(10, -24, 7), st_imm(10, -16, 1, size=4))
        self.program.walk(a, probe, self.kstacks)
        self.program.store_stack(a, then="stored")
        a.label("stored")
        a.emit(stx(10, _VALUE, 7), ldx(1, 10, -8), stx(10, _VALUE + 8, 1),
               ldx(1, 10, -12, size=4), stx(10, _VALUE + 16, 1, size=4),
               st_imm(10, _VALUE + 20, 0, size=4),
               ld_map_fd(1, self.wakers.fd), mov(2, 10), alu_imm(ADD, 2, _TID),
               mov(3, 10), alu_imm(ADD, 3, _VALUE), mov_imm(4, 0), call(bpf.MAP_UPDATE))
        a.jump(jmp_imm, JEQ, 0, 0, to="out")
        error_increment(a, self.off_errors, ERR_WAKERS_FULL)
        # an interrupt's wakeup (a timer, a device): no thread woke it; the
        # kernel stack says what did
        a.label("irq")
        if self.kstacks is not None:
            a.emit(mov(1, 6), ld_map_fd(2, self.kstacks.fd), mov_imm(3, 0),
                   call(bpf.GET_STACKID))
            a.jump(jmp_imm, JSGE, 0, 0, to="irq_kstack")
            a.emit(mov_imm(0, -1))
            a.label("irq_kstack")
            a.emit(stx(10, -12, 0, size=4))
        a.emit(st_imm(10, _VALUE, 0), st_imm(10, _VALUE + 8, INTERRUPT_HASH),
               ldx(1, 10, -12, size=4), stx(10, _VALUE + 16, 1, size=4),
               st_imm(10, _VALUE + 20, 0, size=4),
               ld_map_fd(1, self.wakers.fd), mov(2, 10), alu_imm(ADD, 2, _TID),
               mov(3, 10), alu_imm(ADD, 3, _VALUE), mov_imm(4, 0), call(bpf.MAP_UPDATE))
        return self.program.finish(a, PASS_ON)

    def _in_interrupt(self, a: Asm, to: str) -> None:
        """Jump to `to` when the wakeup comes from an interrupt, not from
        what current does: x86-64 runs an interrupt of kernel code on a
        per-CPU stack, so the tracepoint's stack pointer lies outside
        current's own kernel stack (it is the one perf saved in the
        pt_regs the record's first word points to; r10 would not do: the
        JIT may give the program a private per-CPU stack); an interrupt
        of user code runs on current's stack, but current then entered
        the kernel by that interrupt, whose saved user registers say so
        (orig_ax -1, where a system call keeps its number)."""
        a.emit(call(bpf.GET_CURRENT_TASK_BTF), mov(1, 0), call(bpf.TASK_PT_REGS),
               ldx(1, 0, bpf.PT_REGS["orig_ax"]))
        a.jump(jmp_imm, JSLT, 1, 0, to=to)
        a.emit(mov(1, 10), alu_imm(ADD, 1, -40), mov_imm(2, 8), mov(3, 6),
               call(bpf.PROBE_READ_KERNEL))
        a.jump(jmp_imm, JNE, 0, 0, to="out")
        a.emit(ldx(3, 10, -40), alu_imm(ADD, 3, bpf.PT_REGS["sp"]), mov(1, 10),
               alu_imm(ADD, 1, -48), mov_imm(2, 8), call(bpf.PROBE_READ_KERNEL))
        a.jump(jmp_imm, JNE, 0, 0, to="out")
        a.emit(call(bpf.GET_CURRENT_TASK_BTF), ldx(2, 0, self.program.off.task_stack),
               ldx(1, 10, -48), alu_reg(SUB, 1, 2))
        a.jump(jmp_imm, JGE, 1, THREAD_STACK_SPAN, to=to)

    # -- reading ------------------------------------------------------------------
    def blocked(self) -> list:
        """Every OFFCPU entry, as Blocked."""
        chains: dict = {}

        def chain(h: int) -> bytes:
            if h not in chains:
                chains[h] = self._chain(h)
            return chains[h]

        out = []
        for k, v in self.offcpu.items():
            pid_tgid, kstack, h, wpid_tgid, wkstack, wh = OFF_KEY.unpack(k)
            interrupt = not wpid_tgid and wh == INTERRUPT_HASH
            waker = bool(wpid_tgid or wh) and not interrupt
            out.append(Blocked(pid_tgid >> 32, pid_tgid & 0xFFFFFFFF, chain(h), kstack,
                               wpid_tgid >> 32, wpid_tgid & 0xFFFFFFFF,
                               chain(wh) if waker else b"", wkstack,
                               _U64.unpack(v)[0], interrupt))
        return out

    def off_errors_seen(self) -> list:
        return [_U64.unpack(self.off_errors.lookup(i.to_bytes(4, "little")))[0]
                for i in range(ERR_SLOTS)]


class OffcpuCapture(BpfCapture):
    """BpfCapture's events (the sched tracepoints, scoped like the run, so
    the mapping tracker gets its records) with an OffcpuCounter attached;
    `blocked()` reads the sums at the end."""

    def __init__(self, probes: list, target, opts, unwind_tables):
        super().__init__(probes, target, opts.buffer_pages,
                         stack_storage=opts.stack_storage, kernel=opts.kernel_stacks,
                         unwind_tables=unwind_tables)
        self.filter = opts.offcpu or OffcpuFilter()

    def _new_counter(self) -> OffcpuCounter:
        system = self.target.scope == "system"
        return OffcpuCounter(self.probes, self.unwind_tables, filter_=self.filter,
                             stack_storage=self.stack_storage, kernel=self.kernel,
                             filter_tgid=None if system else self.target.pid,
                             exclude_tgid=os.getpid() if system else None)

    def blocked(self) -> list:
        """(RawSample of the blocked thread, RawSample of its waker or None,
        nanoseconds) per OFFCPU entry; the cut stacks counted by reason. A
        wakeup from an interrupt has a waker of pid 0 and no user stack."""
        counter = self.counter
        out = []
        for b in counter.blocked():
            kernel = counter.stack_bytes(b.kernel_stack) if self.kernel else b""
            sample = RawSample(0, b.pid, b.tid, 0, -1, b.chain, b"", kernel=kernel)
            waker = None
            if b.waker_pid or b.waker_chain or b.woken_by_interrupt:
                waker = RawSample(1, b.waker_pid, b.waker_tid, 0, -1, b.waker_chain,
                                  b"", kernel=counter.stack_bytes(b.waker_kernel_stack)
                                  if self.kernel else b"")
            out.append((sample, waker, b.ns))
            self._note_cut(b.chain, 1)
        return out

    def counted(self, reset: bool = False) -> list:
        """(RawSample, nanoseconds) per blocked stack, wakers left out: what
        Session.counts() reads (its StackCounts' counts are then times)."""
        return [(sample, ns) for sample, _waker, ns in self.blocked()]

    def _note_cut(self, chain: bytes, n: int) -> None:
        why = cut_reason(chain)
        if why is not None:
            self.cut[why] = self.cut.get(why, 0) + n

    def losses(self) -> Losses:
        events = self.events.losses()
        if self.counter is None:
            return events
        start_full, counts_full, wakers_full = self.counter.off_errors_seen()
        stacks_full = self.counter.errors_seen()[0]
        uncounted = tuple((why, n) for why, n in (
            ("found the stack map full", stacks_full),
            ("found the thread map full", start_full),
            ("found the off-CPU map full", counts_full),
            ("found the waker map full", wakers_full)) if n)
        return Losses(events.lost, events.throttled, uncounted, tuple(self.cut.items()),
                      skipped=self.counter.skipped())
