"""Allocations not freed, by stack, kept in the kernel (`ustack memleak`,
bcc's memleak, with the in-kernel DWARF unwinder of bpf_unwind.py).

Three programs (src/ustack/bpf/memleak.bpf.c):
- at an allocator's entry (malloc, calloc, realloc, posix_memalign,
  aligned_alloc, memalign, valloc, pvalloc, mmap: one program per kind of
  arguments): CALLS[tid] = (sp, the size asked for, posix_memalign's out
  pointer, the caller's stack walked by unwind.h and stored in STACKS
  under its hash). An allocator another one calls or jumps to
  (realloc(NULL, n) jumps into malloc at the same sp, malloc may call
  mmap) finds its thread's outer call in CALLS, at its own sp or older on the
  stack, and leaves it alone: the outer call is counted.
  realloc takes its old block out of ALLOCS at once (and puts it back if
  realloc fails), so no other thread's new block at that address is lost.
- at its return (a uretprobe: libc is not Go): the call whose sp + 8 is
  the return's sp (not a nested allocator's return); the block (rax, or
  *out for posix_memalign; NULL or MAP_FAILED: not counted) goes into
  ALLOCS[(address, tgid)] = (size, stack hash, time) and TOTALS[(tgid,
  stack hash)] += (size, 1).
- at free and munmap: the block's entry leaves ALLOCS, its size and count
  leave TOTALS; an address not in ALLOCS (from before the run, or not
  from these allocators) is ignored.
A Python process's allocating stacks get its Python frames (bpf/python.h,
capture/bpf_python.py), their new code objects reported through a ring.
A call whose walk met an object without rows yet (a library dlopen'd just
before: its MMAP2 record is read 5-20 ms later) goes through that ring as
a deferred record (registers and 8 KiB of stack) and its block is counted
under the record's id; ustack unwinds the record as the copy path's
samples, and the report names the block's stack from it.
TOTALS answers the report; ALLOCS with its times answers --older (only
blocks older than that). Nothing leaves the kernel per call."""
from __future__ import annotations

import struct
import time

from ..kernel import bpf_syscall
from ..model import Losses, RawSample
from ..values import value
from .bpf_capture import BpfCapture, uncounted
from .bpf_counter import BpfCounter, bpf_program_object, program_result
from .bpf_python import CODE_RING_BYTES, PythonMaps, PythonProcs
from .bpf_v8 import V8Maps, V8Objects
from .runtime_passes import mode_passes
from .script_passes import add_script_runtimes, script_maps, script_options
from .bpf_unwind import (DEFAULT_ROWS, DEFER_RING_BYTES, RingChunk, UnwindMaps,
                         keep_deferred, kernel_rodata, ring_samples, stack_chain,
                         unwind_fresh)
from .unwind_objects import UnwindObjects
from .kernel_offsets import Offsets

_U64 = struct.Struct("<Q")
MAX_ALLOCS = 1 << 20                 # outstanding blocks kept (bcc: 1,000,000)
TOTAL_SLOTS = 10240                  # (process, stack) pairs, at least


def memleak_object():
    return bpf_program_object("memleak")


def _layout(name: str):
    return memleak_object().layout(name).struct


@value
class Site:
    """What one probe of a memleak run is: an allocator's entry (its enum
    memleak_kind name), the return of one, or a free (free, munmap)."""
    role: str                        # entry | return | free
    kind: str = ""


@value
class Outstanding:
    """What one stack of one process holds: bytes and blocks not freed."""
    pid: int
    chain: bytes                     # the allocator's entry stack (bpf_unwind's frames)
    bytes: int
    count: int
    deferred: object = None          # its deferred RawSample (a copy to unwind), if any


