"""Unwind rows packed for the in-kernel unwinder (capture/bpf_unwind.py).

The BPF program cannot run the CFI interpreter, so each object's rules are
flattened here into fixed-size rows sorted by address, which the program
binary-searches: the CFI table of cfi.py (already interpreted and cached on
disk), reduced to the rules the program evaluates, plus a row
for the signal trampoline (glibc's __restore_rt) that cfi.py leaves to the
Python unwinder's byte check.

A row is 16 bytes (ROW): the ELF virtual address where it starts (u32: the
program keys rows by vaddr = address - bias), the kind, the rbp and rbx
rules, a small auxiliary value (the PLT threshold, or what is added after
a deref), the CFA offset and rbp's and rbx's offsets. rbx is followed
because ld.so's lazy-binding resolver defines its CFA from it. The return
address is always at CFA - 8 (x86-64); rows whose CFI says otherwise, or
uses a rule the program does not evaluate, become UNSUPPORTED and end the
stack with a note, never a guess."""
from __future__ import annotations

import bisect
import os
import struct
from array import array

from ..bpf import object_path
from ..kernel.bpf_object import bpf_object
from ..objfile import builders
from ..objfile.built_once import BuiltOnce
from ..objfile import cache as objcache
from ..objfile import content_key
from ..objfile.elf import ElfImage
# cfi, dwarf and the Go reader are imported where rows are built: a run
# whose rows come from the cache (the common case) spares their ~4 ms
from ..values import value
from .cfi_key import debug_file, table_key

# Row kinds as the BPF program reads them.
GAP = 0           # no CFI covers the address
SP = 1            # CFA = rsp + cfa
BP = 2            # CFA = rbp + cfa
PLT = 3           # CFA = rsp + cfa + (8 if (pc & 15) >= aux else 0)
END = 4           # the outermost frame: the stack ends here, complete
SIGNAL = 5        # a sigreturn trampoline: continue from the saved ucontext
UNSUPPORTED = 6   # CFI the program does not evaluate
BX = 7            # CFA = rbx + cfa (ld.so's _dl_runtime_resolve_*)
SP_DEREF = 8      # CFA = [rsp + cfa] + aux
BP_DEREF = 9      # CFA = [rbp + cfa] + aux (gcc's realigned stack, DRAP)
STACK_SWITCH = 1  # a BP row's aux: the frame runs on another stack (ROW_STACK_SWITCH)
KIND_NAMES = {GAP: "gap", SP: "sp", BP: "bp", PLT: "plt", END: "end",
              SIGNAL: "signal", UNSUPPORTED: "unsupported", BX: "bx",
              SP_DEREF: "sp-deref", BP_DEREF: "bp-deref"}
# rbp rules: cfi.BP_SAME, BP_AT (at CFA + bp), BP_LOST, BP_AT_BP (at rbp + bp)
# rbx rules: cfi.BX_SAME, BX_AT (at CFA + bx), BX_LOST

# pc, kind, bp rule, bx rule, aux, cfa, bp, bx: struct unwind_row of
# src/ustack/bpf/ustack.h
ROW = bpf_object(object_path("unwind")).layout("unwind_row").struct
ROW_SIZE = ROW.size
MAX_VADDR = 1 << 32               # rows key addresses as u32
_S32 = (-(1 << 31), (1 << 31) - 1)
_S16 = (-(1 << 15), (1 << 15) - 1)
_S8 = (-(1 << 7), (1 << 7) - 1)
NO_ROW = (GAP, 0, 0, 0, 0, 0, 0)
_KINDS: dict = {}                 # cfi.py's row kinds -> ours, filled at first use


PAGE_SHIFT = 12                   # the page index's granule: 4 KiB of code
_U32 = struct.Struct("<I")


