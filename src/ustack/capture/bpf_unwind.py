"""The in-kernel DWARF unwinder: BPF programs that walk a user stack with
per-object unwind rows (unwind/tables.py) and count each distinct stack
(count, profile) or write it to a ring buffer (trace), so nothing but
frame addresses leaves the kernel. The walk is C (src/ustack/bpf/unwind.h,
shared with off-CPU's and latency's programs), the programs unwind.bpf.c's;
this module makes their maps, loads them and the objects' rows, and reads
what they leave.

How the program finds its way, per frame (one bpf_loop step each: the
verifier checks the body once, not once per frame):
- the mapping of the pc: bpf_find_vma (the task's own VMA tree, so no
  per-process list has to be kept in step with mmap), which gives the
  file's (dev, inode), the mapping's start and page offset. Its answers are
  kept in VMAS, keyed by (mm ctx_id, 2 MiB region): in a sample's interrupt
  find_vma answers once, then says the mm is busy until the interrupt
  ends. Consecutive frames in one mapping skip both;
- the object's rows: OBJECTS[(dev, inode)] = (first row, rows, vaddr -
  file offset of its code, its page index), loaded by UnwindObjects
  (unwind_objects.py) from user space, once per object whichever
  processes map it; a binary search over the rows of the pc's 4 KiB page
  (PAGES) finds the row;
- the rule: CFA = rsp|rbp + N (or the PLT's), return address at CFA - 8,
  rbp restored per the row; a sigreturn trampoline continues from the
  ucontext the kernel saved on the stack. Stack words come from a 512-byte
  window copied at once (a user copy's checks cost as much as its bytes).
Where the walk cannot go on (no rows for an object yet, code without a
file, a rule the rows do not encode, an unreadable stack) it stops and
says why in the stack's status: the capture turns that into a marker word
at the end of the callchain (model.KERNEL_UNWIND_STOP), the unwind stage
into a note on the stack. Never a guessed frame. A kernel thread (no mm)
has an empty user stack.

Deferred stacks: an object mapped during the run has no rows until user
space reads its MMAP2 record (5-20 ms later; a short program's every
event), a sample's interrupt may find the memory map locked, and an
object's rows may not fit the table (ROWS grows in chunks up to a bound
sized by what the targets map, or --unwind-memory: rows_capacity,
row_chunks.py). Such a walk (status
NO_TABLE, VMA_BUSY or TABLE_FULL) is not counted cut: given a ring, the
program writes the event's registers and stack there (a DEFERRED record) and ustack
unwinds it as the copy path's samples (ring_samples makes it a DWARF
RawSample), once the MMAP2 records told it the mappings. Only where the
ring is full does the stack end cut, as walked. So goes a walk through a
JVM's JIT code (its compiled code keeps no frame pointer: its Java frames
are walked in user space, unwind/hotspot_live.py), in a process in
JVM_PROCESSES (add_jvm: found mapping libjvm) or whose walk met libjvm;
another process's JIT code is walked on its frame pointer in the kernel.

Registers: a uprobe's context is the user pt_regs; a sample's context holds
them when it interrupted user mode; otherwise (syscalls, tracepoints, a
sample in the kernel) bpf_task_pt_regs(current) gives them.

Output: STACKS[hash] = (frame count, status, frames) and COUNTS[(pid_tgid,
probe, kernel stack id, hash)] += 1; the hash is a 64-bit FNV-style mix of
the frames and status, so the count key stays 24 bytes however deep the
stack. For trace, RECORD + frames per event into a BPF ring buffer; a
deferred record is RECORD (no frames, status DEFERRED) + DEFER + the
stack, in trace's ring or count/profile's own."""
from __future__ import annotations

import os
import re
import shlex
import struct
from collections.abc import Callable

from ..kernel import bpf_syscall
from ..kernel import perf_event as pe
from ..kernel import procfs
from ..kernel.bpf_syscall import RING_RECORD_HEADER, ring_next
from ..model import (KERNEL_UNWIND_STOP, OTHER_AT, OTHER_STACK, ProfileProbe,
                     RawSample, TracepointProbe, python_sample,
                     UprobeProbe, UstackError)
from ..objfile import cache as objcache
from ..objfile import needed
from ..objfile.mapped import object_path
from .. import bpf as bpf_programs
from ..target import process
from .bpf_counter import (MIN_COUNT_ENTRIES, BpfCounter, InBackground, program_result,
                          prog_type_of)
from .fork_safe_lock import ForkSafeLock
from .bpf_common import unwind_object
from .row_chunks import RowChunks
from .runtime_objects import RuntimeObjects
from .unwind_objects import LIBJVM, ROW_SIZE, TableSource, UnwindObjects, object_keys
from .runtime_passes import RuntimePasses
from .kernel_offsets import Offsets
from ..probes.weight import WEIGHT_ARG, as_s64


_OBJ = unwind_object()
MAX_FRAMES = 128                 # ustack.h: a power of two, the frame index is masked
STACK_HEAD = _OBJ.layout("stack_head").struct     # frames, status
# a trace record: time (CLOCK_MONOTONIC ns), pid_tgid, probe, cpu, then STACK_HEAD
RECORD = _OBJ.layout("trace_record").struct
# a deferred record (RECORD with no frames, status DEFERRED), then the
# event's ip, sp, bp, bx, kernel stack id, bytes of stack copied, its weight
# (count --weight), where rbp left the copy (a frame on another stack) and
# the bytes copied from there; then the copy from sp and the one from rbp
# after it. A fixed-size record has room for DEFER_STACK + SWITCH_STACK
# bytes of copies (fetch-args after them); count/trace's ring holds a record
# as long as its copies (unwind.bpf.c's defer)
_DEFERRED = _OBJ.layout("deferred_record")
_TOKENS = dict(zip(_DEFERRED.fields, re.findall(r"\d*[a-zA-Z?]", _DEFERRED.struct.format[1:])))
DEFER = struct.Struct("<" + "".join(_TOKENS[f] for f in ("ip", "sp", "bp", "bx", "kernel_stack",
                                                          "copied", "weight", "other",
                                                          "other_copied")))