class MemleakCounter(BpfCounter):
    """The unwinder's maps and rows, CALLS, ALLOCS, TOTALS and the error
    array; a program per allocator kind's entry, one for the returns, one
    for the frees."""

    def __init__(self, probes: list, owned, sites: list, tables, *, stack_storage: int,
                 armed=None, max_allocs: int = MAX_ALLOCS, python: bool = False,
                 js: bool = False, rows: int = DEFAULT_ROWS, php: bool = False,
                 perl: bool = False, ruby: bool = False):
        self._no_maps_yet(probes, owned, armed=armed)
        self.sites = sites
        self.unwind_maps = owned.map(UnwindMaps(rows, stack_storage, 16, deferring=False))
        self.objects = UnwindObjects(self.unwind_maps, tables)    # rows: open()
        # deferred records (and with Python frames, new code objects)
        self.ring = owned.ring(bpf_syscall.RingBuf(max(DEFER_RING_BYTES, CODE_RING_BYTES),
                                                   "ustack_mlring"))
        self.deferred: dict = {}        # a deferred call's id -> its RawSample
        self.fresh: list = []           # ids of those not unwound yet (unwind_deferred)
        if python:          # Python frames (python.h)
            self.python = PythonProcs(owned.map(PythonMaps()), objects=self.objects)
        if js:              # JS frames (v8.h)
            self.v8 = V8Objects(owned.map(V8Maps()), objects=self.objects)
        add_script_runtimes(self, owned, php=php, perl=perl, ruby=ruby)
        obj = memleak_object()
        lazy = bpf_syscall.F_NO_PREALLOC if bpf_syscall.kernel_at_least(6, 1) else 0
        self.calls = owned.map(obj.make_map("calls"))
        self.allocs = owned.map(obj.make_map("allocs", max_allocs, flags=lazy))
        self.totals = owned.map(obj.make_map(
            "totals", max(TOTAL_SLOTS, 2 * stack_storage), flags=lazy))
        self.ml_errors = owned.error_counters(owned.map(obj.make_map("ml_errors")),
                                              obj.enum("memleak_error"))
        self.named.update(self.unwind_maps.named())
        self.named.update(calls=self.calls, allocs=self.allocs, totals=self.totals,
                          ml_errors=self.ml_errors)
        self.named["ring"] = self.ring
        if self.python is not None:
            self.named.update(self.python.maps.named())
        if self.v8 is not None:
            self.named.update(self.v8.maps.named())
        self.named.update(script_maps(self))
        # the runtimes' passes loaded as the run meets them (runtime_passes.py)
        self.passes = mode_passes(self, self._pass_program)

    def _program(self, index: int, probe) -> int:
        site = self.sites[index]
        passes = (self.passes.array_for(probe)
                  if self.passes is not None and site.role == "entry" else None)
        return self._load(f"memleak_{site.role}", probe, site, f"ustack_ml{index}", passes)

    def _pass_program(self, program: str, passes: bpf_syscall.Map, probe,
                      by_cookie: bool) -> int:
        """A runtime's pass program (passes.h) for the entries' programs,
        the last storing the stack of the call they keep in CALLS."""
        return self._load(program, probe, None, f"ustack_{program}"[:15], passes)

    def _load(self, program: str, probe, site, name: str, passes) -> int:
        """memleak.bpf.c's `program` for `probe` (site: an entry's kind),
        `passes` the PASSES array it goes on in (runtime_passes.py), if any."""
        obj = memleak_object()
        options = obj.enum("memleak_option")
        inline = passes is None         # the runtimes' passes verified in this program
        wanted = {"ML_WAIT_FOR_EXEC": self.armed is not None,
                  "ML_PYTHON": inline and self.python is not None,
                  "ML_V8": inline and self.v8 is not None, "ML_DEFER": True,
                  "ML_PASS_CALLS": not inline,
                  **{k: inline and on for k, on in script_options(self, "ML").items()}}
        rodata = {"result": program_result(probe),
                  "ml_options": sum(options[k] for k, on in wanted.items() if on),
                  "kind": obj.enum("memleak_kind")[site.kind]
                  if site is not None and site.role == "entry" else 0,
                  "task_fsbase": Offsets.of_this_kernel().task_fsbase,
                  **kernel_rodata(Offsets.of_this_kernel(), self.unwind_maps)}
        return self._load_c("memleak", program, probe, rodata, name,
                            own={"passes": passes} if passes is not None else None)

    def load_programs(self) -> None:
        """A program per allocator kind's entry; one for every return, one
        for every free."""
        shared: dict = {}
        for index, site in enumerate(self.sites):
            if index in self.loaded:
                continue
            key = (site.role, site.kind if site.role == "entry" else "")
            if key not in shared:
                self.interrupt.check()
                shared[key] = self._program(index, self.probes[index])
            self.loaded[index] = shared[key]

    def attach(self, capture) -> None:
        """Returns and frees first, entries last: a call entered before its
        return's program runs would stay in CALLS."""
        self.load_programs()
        order = {"return": 0, "free": 0, "entry": 1}
        indexes = sorted({self.probes.index(p) for p, _fd in capture.opened},
                         key=lambda i: order[self.sites[i].role])
        for index in indexes:
            self.interrupt.check()
            bpf_syscall.attach(self._anchor(capture, self.probes[index]), self.loaded[index])

    # -- reading ------------------------------------------------------------------
    def outstanding(self, older_ns: int | None = None) -> list:
        """Outstanding per (process, stack): from TOTALS, or with `older_ns`
        from ALLOCS, only the blocks returned at least that long ago."""
        sums: dict = {}
        if older_ns is None:
            key, total = _layout("memleak_stack"), _layout("memleak_total")
            for k, v in self.totals.items():
                h, tgid = key.unpack(k)[:2]
                nbytes, count = total.unpack(v)
                if count > 0:
                    sums[(tgid, h)] = [nbytes, count]
        else:
            key, alloc = _layout("memleak_key"), _layout("memleak_alloc")
            now = time.monotonic_ns()        # bpf_ktime_get_ns's clock
            for k, v in self.allocs.items():
                _addr, tgid = key.unpack(k)[:2]
                size, h, t = alloc.unpack(v)
                if now - t >= older_ns:
                    s = sums.setdefault((tgid, h), [0, 0])
                    s[0] += size
                    s[1] += 1
        return [self._outstanding(tgid, h, nbytes, count)
                for (tgid, h), (nbytes, count) in sums.items()]

    def _outstanding(self, tgid: int, h: int, nbytes: int, count: int) -> Outstanding:
        """A stack's sums: its frames from STACKS, or its deferred record."""
        deferred = self.deferred.get(h)
        if deferred is not None:
            return Outstanding(tgid, b"", nbytes, count, deferred)
        return Outstanding(tgid, stack_chain(self.unwind_maps, h), nbytes, count)

    def take_deferred(self, samples: list) -> None:
        """The deferred records ring_samples made (their id is the weight
        it read), kept by id for outstanding()."""
        keep_deferred(samples, self.deferred, self.fresh)

    def unwind_deferred(self, unwind) -> None:
        """The deferred records kept since last time, unwound now
        (bpf_unwind.unwind_fresh)."""
        unwind_fresh(self.deferred, self.fresh, unwind)

    def in_calls(self) -> int:
        """Allocator calls entered and not returned (yet)."""
        return len(self.calls.keys())


