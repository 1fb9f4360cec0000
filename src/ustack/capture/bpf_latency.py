"""Entry-to-return latency, measured and counted in the kernel (`ustack
latency`): one BPF program at each function entry (or sys_enter), one at
each of its returns (a uretprobe, a uprobe on a RET, or sys_exit). Nothing
leaves the kernel per call but, with --slower, the record of a slow call.

Maps:
- ENTRIES (LRU hash) [(who, function)] = depth, then (entry time, stack
  hash) per level: a stack of entry times, so recursion pairs each return
  with its own entry. `who` is the thread (pid_tgid), or for Go code the
  goroutine: on amd64 since Go 1.17 (register ABI) r14 holds the current
  g in Go code, at the entry and at every RET; a goroutine whose stack
  moves or that changes threads between its entry and its return keeps
  its g. At most MAX_DEPTH levels are kept; deeper calls are counted as
  such (errors[TOO_DEEP]) and their returns only pop the depth.
- HISTS (per-CPU hash) [(function, tgid, stack hash)] = count, sum, min,
  max and BUCKETS log2 buckets of the duration in the run's unit; tgid and
  hash are 0 unless split by stack (--by-stack).
- TAILS (array) [function]: calls that left through a tail-call jump,
  whose duration a RET probe cannot see (popped, not timed).
- a BPF ring buffer (--slower): (end time, pid_tgid, function, cpu,
  duration, stack hash) per call at least that slow.
The entry's stack (--by-stack, --slower) is walked by the in-kernel DWARF
unwinder (capture/bpf_unwind.py) and stored once per distinct stack in its
STACKS map; the entry keeps only the stack's hash. Where that program is
refused (or with --unwind fp) the kernel walks frame pointers instead
(bpf_get_stackid), and FP_STACKS[hash] = (stack id, the return address at
[sp], which that walk skips at a function's entry)."""
from __future__ import annotations

import struct

from ..kernel import bpf
from ..kernel.bpf import (ADD, AND, DIV, JEQ, JGE, JLT, JNE, LSH, MUL, RSH, SUB, XOR,
                          Asm, alu_imm, alu_reg, atomic_add, call, exit_, jmp_imm,
                          jmp_reg, ld_imm64, ld_map_fd, ldx, mov, mov_imm, st_imm,
                          stx)
from ..model import Losses, MmapEvent, RawSample, TracepointProbe
from .bpf import (PASS_ON, BpfCapture, BpfCounter, prog_type_of, program_result,
                  unless_traced, with_ring_records)
from ..values import value

MAX_DEPTH = 16                       # a power of two: the level is masked
ENTRY_KEY = struct.Struct("<QI4x")   # who, function
ENTRY_VALUE = 8 + 16 * MAX_DEPTH
BUCKETS = 64
HIST_KEY = struct.Struct("<IIQ")     # function, tgid, stack hash
HIST_HEAD = struct.Struct("<QQQQ")   # count, sum, min, max (ns)
HIST_VALUE = HIST_HEAD.size + 8 * BUCKETS
SLOW = struct.Struct("<QQIIQQ")      # end time, pid_tgid, function, cpu, duration, hash
FP_STACK = struct.Struct("<iIQ")     # stack id, 0, the return address at [sp]
_FNV_PRIME = 0x100000001B3
ERR_TOO_DEEP, ERR_HISTS_FULL, ERR_ENTRIES_FULL, ERR_RING_FULL = range(4)
ERR_SLOTS = 4

# r10 offsets of the programs' locals (the unwinder's main frame uses -64..-1)
_TIME = -72                          # entry time (entry), end time (return)
_EKEY = -88                          # ENTRIES key
_DELTA = -96
_HKEY = -112                         # HISTS key
_U32 = -116                          # an array map's u32 key
_SLOW = -160                         # a SLOW record
_FP = -176                           # an FP_STACK


@value
class Site:
    """What one probe of a latency run is to the program on it."""
    function: int                    # index of the function (its histogram)
    role: str                        # entry | return | tail (a tail call's jmp)
    goroutine: bool = False          # key on the goroutine (r14), not the thread