SWITCH_STACK = 2048              # ustack.h: bytes copied from rbp on another stack, at most
DEFER_STACK_AT = _DEFERRED.offsets["stack"]
DEFER_STACK = _DEFERRED.size - DEFER_STACK_AT - SWITCH_STACK
DEFER_RECORD = _DEFERRED.size
MAX_DEFER_STACK = 65536          # ustack.h: a deferred record's stack, at most
DEFER_RING_BYTES = 4 << 20       # count/profile's ring of deferred records (400-7,000)
# A -c command's first events all come before its rows are in (built after
# it starts): a probe hit a thousand times in its first milliseconds is a
# thousand deferred records at once: ~600 bytes each for a C program's main
# thread (its copy ends at the first sp of the process), up to ~10 KiB
# where the stack is deeper. Room for thousands of those costs ~5 ms more
# to make than 4 MiB.
COMMAND_DEFER_RING_BYTES = 16 << 20
COUNT_KEY = _OBJ.layout("unwind_count_key").struct  # pid_tgid, probe, kernel stack id, hash
_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")

# why a walk stopped (enum unwind_status); COMPLETE is a whole stack
_STATUS = _OBJ.enum("unwind_status")
COMPLETE, READ_FAILED = (_STATUS[name] for name in ("COMPLETE", "READ_FAILED"))
# not a stack: a ring record naming a Python code object seen first (python.h)
PYTHON_CODE = _STATUS["PYTHON_CODE"]
PYTHON_CHAIN = 0x50             # bpf/python.h: a deferred sample's Python frames
PY_NEW_CODES = 32                # python.h: code objects a record names, at most
# struct python_code_entry: address, id, identity, first line, the name's
# and file's lengths, their first 64 and last 96 characters
CODE_ENTRY = struct.Struct("<QQQiHH64s96s")
CODE_RECORD_SIZE = RECORD.size + CODE_ENTRY.size * PY_NEW_CODES    # struct python_code_record
# a deferred record's status: the stack goes to user space to be unwound
DEFERRED = _STATUS["DEFERRED"]
_RUNNING = _STATUS["RUNNING"]

# slots of the errors map (enum unwind_error)
_ERRORS = _OBJ.enum("unwind_error")
ERR_RING_FULL, ERR_UNDEFERRED = _ERRORS["UW_RING_FULL"], _ERRORS["UW_UNDEFERRED"]
_STACKS_ADDED = _ERRORS["UW_STACKS_ADDED"].to_bytes(4, "little")
ERR_SLOTS = _ERRORS["UNWIND_ERROR_SLOTS"]


def keep_deferred(samples: list, deferred: dict, fresh: list) -> None:
    """The deferred records ring_samples made (weighted: their id is the
    weight it read) kept in `deferred` (id -> RawSample of the copy, its
    probe the record's), their ids added to `fresh` for unwind_fresh."""
    for s in samples:
        if s.regs is not None and s.args:
            record_id = s.args[0][2] & (1 << 64) - 1
            deferred[record_id] = RawSample(s.probe, s.pid, s.tid, s.time_ns, s.cpu,
                                            regs=s.regs, stack=s.stack)
            fresh.append(record_id)


def unwind_fresh(deferred: dict, fresh: list, unwind) -> int:
    """The deferred records whose ids are in `fresh` (then emptied),
    unwound now in `deferred` (id -> sample), while their processes live: a
    JVM's Java frames are read from its memory (unwind/hotspot_live.py),
    gone by the report once a -c command has exited. `unwind(sample)`: its
    UnwoundSample. Returns the bytes of stack copies let go."""
    freed = 0
    for record_id in fresh:
        s = deferred.get(record_id)
        if s is not None and s.regs is not None:
            deferred[record_id] = unwind(s)
            freed += len(s.stack)
    fresh.clear()
    return freed


def deferral_ring_bytes(buffer_pages: int, stack_size: int = DEFER_STACK,
                        command: bool = False) -> int:
    """count/profile's ring of deferred stacks: DEFER_RING_BYTES, more as
    --buffer-pages grows, room for 256 records of `stack_size` bytes of
    stack (--stack-size); a power of two. A -c `command`'s holds its first
    burst: COMMAND_DEFER_RING_BYTES."""
    want = max(DEFER_RING_BYTES, buffer_pages * 4096 * 4,
               256 * (DEFER_RECORD - DEFER_STACK + defer_stack_bytes(stack_size)),
               COMMAND_DEFER_RING_BYTES if command else 0)
    return 1 << (want - 1).bit_length()


