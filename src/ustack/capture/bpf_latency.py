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
- a BPF ring buffer (--slower, or Python frames): (end time, pid_tgid,
  function, cpu, duration, stack hash) per call at least that slow.
The entry's stack (--by-stack, --slower) is walked by the in-kernel DWARF
unwinder (capture/bpf_unwind.py) and stored once per distinct stack in its
STACKS map; the entry keeps only the stack's hash. Where that program is
refused (or with --unwind fp) the kernel walks frame pointers instead
(bpf_get_stackid), and FP_STACKS[hash] = (stack id, the return address at
[sp], which that walk skips at a function's entry). A Python process's
DWARF stacks get its Python frames (bpf/python.h, capture/bpf_python.py);
the records of their new code objects share the ring with the slow calls
(told apart by size: bpf_unwind.code_record). An entry whose walk went
through a JVM's JIT code (which keeps no frame pointers), or found the
process's memory map locked, sends the ring a deferred record instead (registers and 8 KiB of stack; latency.bpf.c's
defer_entry), whose id stands for the stack's hash: a histogram per such
call, unwound by ustack while the JVM lives (its Java frames read from
its memory, unwind/hotspot_live.py); once its call has returned, its
histogram leaves HISTS for one kept here per unwound stack (HISTS holds
no more than the calls in flight through a JVM)."""
from __future__ import annotations

import struct

from ..kernel import bpf_syscall
from ..model import Losses, RawSample, TracepointProbe, UnwoundSample, unwound_sample
from .bpf_capture import BpfCapture, uncounted
from .bpf_counter import BpfCounter, bpf_program_object, program_result, ring_bytes
from . import uprobe_links
from ..values import replace, value
from .bpf_python import CODE_RING_BYTES

# the layouts are ustack.h's (struct entry_stack, hist, slow_call, fp_stack:
# read from latency.bpf.o's BTF)
MAX_DEPTH = 16                       # LAT_MAX_DEPTH
BUCKETS = 64                         # LAT_BUCKETS


def latency_object():
    return bpf_program_object("latency")


def _layout(name: str):
    return latency_object().layout(name).struct


def error_slot(name: str) -> int:
    """The errors map's slot of `name` (enum latency_error)."""
    return latency_object().enum("latency_error")[name]


@value
class Site:
    """What one probe of a latency run is to the program on it."""
    function: int                    # index of the function (its histogram)
    role: str                        # entry | return | tail (a tail call's jmp)
    goroutine: bool = False          # key on the goroutine (r14), not the thread


class LatencyMaps:
    """latency.bpf.c's maps, as it declares them (sized here), kept by
    `owned` (a RunObjects)."""

    def __init__(self, owned, functions: int, entries: int, hists: int,
                 ring_bytes: int = 0):
        self.ring = None
        obj = latency_object()
        for name, size in (("entries", entries), ("hists", hists),
                           ("tails", max(functions, 1)), ("errors", None),
                           ("zero", None)):
            setattr(self, name, owned.map(obj.make_map(name, size)))
        owned.error_counters(self.errors, obj.enum("latency_error"))
        if ring_bytes:
            self.ring = owned.ring(bpf_syscall.RingBuf(ring_bytes, "ustack_latring"))

    def by_name(self) -> dict:
        """The maps by their names in latency.bpf.c."""
        named = {name: getattr(self, name)
                 for name in ("entries", "hists", "tails", "errors", "zero")}
        if self.ring is not None:
            named["ring"] = self.ring.map
        return named


# --- the counter and the capture ---------------------------------------------------

ENTRY_SLOTS = 16384                  # (thread or goroutine, function) pairs in flight
HIST_SLOTS = 10240                   # histograms: functions x stacks
# deferred entries kept for a histogram or a slow call at most, the
# oldest let go first (a call that outlives this many others through a
# JVM shows no stack)
MAX_DEFERRED = 16384


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
    sample: object = None            # by stack through a JVM: its deferred sample (unwound)