class LatencyMaps(bpf.MapSet):
    def __init__(self, functions: int, entries: int, hists: int, ring_bytes: int = 0):
        super().__init__()
        self.ring = None
        try:
            self.entries = self._map(bpf.MAP_LRU_HASH, ENTRY_KEY.size, ENTRY_VALUE,
                                     entries, "ustack_latent")
            self.hists = self._map(bpf.MAP_PERCPU_HASH, HIST_KEY.size, HIST_VALUE,
                                   hists, "ustack_lathist")
            self.tails = self._map(bpf.MAP_ARRAY, 4, 8, max(functions, 1),
                                   "ustack_lattail")
            self.errors = self._map(bpf.MAP_ARRAY, 4, 8, ERR_SLOTS, "ustack_laterr")
            # zeros to create ENTRIES' and HISTS' values from
            self.zero = self._map(bpf.MAP_ARRAY, 4, max(HIST_VALUE, ENTRY_VALUE), 1,
                                  "ustack_latzero")
            if ring_bytes:
                self.ring = bpf.RingBuf(ring_bytes, "ustack_latring")
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self.ring is not None:
            self.ring.close()
            self.ring = None
        super().close()


# --- the programs ----------------------------------------------------------------

def _head(a: Asm, tgids, armed) -> None:
    """r6 = ctx, r7 = pid_tgid; leave unless it is a traced process (in
    the set `tgids`: the target and its children) and the held command has
    exec'd (armed)."""
    a.emit(mov(6, 1), call(bpf.GET_CURRENT_PID_TGID), mov(7, 0))
    if tgids is not None:
        unless_traced(a, tgids, 7, _U32)
    if armed is not None:
        a.emit(st_imm(10, _U32, 0, size=4), ld_map_fd(1, armed.fd), mov(2, 10),
               alu_imm(ADD, 2, _U32), call(bpf.MAP_LOOKUP))
        a.jump(jmp_imm, JEQ, 0, 0, to="out")
        a.emit(ldx(1, 0, 0))
        a.jump(jmp_imm, JEQ, 1, 0, to="out")


def _now(a: Asm) -> None:
    a.emit(call(bpf.KTIME_GET_NS), stx(10, _TIME, 0))


def _error(a: Asm, maps: LatencyMaps, slot: int, then: str = "out") -> None:
    a.emit(st_imm(10, _U32, slot, size=4), ld_map_fd(1, maps.errors.fd), mov(2, 10),
           alu_imm(ADD, 2, _U32), call(bpf.MAP_LOOKUP))
    a.jump(jmp_imm, JEQ, 0, 0, to=then)
    a.emit(mov_imm(1, 1), atomic_add(0, 0, 1))
    a.jump(bpf.ja, to=then)


def _lookup(a: Asm, m: bpf.Map, key_at: int) -> None:
    a.emit(ld_map_fd(1, m.fd), mov(2, 10), alu_imm(ADD, 2, key_at),
           call(bpf.MAP_LOOKUP))


def _lookup_or_create(a: Asm, maps: LatencyMaps, m: bpf.Map, key_at: int,
                      tag: str, err: int) -> None:
    """r9 = m[key] (created from zeros when absent), or count `err` and leave."""
    _lookup(a, m, key_at)
    a.jump(jmp_imm, JNE, 0, 0, to=f"{tag}_have")
    a.emit(st_imm(10, _U32, 0, size=4))
    _lookup(a, maps.zero, _U32)
    a.jump(jmp_imm, JEQ, 0, 0, to="out")
    a.emit(mov(3, 0), ld_map_fd(1, m.fd), mov(2, 10), alu_imm(ADD, 2, key_at),
           mov_imm(4, bpf.NOEXIST), call(bpf.MAP_UPDATE))
    _lookup(a, m, key_at)
    a.jump(jmp_imm, JNE, 0, 0, to=f"{tag}_have")
    _error(a, maps, err)
    a.label(f"{tag}_have")
    a.emit(mov(9, 0))