class MemleakCapture(BpfCapture):
    """BpfCapture's events (scoping, tracking records, exec arming) with a
    MemleakCounter attached; the stream carries only metadata (each new
    mapping's rows are loaded as its record passes), `outstanding()` reads
    the kernel's sums whenever asked."""
    counts_in_kernel = False            # outstanding(), read by the command
    defers_table_full = True            # through its ring (memleak.bpf.c's defer_call)
    ring_chunk = RingChunk              # with Python frames: records of new code objects

    def __init__(self, probes: list, sites: list, target, buffer_pages=None, *,
                 unwind_tables, stack_storage: int, python: bool = False, js: bool = False,
                 unwind_memory: int | None = None, php: bool = False, perl: bool = False,
                 ruby: bool = False):
        super().__init__(probes, target, buffer_pages, stack_storage=stack_storage,
                         unwind_tables=unwind_tables, python=python, js=js,
                         unwind_memory=unwind_memory, php=php, perl=perl, ruby=ruby)
        self.sites = sites
        self.unwind_note = "stacks unwound in the kernel"

    def _new_counter(self) -> MemleakCounter:
        return MemleakCounter(self.probes, self.owned, self.sites, self.unwind_tables,
                              stack_storage=self.stack_storage, armed=self.armed,
                              python=self.python, js=self.js,
                              rows=self.rows_capacity or DEFAULT_ROWS, php=self.php,
                              perl=self.perl, ruby=self.ruby)

    def _decode_ring(self, chunk, samples: list, offset: int, limit: int) -> int:
        """The ring's records of new code objects and deferred calls, read
        (no samples: the deferred ones are kept for outstanding())."""
        python = self.counter.python
        deferred: list = []
        offset = ring_samples(chunk, deferred, offset, limit,
                              python_code=python.code_seen if python is not None else None,
                              weighted=True)
        self.counter.take_deferred(deferred)
        return offset

    def unwind_deferred(self, unwind) -> None:
        """MemleakCounter.unwind_deferred, once the run has a counter."""
        if self.counter is not None:
            self.counter.unwind_deferred(unwind)

    def outstanding(self, older_ns: int | None = None) -> list:
        """(RawSample of the allocating stack, bytes, blocks) per process and stack."""
        return [(o.deferred or RawSample(0, o.pid, o.pid, 0, -1, o.chain, b""), o.bytes, o.count)
                for o in self.counter.outstanding(older_ns)]

    def _losses(self, events: Losses, errors: dict, skipped: int) -> Losses:
        return Losses(events.lost, events.throttled, uncounted(errors, (
            ("found the stack map full (counted without a stack)", "ML_STACKS_FULL"),
            ("found the call map full", "ML_CALLS_FULL"),
            ("found the allocation map full", "ML_ALLOCS_FULL"),
            ("found the per-stack map full", "ML_TOTALS_FULL"),
            ("found its ring full (its stack cut where no unwind table was loaded yet)",
             "ML_UNDEFERRED"))), skipped=skipped)