class LatencyCounter(BpfCounter):
    """The maps and programs of a latency run, attached to a PerfCapture's
    events like BpfCounter's (one program per trace event, never on the
    capture's inherited events). `sites[i]` says what probe i is;
    `tables`: the in-kernel unwinder's rows of an object, when the entry's
    stack is wanted with DWARF; `fp_stacks`: wanted with frame pointers."""

    def __init__(self, probes: list, owned, sites: list, *, unit_ns: int, by_stack: bool,
                 slower_ns: int | None, tables=None, fp_stacks: bool = False,
                 filter_tgid=None, armed=None, stack_storage: int = 1024,
                 ring_bytes: int = 0, python: bool = False, linked: frozenset = frozenset(),
                 js: bool = False, rows: int | None = None, php: bool = False,
                 perl: bool = False, ruby: bool = False, buffer_pages: int | None = None):
        self._no_maps_yet(probes, owned, armed=armed)
        self.linked = linked            # behind uprobe_multi links (uprobe_links.linked)
        self.sites = sites
        self.unit_ns, self.by_stack, self.slower_ns = unit_ns, by_stack, slower_ns
        self.unwind_maps = None
        self.stacks = self.fp_stacks = None
        functions = 1 + max(s.function for s in sites)
        # Python frames (python.h) in the stacks unwound in the kernel: the
        # records of new code objects share the ring with the slow calls
        python = python and tables is not None
        # stacks unwound in the kernel: the ring takes the entries deferred
        # through a JVM's JIT code (and slow calls, new Python code objects)
        # (larger with --buffer-pages, as a full ring's note advises)
        deferring = tables is not None
        if deferring:
            from .bpf_unwind import deferral_ring_bytes
        self.lat = LatencyMaps(owned, functions, ENTRY_SLOTS, HIST_SLOTS, max(
            ring_bytes if slower_ns is not None else 0, CODE_RING_BYTES if python else 0,
            deferral_ring_bytes(buffer_pages or 0) if deferring else 0))
        self.deferred: dict = {}        # a deferred entry's id (its stack hash) -> RawSample
        self.fresh: list = []           # ids of those not unwound yet (unwind_deferred)
        self.returned: set = set()      # ids whose histogram HISTS showed (fold_returned)
        self.folded: dict = {}          # (function, pid, unwound stack) -> Histogram
        self.ring = self.lat.ring
        if tables is not None:
            from .bpf_unwind import DEFAULT_ROWS, UnwindMaps
            from .unwind_objects import UnwindObjects
            self.unwind_maps = owned.map(UnwindMaps(rows or DEFAULT_ROWS, stack_storage, 16,
                                                    deferring=False))
            self.objects = UnwindObjects(self.unwind_maps, tables)   # rows: open()
            if python:
                from .bpf_python import PythonMaps, PythonProcs
                self.python = PythonProcs(owned.map(PythonMaps()), objects=self.objects)
            if js:          # JS frames (v8.h) in the same stacks
                from .bpf_v8 import V8Maps, V8Objects
                self.v8 = V8Objects(owned.map(V8Maps()), objects=self.objects)
            # PHP, Perl and Ruby frames (php.h, perl.h, ruby.h) in the same stacks
            from .script_passes import add_script_runtimes
            add_script_runtimes(self, owned, php=php, perl=perl, ruby=ruby)
            # the runtimes' passes loaded as the run meets them
            from .runtime_passes import mode_passes
            self.passes = mode_passes(self, self._pass_program)
        elif fp_stacks:
            from ..kernel import perf_event as pe
            self.max_depth = max(1, min(pe.max_stack(), 127))
            obj = latency_object()
            self.stacks = owned.map(obj.make_map("stacks", stack_storage,
                                                 value_size=8 * self.max_depth))
            self.fp_stacks = owned.map(obj.make_map("fp_stacks", stack_storage))
        self.follow_if_traced(filter_tgid)

    def _pass_program(self, program: str, passes: bpf_syscall.Map, probe,
                      by_cookie: bool) -> int:
        """A runtime's pass program (passes.h) for the entries' programs
        of `probe`'s kind, the last pushing the entry (its function and
        whose entries it is kept by the entry's program)."""
        index = next(i for i, s in enumerate(self.sites)
                     if s.role == "entry" and self.probes[i] is probe)
        return self._load(index, by_cookie, program, passes)

    def _load(self, index: int, by_cookie: bool = False, program: str | None = None,
              passes=None) -> int:
        """The program of probe `index`; `by_cookie`: of every linked probe
        of its role, the function being the link's cookie. `program`: a
        pass program for the entries of its kind, going on in `passes`."""
        probe, site = self.probes[index], self.sites[index]
        tgids = self.tgids if isinstance(probe, TracepointProbe) else None
        result = program_result(probe)
        bits = latency_object().enum("latency_option")
        entry = site.role == "entry"
        dwarf = entry and self.unwind_maps is not None
        if dwarf and program is None and self.passes is not None:
            passes = self.passes.array_for(probe, by_cookie)
        inline = passes is None         # the runtimes' passes verified in this program
        wanted = {"LAT_DWARF_STACK": dwarf,
                  "LAT_ONLY_TRACED": tgids is not None,
                  "LAT_WAIT_FOR_EXEC": self.armed is not None,
                  "LAT_GOROUTINE": site.goroutine,
                  "LAT_FP_STACK": entry and self.fp_stacks is not None,
                  "LAT_BY_STACK": not entry and self.by_stack,
                  "LAT_SLOWER": not entry and self.slower_ns is not None,
                  "LAT_TAIL": site.role == "tail",
                  "LAT_PYTHON": dwarf and inline and self.python is not None,
                  "LAT_V8": dwarf and inline and self.v8 is not None,
                  "LAT_PASS_CALLS": dwarf and not inline,
                  "LAT_DEFER": dwarf}
        if dwarf and inline:
            from .script_passes import script_options
            wanted.update(script_options(self, "LAT"))
        self.named.update(self.lat.by_name())
        if self.fp_stacks is not None:
            self.named.update(stacks=self.stacks, fp_stacks=self.fp_stacks)
        unwinding = {}
        if dwarf:           # the unwinder's maps, where it finds its way
            from .bpf_unwind import kernel_rodata, regs_source
            from .kernel_offsets import Offsets
            self.named.update(self.unwind_maps.named())
            if self.python is not None:
                self.named.update(self.python.maps.named())
            if self.v8 is not None:
                self.named.update(self.v8.maps.named())
            from .script_passes import script_maps
            self.named.update(script_maps(self))
            unwinding = {**kernel_rodata(Offsets.of_this_kernel(), self.unwind_maps),
                         "task_fsbase": Offsets.of_this_kernel().task_fsbase,
                         "regs_source": latency_object().enum("regs_source")[
                             regs_source(probe)]}
        return self._load_c("latency", program or (
                                "latency_entry" if entry else "latency_return"),
                            probe, {"function": site.function, "result": result,
                                    "options": sum(bits[k] for k, on in wanted.items() if on),
                                    "unit_ns": self.unit_ns,
                                    "slower_ns": self.slower_ns or 0,
                                    "function_by_cookie": int(by_cookie), **unwinding},
                            f"ustack_{program}"[:15] if program else f"ustack_lat{index}",
                            bpf_syscall.TRACE_UPROBE_MULTI if by_cookie else None,
                            own={"passes": passes} if passes is not None else None)

    def load_programs(self) -> None:
        """A program per entry; one per (function, role) for the returns;
        one per (role, goroutine or not) for the linked probes."""
        shared: dict = {}
        for index, site in enumerate(self.sites):
            if index in self.loaded:
                continue
            key = (site.function, site.role, type(self.probes[index]))
            if index in self.linked:
                key = ("linked", site.role, site.goroutine)
                if key not in shared:
                    shared[key] = self._load(index, by_cookie=True)
                self.loaded[index] = shared[key]
            elif site.role == "entry":
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
            bpf_syscall.attach(self._anchor(capture, self.probes[index]), self.loaded[index])
        linked = sorted(self.linked, key=lambda i: order[self.sites[i].role])
        for pid in uprobe_links.pids_of(capture.target):
            uprobe_links.attach([(i, self.loaded[i], self.sites[i].function) for i in linked],
                                self.probes, self.owned, self.interrupt, pid)

    def histograms(self) -> list:
        out = []
        hist_key = _layout("hist_key")
        for k in self.lat.hists.keys():
            function, tgid, h = hist_key.unpack(k)
            deferred = self.deferred.get(h) if self.by_stack else None
            summed = self._summed(k)
            if summed is None:
                continue
            chain, ret = (b"", b"") if deferred is not None or not self.by_stack \
                else self.stack_of(h)
            out.append(Histogram(function, tgid, chain, ret, *summed, deferred))
        return out + list(self.folded.values())

    def _summed(self, key: bytes) -> tuple | None:
        """(count, total, min, max, buckets) of HISTS[key] over the CPUs;
        None where it holds no call."""
        values = self.lat.hists.lookup_percpu(key)
        if values is None:
            return None
        hist = _layout("hist")
        count = total = high = 0
        low = None
        buckets = [0] * BUCKETS
        for v in values:
            n, s, mn, mx, counts = hist.unpack_from(v)
            if not n:
                continue
            count, total, high = count + n, total + s, max(high, mx)
            low = mn if low is None else min(low, mn)
            for i, b in enumerate(struct.unpack(f"<{BUCKETS}Q", counts)):
                buckets[i] += b
        return (count, total, low or 0, high, buckets) if count else None

    def fold_returned(self) -> None:
        """The histograms of the deferred entries unwound whose calls have
        returned out of HISTS, added to the one of their unwound stack:
        an id's histogram is written by its one return, so one seen last
        time is complete now."""
        hist_key = _layout("hist_key")
        for h in list(self.returned):
            d = self.deferred.pop(h, None)
            self.returned.discard(h)
            if not isinstance(d, UnwoundSample):
                continue
            key = hist_key.pack(d.probe, d.pid, h)
            summed = self._summed(key)
            if summed is None:
                continue
            self.lat.hists.delete(key)
            fold = (d.probe, d.pid, d.unwound)
            m = self.folded.get(fold)
            count, total, low, high, buckets = summed
            self.folded[fold] = Histogram(d.probe, d.pid, b"", b"", count, total, low, high,
                                          buckets, d) if m is None else replace(
                m, count=m.count + count, total_ns=m.total_ns + total,
                min_ns=min(m.min_ns, low), max_ns=max(m.max_ns, high),
                buckets=[a + b for a, b in zip(m.buckets, buckets)])
        for h, d in self.deferred.items():
            if isinstance(d, UnwoundSample) and self._summed(
                    hist_key.pack(d.probe, d.pid, h)) is not None:
                self.returned.add(h)

    def stack_of(self, h: int) -> tuple:
        """(callchain, return address) of the entry stack with hash `h`."""
        if self.unwind_maps is not None:
            from .bpf_unwind import stack_chain
            return stack_chain(self.unwind_maps, h), b""
        if self.fp_stacks is not None:
            raw = self.fp_stacks.lookup(h.to_bytes(8, "little"))
            if raw is not None:
                stack_id, _zero, ret = _layout("fp_stack").unpack(raw)
                return self.stack_bytes(stack_id), ret.to_bytes(8, "little")
        return b"", b""

    def slow_sample(self, h: int, function: int, pid_tgid: int, time_ns: int, cpu: int,
                    args: tuple) -> RawSample:
        """The RawSample of a slow call whose entry stack has hash `h`: its
        callchain from the stacks, or its deferred record's copy (or the
        stack unwound from it)."""
        d = self.deferred.get(h)
        pid, tid = pid_tgid >> 32, pid_tgid & 0xFFFFFFFF
        if d is None:
            chain, ret = self.stack_of(h)
            return RawSample(function, pid, tid, time_ns, cpu, chain, ret, args=args)
        if isinstance(d, UnwoundSample):
            return unwound_sample(RawSample(function, pid, tid, time_ns, cpu, args=args),
                                  *d.unwound)
        return d._replace(probe=function, time_ns=time_ns, cpu=cpu, args=args)

    def take_deferred(self, samples: list) -> None:
        """The deferred entries ring_samples made, kept by id (bpf_unwind.keep_deferred)."""
        from .bpf_unwind import keep_deferred
        keep_deferred(samples, self.deferred, self.fresh)

    def unwind_deferred(self, unwind) -> None:
        """The deferred entries kept since last time, unwound now
        (bpf_unwind.unwind_fresh); by stack, those returned folded."""
        from .bpf_unwind import unwind_fresh
        unwind_fresh(self.deferred, self.fresh, unwind)
        if self.by_stack:
            self.fold_returned()
        while len(self.deferred) > MAX_DEFERRED:      # the oldest let go
            del self.deferred[next(iter(self.deferred))]

    def tail_exits(self) -> list:
        """Calls per function that left through a tail call (not timed)."""
        n = self.lat.tails.max_entries
        return [struct.unpack("<Q", self.lat.tails.lookup(i.to_bytes(4, "little")))[0]
                for i in range(n)]

    def in_flight(self) -> int:
        """Calls entered whose return was not seen (yet): still running at
        the end of the run, or left by a longjmp, a panic, an exit."""
        return sum(struct.unpack_from("<Q", v)[0] for _k, v in self.lat.entries.items())