def _entry_key(a: Asm, site: Site) -> None:
    """ENTRIES' key at _EKEY: (the goroutine or the thread, function)."""
    if site.goroutine:
        a.emit(ldx(1, 6, bpf.PT_REGS["r14"]))
    else:
        a.emit(mov(1, 7))
    a.emit(stx(10, _EKEY, 1), st_imm(10, _EKEY + 8, site.function, size=4),
           st_imm(10, _EKEY + 12, 0, size=4))


def entry_body(a: Asm, site: Site, maps: LatencyMaps, with_stack: bool) -> None:
    """Push (the time at _TIME, the stack hash at r10-8 or 0) on the
    caller's ENTRIES stack."""
    _entry_key(a, site)
    _lookup_or_create(a, maps, maps.entries, _EKEY, "e", ERR_ENTRIES_FULL)
    a.emit(ldx(1, 9, 0), mov(2, 1), alu_imm(ADD, 2, 1), stx(9, 0, 2))
    a.jump(jmp_imm, JLT, 1, MAX_DEPTH, to="e_level")
    _error(a, maps, ERR_TOO_DEEP)
    a.label("e_level")
    a.emit(alu_imm(AND, 1, MAX_DEPTH - 1), alu_imm(LSH, 1, 4), alu_reg(ADD, 1, 9),
           ldx(2, 10, _TIME), stx(1, 8, 2))
    if with_stack:
        a.emit(ldx(2, 10, -8))
    else:
        a.emit(mov_imm(2, 0))
    a.emit(stx(1, 16, 2))


def entry_program(site: Site, maps: LatencyMaps, tgids=None, armed=None,
                  result: int = PASS_ON) -> bytes:
    """An entry without its stack; `result`: what the program returns
    (capture/bpf.py, program_result)."""
    a = Asm()
    _head(a, tgids, armed)
    _now(a)
    entry_body(a, site, maps, with_stack=False)
    a.label("out")
    a.emit(mov_imm(0, result), exit_())
    return a.assemble()


def fp_entry_program(site: Site, maps: LatencyMaps, stacks: bpf.Map, fp_stacks: bpf.Map,
                     tgids=None, armed=None, result: int = PASS_ON) -> bytes:
    """An entry with its frame-pointer stack: the kernel's walk and the
    word at [sp] (the caller, which that walk skips at a function's entry)
    stored in FP_STACKS under their hash."""
    a = Asm()
    _head(a, tgids, armed)
    _now(a)
    a.emit(mov(1, 6), ld_map_fd(2, stacks.fd), mov_imm(3, bpf.F_USER_STACK),
           call(bpf.GET_STACKID), stx(10, _FP, 0, size=4),
           st_imm(10, _FP + 4, 0, size=4), st_imm(10, _FP + 8, 0),
           mov(1, 10), alu_imm(ADD, 1, _FP + 8), mov_imm(2, 8),
           ldx(3, 6, bpf.PT_REGS["sp"]), call(bpf.PROBE_READ_USER),
           ldx(1, 10, _FP), ld_imm64(3, _FNV_PRIME), alu_reg(MUL, 1, 3),
           ldx(2, 10, _FP + 8), alu_reg(XOR, 1, 2), alu_reg(MUL, 1, 3),
           stx(10, -8, 1),
           ld_map_fd(1, fp_stacks.fd), mov(2, 10), alu_imm(ADD, 2, -8), mov(3, 10),
           alu_imm(ADD, 3, _FP), mov_imm(4, 0), call(bpf.MAP_UPDATE))
    entry_body(a, site, maps, with_stack=True)
    a.label("out")
    a.emit(mov_imm(0, result), exit_())
    return a.assemble()