def defer_stack_bytes(stack_size: int) -> int:
    """The stack bytes a deferred record in the ring carries for a run
    whose --stack-size is `stack_size` (as unwind.bpf.c bounds it)."""
    return min(MAX_DEFER_STACK, max(DEFER_STACK, stack_size // 8 * 8))


# --- the maps, and the objects loaded into them --------------------------------

class UnwindMaps(bpf_syscall.MapSet):
    """The unwinder's maps; `rows_bound` bounds the rows of every object
    together (16 bytes each; the table grows in chunks up to it:
    row_chunks.py), `stacks` the distinct stacks. `deferring`:
    with the room where unwind.bpf.c writes a deferred record (its
    programs use it; latency's and memleak's, which reserve fixed-size
    records, do not)."""

    def __init__(self, rows_bound: int, stacks: int, counts: int,
                 objects: int = 4096, vmas: int = 16384, pages_capacity: int = 1 << 18,
                 wanted: int = 1024, jvms: int = 1024, deferring: bool = True):
        super().__init__()
        # the kernel zeroes the rows' first chunk on the other CPU while
        # this thread makes the rest, and the run sets up the rest: see rows
        obj = unwind_object()
        self._rows_job = InBackground(RowChunks, obj, rows_bound)
        self._rows = None
        self._rows_lock = ForkSafeLock()     # the program's thread or this one
        try:
            self.pages = self._keep(obj.make_map("pages", pages_capacity))
            self.objects = self._keep(obj.make_map("objects", objects))
            self.vmas = self._keep(obj.make_map("vmas", vmas))
            self.wanted = self._keep(obj.make_map("wanted", wanted))
            self.epoch = self._keep(obj.make_map("epoch"))
            self.scratch = self._keep(obj.make_map("scratch"))
            # a deferred record is written here before its used part goes
            # to the ring: one ~68 KiB value per CPU
            self.deferred_room = self._keep(obj.make_map(
                "deferred_room", bpf_syscall.possible_cpus())) if deferring else None
            self.jvms = self._keep(obj.make_map("jvm_processes", jvms))
            # elements made as stacks come (Linux 6.1+ lets tracing programs
            # use such maps): preallocating 16 MiB cost ~3.5 ms of start-up;
            # the counts too, so their room costs only what a run meets
            on_demand = bpf_syscall.F_NO_PREALLOC if bpf_syscall.kernel_at_least(6, 1) else 0
            self.stacks = self._keep(obj.make_map("unwound", stacks, flags=on_demand))
            self.counts = self._keep(obj.make_map("counts", counts, flags=on_demand))
            self.errors = self._keep(obj.make_map("unwind_errors"))
        except BaseException:
            self.close()
            raise

    def _keep(self, m: bpf_syscall.Map) -> bpf_syscall.Map:
        self.all.append(m)
        return m

    def named(self) -> dict:
        """The maps by the names unwind.bpf.c gives them."""
        return {"row_chunks": self.rows.outer, "pages": self.pages, "objects": self.objects,
                "vmas": self.vmas, "wanted": self.wanted, "epoch": self.epoch,
                "scratch": self.scratch,
                "unwound": self.stacks, "counts": self.counts, "unwind_errors": self.errors,
                "jvm_processes": self.jvms,
                **({"deferred_room": self.deferred_room} if self.deferred_room else {})}

    @property
    def rows(self) -> RowChunks:
        """The rows' table, waited for at first use (a program's code or an
        object's rows), so the maps' other users are set up meanwhile."""
        with self._rows_lock:
            if self._rows is None:
                self._rows = self._rows_job.result()
                self.all.append(self._rows)
        return self._rows

    def close(self) -> None:
        if self._rows is None:              # never asked for: still made, or failed
            made = self._rows_job.result(quiet=True)
            if made is not None:
                made.close()
            self._rows = False              # closed; never made again
        super().close()

def stack_chain(maps: UnwindMaps, h: int) -> bytes:
    """The callchain (u64 frames, a cut stack's marker last) stored in
    STACKS under hash `h`."""
    raw = maps.stacks.lookup(_U64.pack(h))
    if raw is None:
        return _U64.pack(KERNEL_UNWIND_STOP + READ_FAILED)
    n, status = STACK_HEAD.unpack_from(raw)
    n = min(n, MAX_FRAMES)
    chain = bytes(raw[STACK_HEAD.size:STACK_HEAD.size + 8 * n])
    if status != COMPLETE:
        chain += _U64.pack(KERNEL_UNWIND_STOP + status)
    return chain


def jvm_processes(pids) -> list:
    """Of `pids`, those that map a libjvm now (their maps' text searched,
    not parsed: most processes map none)."""
    found = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps") as f:
                if "/" + LIBJVM + "\n" in f.read():
                    found.append(pid)
        except OSError:
            continue
    return found


def objects_of_target(target, probes: list, running: bool = True) -> list:
    """Host paths of the objects to load before the run starts: what the
    traced process maps now (-p), what a launched command will map before
    main() (-c: its executable's load closure), what every process maps
    (system-wide, unless not `running`: then loaded as sampled); plus the
    probed binaries."""
    paths: list = [p.path for p in probes if isinstance(p, UprobeProbe)]
    if target.scope == "command":
        for exe in _programs_named(target.argv):
            paths += needed.load_closure(exe)
    pids = [target.pid] if target.scope == "pid" else (
        procfs.pids() if target.scope == "system" and running else [])
    if target.scope == "system" and not running:
        pids = processes_mapping(paths)
    for pid in pids:
        for m in procfs.executable_mappings(pid):
            path = object_path(m)
            if path is not None:
                paths.append(path)
    return list(dict.fromkeys(paths))


MAX_EAGER_PROCESSES = 16         # processes whose objects load before a lazy run starts


# the interpreters whose frames the walk merges through their objects' rows
INTERPRETERS = ("python", "ruby", "php", "perl")
_INTERPRETER_NAMES = tuple(p + n for n in INTERPRETERS for p in ("", "lib"))


def interpreters_objects(mapped: dict) -> list:
    """The objects every stack of a running Python, Ruby, PHP or Perl goes
    through (interpreter_paths), of each process that maps one of those
    interpreters' objects now: a system-wide run that loads rows as objects
    are sampled loads these first, as it starts (lazy_rows.py); until
    then a script's samples go to user space, which keeps its VM's C frames. The walk meets a process's objects one at a time (it
    stops at the first without rows), so a busy Python's stacks went to
    user space for three rounds of want-and-load (libpython, libc, the
    executable: ~50 ms, 5-9 % of its samples in a 1 s run), and its Python
    frames, read from the live process after the sample, often no longer
    matched them. `mapped`: pid -> its objects' paths, as
    lazy_rows.ObjectPaths.scan read them."""
    return list(dict.fromkeys(p for paths in mapped.values() for p in interpreter_paths(paths)))


def interpreter_paths(paths: list) -> list:
    """Of a process's object paths (its executable first, as its maps
    list it), those each of its stacks goes through when it runs an
    interpreter: its executable, the interpreter's objects (libpython,
    libruby...), libc; none if it maps no interpreter's object."""
    names = [os.path.basename(p) for p in paths]
    if not any(n.startswith(_INTERPRETER_NAMES) for n in names):
        return []
    return [p for i, (p, n) in enumerate(zip(paths, names))
            if i == 0 or n.startswith((*_INTERPRETER_NAMES, "libc.so"))]


def processes_mapping(paths: list) -> list:
    """The processes that map one of the objects at `paths` now, if at
    most MAX_EAGER_PROCESSES do, else none. A system-wide run that loads
    rows as objects are sampled loads theirs before it starts: their
    events come first and at the probes' rate, faster than the loader
    (a container's libc, a copy no other process maps: 95 % of 20,000
    uprobe hits cut when the deferral ring filled first). A probe on a
    library every process maps (libc) is left to the loader."""
    keys = {k for p in paths for k in object_keys(p)}
    names = {os.path.basename(p) for p in paths}    # a stat only where the name is one
    if not keys:
        return []
    found = []
    for pid in procfs.pids():
        for m in procfs.executable_mappings(pid):
            if os.path.basename(m.path) not in names:
                continue
            path = object_path(m)
            if path is not None and not keys.isdisjoint(object_keys(path)):
                found.append(pid)
                break
        if len(found) > MAX_EAGER_PROCESSES:
            return []
    return found


def _programs_named(argv: list) -> list:
    """The command's executable, and the ELF programs its words name (the
    X of `sh -c 'exec X …'`): a program exec'd later than the run's start
    is unwound through only once its rows are loaded, which the MMAP2
    record does too late for its first events."""
    found = [process.executable(argv)]
    for arg in argv[1:]:
        try:
            words = shlex.split(arg)
        except ValueError:
            continue
        for word in words:
            path = word if word.startswith("/") else (
                process.which(word) if "/" not in word and word.isidentifier() else None)
            if path and os.path.isfile(path) and _is_elf(path):
                found.append(path)
    return [p for p in dict.fromkeys(found) if p]


def _is_elf(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


# --- the counter: BpfCounter's events and attachment, this program -------------

DEFAULT_ROWS = 1 << 20            # the table's least bound, 16 MiB: libc is 28 k rows
# the most the table takes unless --unwind-memory says otherwise, for a
# target or the whole machine: clang++'s libLLVM and libclang-cpp are ~1 M
# rows each (16 MiB); a machine running clang++, chromium, node and java
# maps ~6 M rows' worth (bench/results/machine_rows.md)
MAX_UNWIND_MEMORY = 256 << 20
# rows per byte of an object's .eh_frame (.debug_frame): 0.16-0.20 measured
# on libc, libstdc++, python3.11, libLLVM-14, libclang-cpp-14
ROWS_PER_CFI_BYTE = 0.25


def rows_estimate(path: str) -> int:
    """About how many rows the object at `path` takes, from the size of
    its CFI (a few header reads, not the CFI itself); 0 unreadable."""
    from ..objfile.on_disk import OnDisk
    try:
        sections = OnDisk.of(path).sections
    except UstackError:
        return 0
    cfi = max((sections[n].size for n in (".eh_frame", ".debug_frame") if n in sections),
              default=0)
    return int(cfi * ROWS_PER_CFI_BYTE)


def rows_capacity(paths: list, memory: int | None = None, ahead: list = ()) -> int:
    """How many rows the run's table may hold (its bound: the table is
    made in chunks as objects are loaded, row_chunks.py): `memory` bytes'
    worth when the user set it (--unwind-memory), else what the objects at `paths`
    take and half the least size again for what they map later, never
    less than DEFAULT_ROWS, and what the objects at `ahead` take (loaded
    before the run though it would load them as sampled: the room for
    those sampled stays), never more than MAX_UNWIND_MEMORY."""
    if memory is not None:
        return max(1, memory // ROW_SIZE)
    from ..objfile.on_disk import OnDisk
    OnDisk.read_all([*paths, *ahead])
    need = sum(rows_estimate(p) for p in paths) + DEFAULT_ROWS // 2
    return min(max(DEFAULT_ROWS, need) + sum(rows_estimate(p) for p in ahead),
               MAX_UNWIND_MEMORY // ROW_SIZE)
COUNTS_PER_STACK = 16             # count keys per STACKS entry (see KernelUnwinder)


class KernelUnwinder(BpfCounter):
    """The unwinder's maps and programs, counting the stacks it walks or
    (`trace`) writing a record per event; attaches like BpfCounter (one
    program per trace event, one per sampling event). `ring_bytes`: a ring
    of that size, where the programs defer the stacks they cannot unwind
    yet (_defer); with `trace`, where they write every event's record
    instead of counting it; `fetches`: per probe, its fetch-args
    (bpf_fetchargs.FetchArgs) or None, written into trace's records."""

    def __init__(self, probes: list, owned, tables: TableSource, *,
                 stack_storage: int, kernel: bool = False, filter_tgid=None, armed=None,
                 rows: int = DEFAULT_ROWS, ring_bytes: int = 0, trace: bool = False,
                 fetches: tuple = (), python: bool = False, weighted: bool = False,
                 linked: frozenset = frozenset(), js: bool = False, php: bool = False,
                 stack_size: int = DEFER_STACK, perl: bool = False, ruby: bool = False):
        self._no_maps_yet(probes, owned, kernel, armed)
        self.linked = linked            # behind uprobe_multi links (uprobe_links.linked)
        self.verified: dict = {}         # probe index -> instructions the verifier processed
        self.fetches = tuple(fetches)
        self.defer_stack = defer_stack_bytes(stack_size)   # a deferred record's stack bytes
        self._deferred = None            # trace's deferred records' scratch (_fetch_maps)
        self.python = None               # bpf_python.PythonProcs: Python frames in stacks
        self.v8 = None                   # bpf_v8.V8Objects: JS frames named in stacks
        self.php = None                  # bpf_php.PhpObjects: PHP frames in stacks
        self.perl = None                 # bpf_perl.PerlObjects: Perl frames merged into stacks
        self.ruby = None                 # bpf_ruby.RubyObjects: Ruby frames in stacks
        # the stacks spill to user space as STACKS fills (spill), so their
        # counts may be many more than it holds: room for COUNTS_PER_STACK
        # each where entries are taken only as the run meets them (~80
        # bytes each; Linux 6.1+), else preallocated as before
        per_stack = COUNTS_PER_STACK if bpf_syscall.kernel_at_least(6, 1) else 2
        self.trace = trace and bool(ring_bytes)
        stacks, counts = stack_storage, max(MIN_COUNT_ENTRIES, per_stack * stack_storage)
        if self.trace:      # each stack goes to the ring: none is kept, none counted
            stacks = counts = 1         # (the programs declare them; their room costs ~1 ms)
        self.unwind_maps = owned.map(UnwindMaps(rows, stacks, counts))
        owned.error_counters(self.unwind_maps.errors, _ERRORS)
        self.kstacks = None
        if kernel:          # kernel stacks: bpf_get_stackid, read by stack_bytes()
            self.max_depth = max(1, min(pe.max_stack(), 127))
            self.kstacks = self.stacks = owned.map(bpf_syscall.Map(
                bpf_syscall.MAP_STACK_TRACE, 4, 8 * self.max_depth, stack_storage,
                "ustack_kstacks"))
        if ring_bytes:
            self.ring = owned.ring(bpf_syscall.RingBuf(ring_bytes, "ustack_uwring"))
        self.objects = UnwindObjects(self.unwind_maps, tables)   # rows: open()
        self.spilled: dict = {}          # hash -> callchain: stacks moved out of STACKS
        self._taken = 0                  # stacks deleted from STACKS by spill()
        # the runtimes' objects made as the run meets them (python: new
        # code objects come by the ring)
        wanted = [runtime for runtime, asked in (("python", python and ring_bytes), ("v8", js),
                                                 ("php", php), ("perl", perl), ("ruby", ruby))
                  if asked]
        self.runtimes = RuntimeObjects(self, wanted)
        # the runtimes' passes loaded as the run meets them, but where a
        # probe has fetch-args (its own program array ends its records):
        # then verified in each program, as the run starts, with the
        # runtimes' maps
        self.passes = None
        if wanted and not any(f is not None for f in self.fetches):
            self.passes = self.objects.passes = RuntimePasses(self.owned, self._pass_program)
        elif wanted:
            self.runtimes.make_all()
        if weighted and not self.trace:
            self.weigh(unwind_object())
        self.follow_if_traced(filter_tgid)

    def _program(self, index: int, probe) -> int:
        fetch = self.fetches[index] if self.trace and index < len(self.fetches) else None
        fetch_maps = self._fetch_maps() if fetch is not None else {}
        fd = load_program(
            "unwind_trace" if self.trace else "unwind_count", self.unwind_maps, index, probe,
            kernel_stacks=self.kstacks, ring=self.ring,
            armed=None if isinstance(probe, ProfileProbe) else self.armed,
            tgids=self.tgids if isinstance(probe, TracepointProbe) else None,
            fetch=fetch_maps, **self._walk_runtime_maps(),
            weights=self.weighing.weights if self.weighing else None,
            passes=self.passes.array_for(probe) if self.passes else None,
            defer_stack=self.defer_stack, name=f"ustack_uw{index}")
        self.owned.program(fd)
        try:
            self.verified[index] = bpf_syscall.verified_insns(fd)
        except OSError:
            pass
        if fetch is not None:
            self._load_fetch(index, probe, fetch, fetch_maps)
        return fd

    def _linked_kind(self, probe):
        return None                     # one program for every linked uprobe

    def _linked_program(self, probe) -> int:
        """The program of every linked uprobe: the probe is the cookie (the
        links keep to the traced process: uprobe_links)."""
        fd = load_program(
            "unwind_trace" if self.trace else "unwind_count", self.unwind_maps, 0, probe,
            kernel_stacks=self.kstacks, ring=self.ring, armed=self.armed, by_cookie=True,
            **self._walk_runtime_maps(),
            passes=self.passes.array_for(probe, True) if self.passes else None,
            defer_stack=self.defer_stack, name="ustack_uwlinks")
        return self.owned.program(fd)

    def _runtime_maps(self) -> dict:
        """The runtimes' maps, as load_program takes them."""
        return {"python": self.python.maps if self.python else None,
                "v8": self.v8.maps if self.v8 else None,
                "php": self.php.maps if self.php else None,
                "perl": self.perl.maps if self.perl else None,
                "ruby": self.ruby.maps if self.ruby else None}

    def _walk_runtime_maps(self) -> dict:
        """The runtimes' maps for a walk's program: none where the passes
        are programs of their own (the loader stands a one-entry map in
        for each its code names), so a run makes a runtime's maps only
        when it meets the runtime."""
        return {} if self.passes is not None else self._runtime_maps()

    def _pass_program(self, program: str, passes: bpf_syscall.Map, probe,
                      by_cookie: bool) -> int:
        """A runtime's pass program (runtime_passes.PASS_PROGRAMS) for the
        walk programs of `probe`'s kind, which reach it through `passes`."""
        return self.owned.program(load_program(
            program, self.unwind_maps, 0, probe, kernel_stacks=self.kstacks, ring=self.ring,
            **self._runtime_maps(), passes=passes, tracing=self.trace,
            defer_stack=self.defer_stack, name=f"ustack_{program}"[:15],
            attach_type=bpf_syscall.TRACE_UPROBE_MULTI if by_cookie else None))

    def _fetch_maps(self) -> dict:
        """A probe's array of fetch-args programs; the deferred records'
        scratch, shared by the probes."""
        obj = unwind_object()
        if self._deferred is None:
            self._deferred = self.owned.map(obj.make_map("deferred_scratch"))
        progs = self.owned.map(obj.make_map("fetch_args"))
        return {"fetch_args": progs, "deferred_scratch": self._deferred}

    def _load_fetch(self, index: int, probe, fetch, maps: dict) -> None:
        """The probe's fetch-args programs (bpf_fetchargs.tail_programs),
        where its trace program goes on."""
        obj = unwind_object()
        walk = obj.layout("walk").offsets
        slots = obj.enum("fetch_slot")
        contract = fetch.contract(
            scratch=self.unwind_maps.scratch, deferred=maps["deferred_scratch"],
            ring=self.ring, errors=self.unwind_maps.errors, fetch_args=maps["fetch_args"],
            record_at=walk["rec.time"], record_size=RECORD.size,
            frames_count_at=walk["rec.head.frames"], frames_at=walk["frame"],
            max_frames=MAX_FRAMES, deferred_size=DEFER_RECORD, ring_full=ERR_RING_FULL,
            undeferred=ERR_UNDEFERRED, stream_slot=slots["FETCH_STREAM"],
            result=program_result(probe))
        codes = fetch.tail_programs(contract, Offsets.of_this_kernel())
        for slot, (code, functions) in zip(("FETCH_STREAM", "FETCH_DEFERRED"), codes):
            fd = self.owned.program(bpf_syscall.load_program(prog_type_of(probe), code,
                                                     f"ustack_fa{index}", functions=functions))
            maps["fetch_args"].update(slots[slot].to_bytes(4, "little"),
                                      fd.to_bytes(4, "little"))

    def unwound(self, reset: bool = False) -> list:
        """(pid, tid, probe, callchain bytes, kernel stack id, count) of every
        stack counted; a stack cut short ends with its reason's marker."""
        found: dict = {}
        out = []
        for k, v in self.unwind_maps.counts.items(take=reset):
            pid_tgid, probe, kstack, h = COUNT_KEY.unpack(k)
            chain = found.get(h)
            if chain is None:
                chain = found[h] = self._chain(h)
            out.append((pid_tgid >> 32, pid_tgid & 0xFFFFFFFF, probe, chain, kstack,
                        _U64.unpack(v)[0]))
        return out

    def _chain(self, h: int) -> bytes:
        spilled = self.spilled.get(h)       # (the same frames as STACKS' copy)
        return spilled if spilled is not None else stack_chain(self.unwind_maps, h)

    def spill(self) -> None:
        """Once STACKS is half full, move its stacks to `spilled`, so that
        a run meeting more distinct stacks than STACKS holds (a sort's
        comparator: ~20,000) counts every event (called every few ms by the
        capture's reader). The counts keep their stacks' hashes: a program
        that finds a stack gone stores it again, and a count whose stack
        was moved finds it here. Only what fills STACKS between two calls
        is lost (UW_STACKS_FULL, reported)."""
        maps = self.unwind_maps
        raw = maps.errors.lookup(_STACKS_ADDED)
        added = _U64.unpack(raw)[0] if raw is not None else 0
        if added - self._taken < maps.stacks.max_entries // 2:
            return
        for k in maps.stacks.keys():
            h = _U64.unpack(k)[0]
            if h not in self.spilled:
                self.spilled[h] = stack_chain(maps, h)
            maps.stacks.delete(k)
            self._taken += 1


def regs_source(probe) -> str:
    """Where the program finds the event's user registers (enum regs_source)."""
    if isinstance(probe, UprobeProbe):
        return "REGS_CTX"
    return "REGS_SAMPLE" if isinstance(probe, ProfileProbe) else "REGS_TASK"


def kernel_rodata(offsets: Offsets, maps: UnwindMaps) -> dict:
    """unwind.h's .rodata: the kernel field offsets, from this kernel's
    BTF, and the run's row table's chunk size (`maps`')."""
    return {**{name: getattr(offsets, name) for name in (
        "task_mm", "mm_ctx_id", "mm_vdso", "mm_start_stack", "vm_start", "vm_end", "vm_pgoff",
        "vm_file", "vm_mm", "f_inode", "i_ino", "i_sb", "s_dev")}, **maps.rows.rodata()}


def load_program(program: str, maps: UnwindMaps, index: int, probe, *, kernel_stacks=None,
                 ring=None, armed=None, tgids=None, fetch: dict | None = None,
                 python=None, weights=None, name: str = "ustack_uw",
                 by_cookie: bool = False, v8=None, php=None,
                 defer_stack: int = DEFER_STACK, perl=None, ruby=None, passes=None,
                 tracing: bool = False, attach_type: int | None = None) -> int:
    """unwind.bpf.c's `program` for probe `index` (its fd): unwind_count
    counts each stack, unwind_trace writes each to `ring`; `ring`: where a
    walk that ended DEFERRABLE goes. `fetch`: the fetch_args and
    deferred_scratch maps of a probe with fetch-args (trace); `python`:
    python.h's maps (bpf_python.PythonMaps), to merge Python frames; `v8`:
    v8.h's (bpf_v8.V8Maps), to name JS frames; `php`: php.h's
    (bpf_php.PhpMaps), to merge PHP frames; `perl`: perl.h's
    (bpf_perl.PerlMaps), to merge Perl frames; `ruby`: ruby.h's
    (bpf_ruby.RubyMaps), to merge Ruby frames;
    `passes`: the PASSES array (runtime_passes.py) through which the
    program goes on in the passes of the runtimes given, none of them
    verified in it; `tracing`: a pass program ends as unwind_trace does;
    `attach_type`: a pass program's, its walk programs' (by_cookie's);
    `weights`: count --weight's map (bpf_weight.py), whose value each
    event adds in place of 1; `by_cookie`: for uprobe_multi links, whose
    cookie names the probe; `defer_stack`: the stack bytes a deferred
    record in the ring carries (defer_stack_bytes)."""
    obj = unwind_object()
    named = maps.named()
    if python is not None:
        named.update(python.named())
    if v8 is not None:
        named.update(v8.named())
    if php is not None:
        named.update(php.named())
    if perl is not None:
        named.update(perl.named())
    if ruby is not None:
        named.update(ruby.named())
    for key, m in (("kernel_stacks", kernel_stacks), ("ring", ring), ("armed", armed),
                   ("tgids", tgids), ("weights", weights), ("passes", passes),
                   *(fetch or {}).items()):
        if m is not None:
            named[key] = m
    bits = obj.enum("unwind_option")
    inline = passes is None              # the passes verified in this program
    wanted = {"UW_ONLY_TRACED": tgids is not None, "UW_WAIT_FOR_EXEC": armed is not None,
              "UW_KERNEL_STACK": kernel_stacks is not None, "UW_DEFER": ring is not None,
              "UW_FETCH_ARGS": bool(fetch), "UW_PYTHON": inline and python is not None,
              "UW_WEIGHT": weights is not None, "UW_V8": inline and v8 is not None,
              "UW_PHP": inline and php is not None,
              "UW_PERL": inline and perl is not None,
              "UW_RUBY": inline and ruby is not None, "UW_PASS_CALLS": not inline}
    if program in _WALKS and not any(wanted[k] for k in _INLINE_PASSES):
        program += "_lean"              # no runtime's pass inline: none linked in
    before = set(named)
    try:
        return obj.load(program, named, {
            "probe_index": index, "result": program_result(probe),
            "options": sum(bits[k] for k, on in wanted.items() if on),
            "regs_source": obj.enum("regs_source")[regs_source(probe)],
            "probe_by_cookie": int(by_cookie), "defer_stack": defer_stack,
            "tracing": int(tracing),
            "task_fsbase": Offsets.of_this_kernel().task_fsbase,
            **kernel_rodata(Offsets.of_this_kernel(), maps)}, prog_type_of(probe), name,
            bpf_syscall.TRACE_UPROBE_MULTI if by_cookie else attach_type)
    finally:
        for key in set(named) - before:      # declared maps a probe does not use
            named[key].close()


# the walk's programs, and the options that run a runtime's pass inside them
_WALKS = ("unwind_count", "unwind_trace")
_INLINE_PASSES = ("UW_PYTHON", "UW_V8", "UW_PHP", "UW_PERL", "UW_RUBY")


class RingChunk(bytes):
    """Records read from the unwinder's ring (RingBuf.read), told apart
    from the perf buffers' chunks in the capture's stream."""


def ring_samples(chunk: bytes, samples: list, offset: int, limit: int,
                 kernel_stack: Callable[[int], bytes] = lambda _id: b"",
                 fetches: tuple = (), read_file=None, python_code=None,
                 cut: Callable[[bytes], None] | None = None,
                 weighted: bool = False, python_read=None, python_chain=None) -> int:
    """Append a RawSample per record of a RingChunk from `offset`, for
    about `limit` bytes; returns the offset reached. A deferred record
    becomes a DWARF sample (regs and stack, as the copy path's), its
    kernel frames from `kernel_stack(id)`. `fetches[probe]` decodes the
    values of the probe's fetch-args, which end each record (`read_file`:
    see bpf_fetchargs.FetchArgs.decode). A record naming Python code
    objects given an id goes to `python_code` (code_entries), not to
    the samples. `cut(callchain)` hears of each stack the walk cut short.
    `weighted` (count --weight): a deferred record's weight is its
    sample's one arg, as the perf path's fetch-arg. `python_read(pid,
    tid)`: a deferred sample's thread's Python frames read now
    (unwind/python_live.LiveFrames.read), or None; where it has them the
    sample is a PythonSample, its frames merged where they agree with it;
    `python_chain(pid, tid, time, words)` hears of the Python frames the
    kernel read at a deferred sample (a PYTHON_CHAIN record, before the
    sample's own), which python_read(pid, tid, time) then gives.
    The loop is the
    trace's per-event cost: a plain record is two unpacks and a tuple."""
    end = min(len(chunk), offset + limit)
    length_at, record_at = _U32.unpack_from, RECORD.unpack_from
    head = RING_RECORD_HEADER
    new, append, nfetch = tuple.__new__, samples.append, len(fetches)
    while offset < end:
        n = length_at(chunk, offset)[0]
        rec = offset + head
        t, pid_tgid, probe, cpu, nframes, status = record_at(chunk, rec)
        offset = ring_next(offset, n)
        if status == COMPLETE and probe >= nfetch:          # the common record
            append(new(RawSample, (probe, pid_tgid >> 32, pid_tgid & 0xFFFFFFFF, t, cpu,
                                   chunk[rec + RECORD.size:rec + RECORD.size
                                         + 8 * min(nframes, MAX_FRAMES)],
                                   b"", None, None, (), b"")))
            continue
        if status == PYTHON_CODE:         # nframes code objects given an id
            if python_code is not None:
                # the record's cpu: the interpreter's version
                code_entries(chunk, rec, n, pid_tgid >> 32, nframes, python_code, cpu)
            continue
        if status == PYTHON_CHAIN:
            if python_chain is not None:
                python_chain(pid_tgid >> 32, pid_tgid & 0xFFFFFFFF, t,
                             chunk[rec + RECORD.size:rec + RECORD.size
                                   + 8 * min(nframes, MAX_FRAMES)])
            continue
        fetch = fetches[probe] if probe < nfetch else None
        if status == DEFERRED:
            ip, sp, bp, bx, kstack, size, weight, other, other_size = DEFER.unpack_from(
                chunk, rec + RECORD.size)
            at = rec + DEFER_STACK_AT
            args = fetch.decode(chunk, rec + DEFER_RECORD, rec + n, read_file) if fetch \
                else ((WEIGHT_ARG, "dec", as_s64(weight)),) if weighted else ()
            regs = {"ip": ip, "sp": sp, "bp": bp, "bx": bx}
            stack = chunk[at:min(at + size, rec + n)]
            if other_size:
                # the unwinder goes on there when a frame switches stacks
                regs[OTHER_STACK] = other
                regs[OTHER_AT] = len(stack)
                stack += chunk[at + size:min(at + size + other_size, rec + n)]
            sample = RawSample(
                probe, pid_tgid >> 32, pid_tgid & 0xFFFFFFFF, t, cpu,
                regs=regs, stack=stack, args=args,
                kernel=kernel_stack(kstack) if kstack >= 0 else b"")
            read = python_read(sample.pid, sample.tid, t) if python_read is not None else None
            append(sample if read is None else python_sample(sample, read))
            continue
        frames_end = rec + RECORD.size + 8 * min(nframes, MAX_FRAMES)
        chain = chunk[rec + RECORD.size:frames_end]
        if status != COMPLETE:
            chain += _U64.pack(KERNEL_UNWIND_STOP + status)
            if cut is not None:
                cut(chain)
        append(RawSample(probe, pid_tgid >> 32, pid_tgid & 0xFFFFFFFF, t, cpu, chain,
                         args=fetch.decode(chunk, frames_end, rec + n, read_file)
                         if fetch else ()))
    return offset


def code_record(chunk: bytes, rec: int, n: int, python_code=None) -> bool:
    """Whether the ring record of `n` bytes at `rec` names Python code
    objects given an id (python.h's python_code_record: a trace record's
    head, status PYTHON_CODE, the interpreter's major << 8 | minor in its
    cpu field, its frame count of entries after it); if so each goes to
    `python_code` (see code_entries)."""
    if n != CODE_RECORD_SIZE:
        return False
    _t, pid_tgid, _probe, version, nframes, status = RECORD.unpack_from(chunk, rec)
    if status != PYTHON_CODE:
        return False
    if python_code is not None:
        code_entries(chunk, rec, n, pid_tgid >> 32, nframes, python_code, version)
    return True


def code_entries(chunk: bytes, rec: int, n: int, pid: int, count: int, python_code,
                 version: int) -> None:
    """Each of the `count` entries of the PYTHON_CODE record of `n` bytes
    at `rec` to `python_code(pid, address, id, identity, copied, version)`:
    copied is (name, file, first line) as the kernel read them, a name or
    file longer than it copies cut with "…" ("" if not copied); version
    the interpreter's major << 8 | minor."""
    for i in range(min(count, (n - RECORD.size) // CODE_ENTRY.size)):
        code, code_id, identity, first, name_len, file_len, name, file = CODE_ENTRY.unpack_from(
            chunk, rec + RECORD.size + CODE_ENTRY.size * i)
        name = name[:name_len].decode("ascii", "replace") + ("…" if name_len > len(name) else "")
        file = ("…" if file_len > len(file) else "") + \
            file[:file_len].decode("ascii", "replace")
        python_code(pid, code, code_id, identity, (name, file, first), version)


_support: dict = {}                  # probe kind -> None | why not (per process)


def why_unavailable(probes: list) -> str | None:
    """None if this kernel loads the unwinder for every kind of probe in
    `probes`, else why not (the verifier's words, or what is missing):
    tried once per kind with small maps, so a refusal is known before the
    run commits to this path."""
    for probe in probes:
        kind = type(probe)
        if kind not in _support:
            _support[kind] = None if _accepted_before(kind) else _try_load(probe)
        if _support[kind] is not None:
            return _support[kind]
    return None


def _verdict_file(kind) -> str:
    """Where this kernel's acceptance of this very program is remembered:
    keyed by the kernel (release, build) and this module and the built
    object as files (a new kernel or a changed program is tried again, ~50
    ms before a run starts); by their identity (device, inode, size, mtime),
    not by hashing their 120 KB, which cost ~0.75 ms a call, twice a run."""
    files = "\0".join(
        f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"
        for st in map(os.stat, (__file__, bpf_programs.object_path("unwind"))))
    key = f"{os.uname().release}\0{os.uname().version}\0{kind.__name__}\0{files}"
    return objcache.cache_file("btf", objcache.digest(key.encode()), "accepted1")


def _accepted_before(kind) -> bool:
    """Whether the verifier took this program on this kernel before."""
    try:
        return objcache.read(_verdict_file(kind)) == b"ok"
    except OSError:
        return False


def _try_load(probe) -> str | None:
    """The program as count/profile load it (deferring to a ring)."""
    maps = ring = None
    try:
        maps = UnwindMaps(16, 16, 16, objects=16, vmas=16, pages_capacity=16)
        ring = bpf_syscall.RingBuf(1 << 14, "ustack_uwtry")
        # the deepest deferred copy a run may ask for: its checks are the hardest
        os.close(load_program("unwind_count", maps, 0, probe, ring=ring, name="ustack_uwtry",
                              defer_stack=MAX_DEFER_STACK))
    except UstackError as e:
        return str(e)
    finally:
        if ring is not None:
            ring.close()
        if maps is not None:
            maps.close()
    try:
        objcache.write(_verdict_file(type(probe)), b"ok")
    except OSError:
        pass
    return None