class SlowChunk(bytes):
    """SLOW records read from the latency ring (RingBuf.read)."""


class LatencyCapture(BpfCapture):
    """BpfCapture's events (scoping, tracking records, exec arming) with a
    LatencyCounter attached; its stream carries metadata, and with --slower
    a RawSample per slow call (its probe is the function's index, its args
    (("duration_ns", "u64", ns),), its callchain the entry's stack)."""
    counts_in_kernel = False            # histograms(), read by the command
    ring_chunk = SlowChunk
    links_uprobes = True                # its programs can learn the function from a cookie

    def __init__(self, probes: list, sites: list, target, buffer_pages=None, *,
                 unit_ns: int, by_stack: bool, slower_ns: int | None,
                 unwind_tables=None, fp_stacks: bool = False, stack_storage: int = 1024,
                 python: bool = False, js: bool = False, unwind_memory: int | None = None,
                 php: bool = False, perl: bool = False, ruby: bool = False):
        super().__init__(probes, target, buffer_pages, stack_storage=stack_storage,
                         unwind_tables=unwind_tables, python=python, js=js,
                         unwind_memory=unwind_memory, php=php, perl=perl, ruby=ruby)
        self.sites = sites
        self.fp_stacks = fp_stacks
        self.unit_ns, self.by_stack, self.slower_ns = unit_ns, by_stack, slower_ns

    def _new_counter(self) -> LatencyCounter:
        return LatencyCounter(
            self.probes, self.owned, self.sites, unit_ns=self.unit_ns,
            by_stack=self.by_stack, slower_ns=self.slower_ns, tables=self.unwind_tables,
            fp_stacks=self.fp_stacks, filter_tgid=self._tgid(), armed=self.armed,
            stack_storage=self.stack_storage, ring_bytes=ring_bytes(self.buffer_pages),
            python=self.python, linked=self.linked, js=self.js, rows=self.rows_capacity,
            php=self.php, perl=self.perl, ruby=self.ruby, buffer_pages=self.buffer_pages)

    def _decode_ring(self, chunk, samples: list, offset: int, limit: int) -> int:
        from .bpf_unwind import DEFER_RECORD, code_record, ring_samples
        end = min(len(chunk), offset + limit)
        slow = _layout("slow_call")
        python = self.counter.python
        while offset < end:
            n = struct.unpack_from("<I", chunk, offset)[0]
            rec = offset + bpf_syscall.RING_RECORD_HEADER
            if code_record(chunk, rec, n, python and python.code_seen):
                offset = bpf_syscall.ring_next(offset, n)
                continue
            if n == DEFER_RECORD:       # an entry deferred: this one record
                deferred: list = []
                offset = ring_samples(chunk, deferred, offset, 1, weighted=True)
                self.counter.take_deferred(deferred)
                continue
            t, pid_tgid, function, cpu, ns, h = slow.unpack_from(chunk, rec)
            samples.append(self.counter.slow_sample(h, function, pid_tgid, t, cpu,
                                                    (("duration_ns", "u64", ns),)))
            offset = bpf_syscall.ring_next(offset, n)
        return offset

    def unwind_deferred(self, unwind) -> None:
        """LatencyCounter.unwind_deferred, once the run has a counter."""
        if self.counter is not None:
            self.counter.unwind_deferred(unwind)

    def histograms(self) -> list:
        return self.counter.histograms()

    def tail_exits(self) -> list:
        return self.counter.tail_exits()

    def in_flight(self) -> int:
        return self.counter.in_flight()

    def _losses(self, events: Losses, errors: dict, skipped: int) -> Losses:
        return Losses(events.lost + errors["LAT_RING_FULL"], events.throttled, uncounted(
            errors, ((f"were nested deeper than {MAX_DEPTH} levels (not timed)",
                      "LAT_TOO_DEEP"),
                     ("found the histogram map full", "LAT_HISTS_FULL"),
                     ("found the entry map full", "LAT_ENTRIES_FULL"))),
            # counted, their stacks the kernel's walk on frame pointers
            (("a JVM's JIT code walked on frame pointers", errors["LAT_UNDEFERRED"]),)
            if errors["LAT_UNDEFERRED"] else (),
            deferral_full=errors["LAT_UNDEFERRED"], skipped=skipped)