def _log2_bucket(a: Asm, unit_ns: int) -> None:
    """r3 = the bucket of the duration in r1: 0 for < 1 unit, else
    1 + floor(log2(duration in units)). Clobbers r1, r4."""
    if unit_ns > 1:
        a.emit(alu_imm(DIV, 1, unit_ns))
    a.emit(mov_imm(3, 0))
    a.jump(jmp_imm, JEQ, 1, 0, to="b_done")
    a.emit(mov_imm(3, 1))
    for shift in (32, 16, 8, 4, 2, 1):
        a.emit(mov(4, 1), alu_imm(RSH, 4, shift))
        a.jump(jmp_imm, JEQ, 4, 0, to=f"b_{shift}")
        a.emit(mov(1, 4), alu_imm(ADD, 3, shift))
        a.label(f"b_{shift}")
    a.label("b_done")


def return_program(site: Site, maps: LatencyMaps, *, unit_ns: int, by_stack: bool,
                   slower_ns: int | None, tgids=None, armed=None,
                   result: int = PASS_ON) -> bytes:
    """Pop the call's entry; a return adds its duration to its histogram
    (and reports it to the ring when slower than slower_ns), a tail call's
    jump counts in TAILS."""
    a = Asm()
    _head(a, tgids, armed)
    _now(a)
    _entry_key(a, site)
    _lookup(a, maps.entries, _EKEY)
    a.jump(jmp_imm, JEQ, 0, 0, to="out")      # no entry seen: began before the run
    a.emit(mov(9, 0), ldx(1, 9, 0))
    a.jump(jmp_imm, JEQ, 1, 0, to="out")
    a.emit(alu_imm(SUB, 1, 1), stx(9, 0, 1))
    a.jump(jmp_imm, JGE, 1, MAX_DEPTH, to="out")   # too deep: not timed
    a.emit(mov(8, 1), alu_imm(AND, 1, MAX_DEPTH - 1), alu_imm(LSH, 1, 4),
           alu_reg(ADD, 1, 9), ldx(2, 1, 8), ldx(3, 1, 16),
           ldx(4, 10, _TIME), alu_reg(SUB, 4, 2), stx(10, _DELTA, 4))
    # the histogram's key
    a.emit(st_imm(10, _HKEY, site.function, size=4))
    if by_stack:
        a.emit(mov(1, 7), alu_imm(RSH, 1, 32), stx(10, _HKEY + 4, 1, size=4),
               stx(10, _HKEY + 8, 3))
    else:
        a.emit(st_imm(10, _HKEY + 4, 0, size=4), st_imm(10, _HKEY + 8, 0))
    if slower_ns is not None:
        a.emit(stx(10, _SLOW + 32, 3))           # the hash, before r3 is reused
    # the outermost level returned: free the slot
    a.jump(jmp_imm, JNE, 8, 0, to="r_kept")
    a.emit(ld_map_fd(1, maps.entries.fd), mov(2, 10), alu_imm(ADD, 2, _EKEY),
           call(bpf.DELETE_ELEM))
    a.label("r_kept")
    if site.role == "tail":
        a.emit(st_imm(10, _U32, site.function, size=4))
        _lookup(a, maps.tails, _U32)
        a.jump(jmp_imm, JEQ, 0, 0, to="out")
        a.emit(mov_imm(1, 1), atomic_add(0, 0, 1))
        a.jump(bpf.ja, to="out")
    else:
        _lookup_or_create(a, maps, maps.hists, _HKEY, "h", ERR_HISTS_FULL)
        a.emit(ldx(1, 10, _DELTA), ldx(2, 9, 0), alu_imm(ADD, 2, 1), stx(9, 0, 2),
               ldx(2, 9, 8), alu_reg(ADD, 2, 1), stx(9, 8, 2), ldx(2, 9, 16))
        a.jump(jmp_imm, JEQ, 2, 0, to="h_min")
        a.jump(jmp_reg, JGE, 1, 2, to="h_max")
        a.label("h_min")
        a.emit(stx(9, 16, 1))
        a.label("h_max")
        a.emit(ldx(2, 9, 24))
        a.jump(jmp_reg, JGE, 2, 1, to="h_bucket")
        a.emit(stx(9, 24, 1))
        a.label("h_bucket")
        _log2_bucket(a, unit_ns)
        a.emit(alu_imm(AND, 3, BUCKETS - 1), alu_imm(LSH, 3, 3), alu_reg(ADD, 3, 9),
               ldx(1, 3, HIST_HEAD.size), alu_imm(ADD, 1, 1),
               stx(3, HIST_HEAD.size, 1))
        if slower_ns is not None:
            a.emit(ldx(1, 10, _DELTA), ld_imm64(2, slower_ns))
            a.jump(jmp_reg, JLT, 1, 2, to="out")
            a.emit(ldx(1, 10, _TIME), stx(10, _SLOW, 1), stx(10, _SLOW + 8, 7),
                   st_imm(10, _SLOW + 16, site.function, size=4),
                   call(bpf.GET_SMP_PROCESSOR_ID), stx(10, _SLOW + 20, 0, size=4),
                   ldx(1, 10, _DELTA), stx(10, _SLOW + 24, 1),
                   ld_map_fd(1, maps.ring.fd), mov(2, 10), alu_imm(ADD, 2, _SLOW),
                   mov_imm(3, SLOW.size), mov_imm(4, 0), call(bpf.RINGBUF_OUTPUT))
            a.jump(jmp_imm, JEQ, 0, 0, to="out")
            _error(a, maps, ERR_RING_FULL)
    a.label("out")
    a.emit(mov_imm(0, result), exit_())
    return a.assemble()