@value
class PackedRows:
    """One object's rows, as the BPF map holds them (ROW each), and their
    page index: for each 4 KiB page from `first_page` on, the row that
    covers the page's first byte (u32), so the program's binary search runs
    over one page's rows instead of the whole object's."""
    path: str
    data: bytes
    from_cache: bool = False      # the CFI came from ustack's disk cache

    def __len__(self) -> int:
        return len(self.data) // ROW_SIZE

    def row(self, i: int) -> tuple:
        return ROW.unpack_from(self.data, i * ROW_SIZE)

    @property
    def first_page(self) -> int:
        return self.row(0)[0] >> PAGE_SHIFT if len(self) else 0

    def pages(self) -> bytes:
        """The page index: u32 row numbers, one per page from first_page
        through the page of the last row, plus one past it."""
        # each row's pc: the first u32 of every four (ROW is 16 bytes, pc first)
        starts = memoryview(self.data).cast("I")[::ROW_SIZE // 4]
        if not starts:
            return b""
        # the last row starting at or below the page's first byte (row 0 below all)
        return array("I", (max(bisect.bisect_right(starts, page << PAGE_SHIFT) - 1, 0)
                           for page in range(self.first_page,
                                             (starts[-1] >> PAGE_SHIFT) + 2))).tobytes()

    def lookup(self, vaddr: int, pages: bytes | None = None) -> tuple | None:
        """(kind, bp rule, bx rule, aux, cfa, bp, bx) of the row covering vaddr, found
        as the program finds it (the last row starting at or below it),
        through the page index when given; None below the first row."""
        lo, hi = 0, len(self)
        p = (vaddr >> PAGE_SHIFT) - self.first_page
        if pages is not None and 0 <= p < len(pages) // 4 - 1:
            lo = _U32.unpack_from(pages, 4 * p)[0]
            hi = _U32.unpack_from(pages, 4 * p + 4)[0] + 1
        while lo < hi:                  # the program's search, step for step
            mid = (lo + hi) // 2
            if self.row(mid)[0] <= vaddr:
                lo = mid + 1
            else:
                hi = mid
        if lo == 0:
            return None
        return self.row(lo - 1)[1:]


def pack_row(kind: int, cfa_off: int, ra_off: int, bp_rule: int, bp_off: int,
             aux: int, bx_rule: int = 0, bx_off: int = 0) -> tuple:
    """A cfi.UnwindTable row -> (kind, bp rule, bx rule, aux, cfa, bp, bx) of ours."""
    if not _KINDS:
        from . import cfi
        _KINDS.update({cfi.NONE: GAP, cfi.END: END, cfi.CFA_SP: SP, cfi.CFA_BP: BP,
                       cfi.CFA_PLT: PLT, cfi.CFA_BX: BX, cfi.CFA_SP_DEREF: SP_DEREF,
                       cfi.CFA_BP_DEREF: BP_DEREF})
    ours = _KINDS.get(kind)
    if ours in (GAP, END):
        return (ours, 0, 0, 0, 0, 0, 0)
    fits = (_S32[0] <= cfa_off <= _S32[1] and all(_S16[0] <= v <= _S16[1] for v in (bp_off, bx_off))
            and _S8[0] <= aux <= _S8[1])
    if ours is None or ra_off != -8 or not fits:
        return (UNSUPPORTED, 0, 0, 0, 0, 0, 0)
    return (ours, bp_rule, bx_rule, aux if ours in (PLT, SP_DEREF, BP_DEREF) else 0, cfa_off,
            bp_off, bx_off)


def rows_of_table(table) -> list:
    """(vaddr, (kind, bp rule, aux, cfa, bp)) of a CFI table, merged where
    neighbours pack the same."""
    out: list = []
    packed: dict = {}                   # a few hundred distinct rules in 370,000 rows
    last = None
    for start, k, cfa, ra, bp, aux, bx in zip(table.starts, table.kinds, table.cfa, table.ra,
                                             table.bp, table.aux, table.bx):
        rule = (k, cfa, ra, bp, aux, bx)
        row = packed.get(rule)
        if row is None:
            row = packed[rule] = pack_row(k & 15, cfa, ra, (k >> 4) & 3, bp, aux, k >> 6, bx)
        if row != last:
            out.append((start, row))
            last = row
    return out


def signal_trampolines(image: ElfImage) -> list:
    """The vaddrs of glibc's __restore_rt code (mov $15,%rax; syscall) in the
    object's executable segments."""
    from .restore_rt import RESTORE_RT
    found = []
    for vaddr, _off, size in image.file.executable_segments():
        data = image.file.read(vaddr, size)
        at = data.find(RESTORE_RT)
        while at >= 0:
            found.append(vaddr + at)
            at = data.find(RESTORE_RT, at + 1)
    return found


def with_ranges(rows: list, ranges: list) -> list:
    """rows with each (start, end, row) of `ranges` laid over them: inside
    the range the new row, after it whatever row covered `end` before."""
    for start, end, row in ranges:
        starts = [r[0] for r in rows]
        before = rows[bisect.bisect_right(starts, end) - 1][1] \
            if bisect.bisect_right(starts, end) else NO_ROW
        rows = ([r for r in rows if r[0] < start] + [(start, row), (end, before)]
                + [r for r in rows if r[0] > end])
    return rows


def pack(path: str, rows: list, from_cache: bool = False) -> PackedRows | None:
    """PackedRows of (vaddr, row) pairs; None if an address does not fit
    the program's u32 keys."""
    if rows and rows[-1][0] >= MAX_VADDR:
        return None
    return PackedRows(path, b"".join(ROW.pack(vaddr, *row) for vaddr, row in rows),
                      from_cache)


# Where Go's stacks end: the first frame of every goroutine, of every thread
# (g0) and of the process.
GO_OUTERMOST = {"runtime.goexit", "runtime.mstart", "runtime.rt0_go"}


# Go's assembly that calls the vDSO on the thread's system stack: rsp moves
# to another stack inside the frame, so pcsp's rsp-based rule is wrong there;
# rbp still holds the frame (Go keeps frame pointers)
GO_STACK_SWITCHERS = {"time.now", "runtime.nanotime1", "runtime.walltime",
                      "runtime.walltime1", "runtime.vgetrandom1"}


def go_rows(table, read_code=None) -> list:
    """(vaddr, row) of a Go binary from its .gopclntab: pcsp gives the SP
    delta at every pc, so CFA = rsp + delta + 8 (frameless leaves and
    assembly included); rbp is saved at CFA - 16 once the frame exists
    (Go keeps frame pointers), which only C frames (cgo) would read; rbx
    is not known past a Go frame (Go's ABI does not preserve it). In the
    functions that switch stacks for the vDSO, CFA = rbp + 16 wherever rbp
    holds their frame (`read_code(vaddr, size)` gives their bytes)."""
    from .cfi import BP_AT, BP_SAME, BX_LOST
    rows: list = []
    for i, (name, entry, end) in enumerate(table.functions()):
        bare = name.removesuffix(".abi0")
        if bare in GO_OUTERMOST:
            rows.append((entry, (END, 0, 0, 0, 0, 0, 0)))
        elif bare in GO_STACK_SWITCHERS and read_code is not None:
            rows.extend(_go_switcher_rows(table.sp_deltas(i), read_code(entry, end - entry),
                                          entry))
        else:
            for pc, delta in table.sp_deltas(i):
                if delta < 0 or delta >= _S32[1]:
                    row = (UNSUPPORTED, 0, 0, 0, 0, 0, 0)
                elif delta == 0:
                    row = (SP, BP_SAME, BX_LOST, 0, 8, 0, 0)
                else:
                    row = (SP, BP_AT, BX_LOST, 0, delta + 8, -16, 0)
                if rows and rows[-1][0] == pc:
                    rows[-1] = (pc, row)
                elif not rows or rows[-1][1] != row:
                    rows.append((pc, row))
        rows.append((end, NO_ROW))
    return rows


def _go_switcher_rows(sp_deltas, code: bytes, entry: int) -> list:
    """A stack-switching function's rows: pcsp's, overlaid with CFA = rbp +
    16 (rbp saved at CFA - 16) where rbp holds its frame."""
    from ..objfile.prologue import frame_pointer_spans
    from .cfi import BP_AT, BP_SAME, BX_LOST
    by_sp = []
    for pc, delta in sp_deltas:
        if delta < 0 or delta >= _S32[1]:
            by_sp.append((pc, (UNSUPPORTED, 0, 0, 0, 0, 0, 0)))
        elif delta == 0:
            by_sp.append((pc, (SP, BP_SAME, BX_LOST, 0, 8, 0, 0)))
        else:
            by_sp.append((pc, (SP, BP_AT, BX_LOST, 0, delta + 8, -16, 0)))
    by_bp = (BP, BP_AT, BX_LOST, STACK_SWITCH, 16, -16, 0)
    return with_ranges(sorted_rows(by_sp),
                       [(start, end, by_bp) for start, end in frame_pointer_spans(code, entry)])


# for_image(cached_only=True)'s answer for rows that would have to be built
NOT_CACHED = object()


def for_image(image: ElfImage, debug_dirs=(), *, run_waits: bool = True,
              cached_only: bool = False):
    """The packed rows of an ELF object: a Go binary's from its
    .gopclntab; others' from their CFI (.eh_frame, .debug_frame and the
    separate debug file, as the Python unwinder uses them). None when it
    has none the program could use. A big object's (node's) are built by
    a child process (unwind/rows_builder.py) while this thread waits, its
    intermediate tables never in this process's memory. run_waits=False
    (a whole-machine run's lazy loader: the object's samples are unwound
    in user space meanwhile): that child yields the CPU to the machine's
    work and to the run's own (BACKGROUND_NICENESS). cached_only: the
    cache's rows, else NOT_CACHED without building (a run loads those
    after its probes are live: lazy_rows.py)."""
    if image.file.is_go:
        return _go_packed(image, cached_only)
    # cached by what they are built from (the CFI table's key and the signal
    # trampolines): packing libc's 30 k rows costs ~0.25 s, and a launched
    # command waits for its objects' rows before it may start
    try:
        st = os.stat(image.path)
    except OSError:
        st = None
    if cached_only and (st is None or not (content_key.known(TRAMPOLINES, st)
                                           and content_key.known("cfi", st))):
        return NOT_CACHED               # its keys alone may scan all its code
    apart = st is not None and (_worth_a_child(image) or (
        not run_waits and _indexed_by_unwinder(image, debug_dirs)))
    built_apart = False                 # a child that ended is started anew: once here
    if apart and not (content_key.known(TRAMPOLINES, st) and content_key.known("cfi", st)):
        # a version not seen before: its keys too (a scan of all its code,
        # ~0.2 s of node's) are computed by the child, which remembers them
        _build_apart(image, debug_dirs, run_waits)
        built_apart = True
    cache = None
    if st is not None:
        cache = rows_file(rows_key(table_key(image, st, debug_file(image, st, debug_dirs)),
                                    content_key.remembered(TRAMPOLINES, st,
                                                           lambda: signals_key(image))))
    found = _cached_rows(image, cache)
    if found is None and cached_only:
        return NOT_CACHED
    if found is None and apart and not built_apart:
        _build_apart(image, debug_dirs, run_waits)
        found = _cached_rows(image, cache)      # else: built here below
    if found is not None:
        return found[0]
    from .cfi import UnwindTable
    table, _found = UnwindTable.for_image(image, debug_dirs)
    rows = rows_of_table(table)
    signals = signal_ranges(image)
    rows = with_ranges(rows, signals)
    packed = None
    if any(row[0] not in (GAP, UNSUPPORTED) for _v, row in rows):
        packed = pack(image.path, rows, table.from_cache)
    if cache:       # named by what was read here: the file may have changed since
        objcache.write(rows_file(rows_key(table.key, _signals_key(signals))),
                       packed.data if packed is not None else b"none")
    return packed


def _indexed_by_unwinder(image: ElfImage, debug_dirs) -> bool:
    """cfi_index.indexed_by_unwinder(), imported when asked: that module
    brings the CFI interpreter, which a run reading cached rows never uses."""
    from .cfi_index import indexed_by_unwinder
    return indexed_by_unwinder(image, debug_dirs)


def _build_apart(image: ElfImage, debug_dirs, run_waits: bool) -> None:
    """Build the rows in the rows builder (one long-lived child per cache
    directory, one job at a time per object) and wait for it: a big
    object's (node's) at BACKGROUND_NICENESS when the run goes on without
    them; the lazy loader's others (libc, libpython: built here they took
    this process's GIL from the unwinding of the deferred stacks, 1-3 s
    of a loaded whole-machine run) at the run's."""
    key = ("rows", image.path, tuple(debug_dirs))
    nicer = not run_waits and _worth_a_child(image)
    builders.start(key, "ustack.unwind.rows_builder", [image.path, *debug_dirs],
                   niceness=BACKGROUND_NICENESS if nicer else 0, shared=True)
    builders.wait(key)


def rows_key(table: str, signals: str) -> str:
    """The key of the rows packed from the CFI table whose key is `table`
    and the signal trampolines whose key is `signals`."""
    return content_key.of("bpfrows", table, signals)


def rows_file(key: str) -> str:
    """Where the rows whose key is `key` (rows_key) are cached."""
    return objcache.cache_file("bpfrows", key, "cfi4")     # rows with rbx's rule


def signal_ranges(image: ElfImage) -> list:
    """(start, end, SIGNAL row) over each glibc __restore_rt in the object."""
    from .restore_rt import RESTORE_RT, just_after_trampoline
    # the return address into __restore_rt is looked up at pc - 1: one byte
    # before; the pc just after its syscall (the rt_sigreturn event, a sample
    # while the kernel runs it) is exact: one byte after, where padding
    # follows (never where another function begins)
    return [(at - 1, at + len(RESTORE_RT)
             + just_after_trampoline(image, at + len(RESTORE_RT)), (SIGNAL, 0, 0, 0, 0, 0, 0))
            for at in signal_trampolines(image)]


def signals_key(image: ElfImage) -> str:
    """The key of the object's signal_ranges()."""
    return _signals_key(signal_ranges(image))


# The memo of signals_key() outlives this code, so the key says only what
# the file holds (the trampolines' address ranges), never how a row is laid
# out: "signals" hashed the rows too, and every run since rows grew rbx's
# rule missed the cache on a machine that had remembered the old key
# (libc's and ld.so's rows packed again: ~40 ms of a one-hit run's CPU).
TRAMPOLINES = "trampolines"


def _signals_key(ranges: list) -> str:
    return content_key.of(TRAMPOLINES, repr([(start, end) for start, end, _row in ranges]))


def _cached_rows(image: ElfImage, cache: str | None) -> tuple | None:
    """(PackedRows or None for "no usable rows") from the cache, or None
    when it holds nothing to trust."""
    blob = objcache.read(cache) if cache else None
    if blob is not None:
        if blob == b"none":
            return (None,)
        if len(blob) % ROW_SIZE == 0:
            return (PackedRows(image.path, blob, from_cache=True),)
    return None


BUILT_APART_FROM = 1 << 20       # .eh_frame bytes whose rows a child builds (node's: 2.7 MB)
BACKGROUND_NICENESS = 10        # a child nothing waits for: a tenth of a busy CPU's share


def _worth_a_child(image: ElfImage) -> bool:
    return image.file.sections.get(".eh_frame", (0, 0, 0))[2] >= BUILT_APART_FROM


def _go_packed(image: ElfImage, cached_only: bool = False):
    """A Go binary's rows, cached on disk by the file's version (decoding
    every function's pcsp costs seconds on large binaries; the Go reader
    reads the file itself, so its bytes cannot be hashed as parsed)."""
    st = os.stat(image.path)
    cache = objcache.cache_file("bpfrows", content_key.of_files(st), "go5")
    built = _GO_BUILT.values.get(cache)
    if built is not None:
        return built[0]
    blob = objcache.read(cache)
    if blob and len(blob) % ROW_SIZE == 0:
        return PackedRows(image.path, blob, from_cache=True)
    if cached_only:
        return NOT_CACHED
    # the row loader and the unwinder of a deferred stack may ask at once
    return _GO_BUILT.get(cache, lambda: (_go_build(image, cache),))[0]


# cache file -> (PackedRows or None,) of the Go binaries built in this process
_GO_BUILT = BuiltOnce()


def _go_build(image: ElfImage, cache: str):
    from ..objfile.gopclntab import PclntabError, go_table
    try:
        table = go_table(image)
    except PclntabError:
        return None
    if table is None:
        return None
    packed = pack(image.path, sorted_rows(go_rows(table, image.file.read)))
    if packed is not None:
        objcache.write(cache, packed.data)
    return packed


def sorted_rows(rows: list) -> list:
    """Rows in address order, the later of two at one address kept."""
    out: dict = {}
    for vaddr, row in rows:
        out[vaddr] = row
    return sorted(out.items())