# --- the counter and the capture ---------------------------------------------------

ENTRY_SLOTS = 16384                  # (thread or goroutine, function) pairs in flight
HIST_SLOTS = 10240                   # histograms: functions x stacks


@value(frozen=False)
class Histogram:
    """One histogram the kernel kept: durations in ns, buckets in the run's unit."""
    function: int
    pid: int                         # 0 unless split by stack
    chain: bytes                     # the entry's callchain (by stack), else b""
    return_address: bytes            # frame pointers: the word at [sp] at the entry
    count: int
    total_ns: int
    min_ns: int
    max_ns: int
    buckets: list


class LatencyCounter(BpfCounter):
    """The maps and programs of a latency run, attached to a PerfCapture's
    events like BpfCounter's (one program per trace event, never on the
    capture's inherited events). `sites[i]` says what probe i is;
    `tables`: the in-kernel unwinder's rows of an object, when the entry's
    stack is wanted with DWARF; `fp_stacks`: wanted with frame pointers."""

    def __init__(self, probes: list, sites: list, *, unit_ns: int, by_stack: bool,
                 slower_ns: int | None, tables=None, fp_stacks: bool = False,
                 filter_tgid=None, stack_storage: int = 1024, ring_bytes: int = 0):
        self._no_maps_yet(probes)
        self.sites = sites
        self.unit_ns, self.by_stack, self.slower_ns = unit_ns, by_stack, slower_ns
        self.objects = self.program = self.unwind_maps = None
        self.stacks = self.fp_stacks = None
        functions = 1 + max(s.function for s in sites)
        self.lat = None
        try:
            self.lat = LatencyMaps(functions, ENTRY_SLOTS, HIST_SLOTS,
                                   ring_bytes if slower_ns is not None else 0)
            self.ring = self.lat.ring
            if tables is not None:
                from .bpf_unwind import (DEFAULT_ROWS, UnwindMaps,
                                         UnwindObjects, UnwindProgram)
                from .kernel_offsets import Offsets
                self.unwind_maps = UnwindMaps(DEFAULT_ROWS, stack_storage, 16)
                self.maps.append(self.unwind_maps)  # closed with the others
                self.objects = UnwindObjects(self.unwind_maps, tables)   # rows: open()
                self.program = UnwindProgram(self.unwind_maps, Offsets.of_this_kernel())
            elif fp_stacks:
                from ..kernel import perf_event as pe
                self.max_depth = max(1, min(pe.max_stack(), 127))
                self.stacks = self._map(bpf.MAP_STACK_TRACE, 4, 8 * self.max_depth,
                                        stack_storage, "ustack_latstk")
                self.fp_stacks = self._map(bpf.MAP_HASH, 8, FP_STACK.size,
                                           stack_storage, "ustack_latfp")
            self.follow_if_traced(filter_tgid)
        except BaseException:
            self.close()
            raise

    def _load(self, index: int) -> int:
        probe, site = self.probes[index], self.sites[index]
        tgids = self.tgids if isinstance(probe, TracepointProbe) else None
        result = program_result(probe)
        functions = ()
        if site.role == "entry" and self.program is not None:
            code, functions = self.program.code(
                index, probe, tgids=tgids, armed=self.armed, prelude=_now, result=result,
                then=lambda a: entry_body(a, site, self.lat, with_stack=True))
        elif site.role == "entry" and self.fp_stacks is not None:
            code = fp_entry_program(site, self.lat, self.stacks, self.fp_stacks, tgids,
                                    self.armed, result)
        elif site.role == "entry":
            code = entry_program(site, self.lat, tgids, self.armed, result)
        else:
            code = return_program(site, self.lat, unit_ns=self.unit_ns,
                                  by_stack=self.by_stack, slower_ns=self.slower_ns,
                                  tgids=tgids, armed=self.armed, result=result)
        fd = bpf.load_program(prog_type_of(probe), code, f"ustack_lat{index}",
                              functions=functions)
        self.prog_fds.append(fd)
        return fd

    def load_programs(self) -> None:
        """A program per entry; one per (function, role) for the returns."""
        shared: dict = {}
        for index, site in enumerate(self.sites):
            if index in self.loaded:
                continue
            key = (site.function, site.role, type(self.probes[index]))
            if site.role == "entry":
                self.loaded[index] = self._load(index)
            else:
                if key not in shared:
                    shared[key] = self._load(index)
                self.loaded[index] = shared[key]

    def attach(self, capture) -> None:
        """Returns first, entries last: an entry timed before its return's
        program runs would pair with a later call's return."""
        self.load_programs()
        order = {"return": 0, "tail": 0, "entry": 1}
        indexes = sorted({self.probes.index(p) for p, _fd in capture.opened},
                         key=lambda i: order[self.sites[i].role])
        for index in indexes:
            bpf.attach(self._anchor(capture, self.probes[index]), self.loaded[index])

    def histograms(self) -> list:
        out = []
        for k in self.lat.hists.keys():
            values = self.lat.hists.lookup_percpu(k)
            if values is None:
                continue
            function, tgid, h = HIST_KEY.unpack(k)
            count = total = high = 0
            low = None
            buckets = [0] * BUCKETS
            for v in values:
                n, s, mn, mx = HIST_HEAD.unpack_from(v)
                if not n:
                    continue
                count, total, high = count + n, total + s, max(high, mx)
                low = mn if low is None else min(low, mn)
                for i, b in enumerate(struct.unpack_from(f"<{BUCKETS}Q", v,
                                                         HIST_HEAD.size)):
                    buckets[i] += b
            if not count:
                continue
            chain, ret = self.stack_of(h) if self.by_stack else (b"", b"")
            out.append(Histogram(function, tgid, chain, ret, count, total, low or 0,
                                 high, buckets))
        return out

    def stack_of(self, h: int) -> tuple:
        """(callchain, return address) of the entry stack with hash `h`."""
        if self.unwind_maps is not None:
            from .bpf_unwind import stack_chain
            return stack_chain(self.unwind_maps, h), b""
        if self.fp_stacks is not None:
            raw = self.fp_stacks.lookup(h.to_bytes(8, "little"))
            if raw is not None:
                stack_id, _zero, ret = FP_STACK.unpack(raw)
                return self.stack_bytes(stack_id), ret.to_bytes(8, "little")
        return b"", b""

    def tail_exits(self) -> list:
        """Calls per function that left through a tail call (not timed)."""
        n = self.lat.tails.max_entries
        return [struct.unpack("<Q", self.lat.tails.lookup(i.to_bytes(4, "little")))[0]
                for i in range(n)]

    def in_flight(self) -> int:
        """Calls entered whose return was not seen (yet): still running at
        the end of the run, or left by a longjmp, a panic, an exit."""
        return sum(struct.unpack_from("<Q", v)[0] for _k, v in self.lat.entries.items())

    def latency_errors(self) -> list:
        return [struct.unpack("<Q", self.lat.errors.lookup(i.to_bytes(4, "little")))[0]
                for i in range(ERR_SLOTS)]

    def close(self) -> None:
        super().close()                  # programs, events, the unwinder's maps
        if self.lat is not None:
            self.lat.close()
            self.lat = None
        self.ring = None


class SlowChunk(bytes):
    """SLOW records read from the latency ring (RingBuf.read)."""


class LatencyCapture(BpfCapture):
    """BpfCapture's events (scoping, tracking records, exec arming) with a
    LatencyCounter attached; its stream carries metadata, and with --slower
    a RawSample per slow call (its probe is the function's index, its args
    (("duration_ns", "u64", ns),), its callchain the entry's stack)."""

    def __init__(self, probes: list, sites: list, target, buffer_pages=None, *,
                 unit_ns: int, by_stack: bool, slower_ns: int | None,
                 unwind_tables=None, fp_stacks: bool = False, stack_storage: int = 1024):
        super().__init__(probes, target, buffer_pages, stack_storage=stack_storage,
                         unwind_tables=unwind_tables)
        self.sites = sites
        self.fp_stacks = fp_stacks
        self.unit_ns, self.by_stack, self.slower_ns = unit_ns, by_stack, slower_ns
        self.decode = self._decode_latency
        if slower_ns is not None:
            self.read_chunks = self._read_chunks
            self.stop = self._stop

    def _new_counter(self) -> LatencyCounter:
        from .bpf import ring_bytes
        target = self.target
        return LatencyCounter(
            self.probes, self.sites, unit_ns=self.unit_ns, by_stack=self.by_stack,
            slower_ns=self.slower_ns, tables=self.unwind_tables,
            fp_stacks=self.fp_stacks,
            filter_tgid=target.pid if target.scope != "system" else None,
            stack_storage=self.stack_storage,
            ring_bytes=ring_bytes(self.buffer_pages))

    def _read_chunks(self, timeout_ms: int) -> list:
        return with_ring_records(self.events.read_chunks(timeout_ms), self.counter,
                                 SlowChunk)

    def _decode_latency(self, chunk, metas: list, samples: list, offset: int,
                        limit: int) -> int:
        if isinstance(chunk, SlowChunk):
            end = min(len(chunk), offset + limit)
            while offset < end:
                n = struct.unpack_from("<I", chunk, offset)[0]
                t, pid_tgid, function, cpu, ns, h = SLOW.unpack_from(chunk, offset + 4)
                chain, ret = self.counter.stack_of(h)
                samples.append(RawSample(function, pid_tgid >> 32,
                                         pid_tgid & 0xFFFFFFFF, t, cpu, chain, ret,
                                         args=(("duration_ns", "u64", ns),)))
                offset += 4 + n
            return offset
        before = len(metas)
        offset = self.events.decode(chunk, metas, samples, offset, limit)
        if self.counter is not None and self.counter.objects is not None:
            for _time, event in metas[before:]:
                if isinstance(event, MmapEvent):
                    self.counter.objects.add_mapping(event.mapping, event.pid)
        return offset

    def histograms(self) -> list:
        return self.counter.histograms()

    def tail_exits(self) -> list:
        return self.counter.tail_exits()

    def in_flight(self) -> int:
        return self.counter.in_flight()

    def losses(self) -> Losses:
        events = self.events.losses()
        if self.counter is None:
            return Losses(events.lost, events.throttled)
        deep, hists_full, entries_full, ring_full = self.counter.latency_errors()
        uncounted = tuple((why, n) for why, n in (
            (f"were nested deeper than {MAX_DEPTH} levels (not timed)", deep),
            ("found the histogram map full", hists_full),
            ("found the entry map full", entries_full)) if n)
        return Losses(events.lost + ring_full, events.throttled, uncounted,
                      skipped=self.counter.skipped())
