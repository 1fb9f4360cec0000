"""What every BPF capture shares: the in-kernel stack counter (BpfCounter),
the programs' return values, the set of traced processes and its
fork-following and exec-arming programs, and the pieces of the run's
background work. BpfCapture (capture/bpf_capture.py) drives a run with
them, one subclass per mode."""
from __future__ import annotations

import struct
import threading

from ..defaults import DEFAULT_STACK_STORAGE
from ..kernel import bpf_syscall
from ..kernel import perf_event as pe
from ..kernel.tracefs import tracepoint_id
from ..interrupt import NEVER
from ..model import (KERNEL_UNWIND_REASONS, KERNEL_UNWIND_STOP, KERNEL_UNWIND_WHOLE,
                     ProfileProbe, TracepointProbe, UprobeProbe)
from .bpf_common import bpf_program_object, prog_type_of, program_result
from .kernel_offsets import Offsets
from .perf import NEVER_SAMPLE, READ_MOST
from .run_objects import RunObjects
from . import uprobe_links
from ..values import value

MIN_COUNT_ENTRIES = 10240             # count map entries at least (bcc's size)
RING_BYTES = 16 << 20                 # trace's ring of unwound stacks (bpf_unwind)

NO_STACK = -1                         # the stack id stored when there is none (ustack.h)
_U64 = struct.Struct("<Q")


def count_key():
    """The stack counters' map key (struct count_key in ustack.h): pid_tgid,
    probe index, user and kernel stack ids, the caller's return address."""
    return bpf_program_object("counts").layout("count_key").struct


@value(frozen=False)
class Counted:
    """One entry of the count map, decoded."""
    pid: int
    tid: int
    probe: int                        # index into the probe list
    user_stack: int                   # stack id, NO_STACK for none
    kernel_stack: int
    return_address: int
    count: int


TRACED_PROCESSES = 1 << 16            # the set's size: the target and its children


def traced_set(first_tgid: int) -> bpf_syscall.Map:
    """The set of traced processes (tgid -> 1), holding `first_tgid`."""
    tgids = bpf_program_object("exec").make_map(
        "tgids", TRACED_PROCESSES,
        flags=bpf_syscall.F_NO_PREALLOC if bpf_syscall.kernel_at_least(6, 1) else 0)
    tgids.update(first_tgid.to_bytes(4, "little"), (1).to_bytes(4, "little"))
    return tgids


def follow_children(tgids: bpf_syscall.Map, owned: RunObjects) -> None:
    """exec.bpf.c's follow_children on the raw tracepoint task_newtask,
    system-wide (the program filters on the set): tgids[child] = 1 when a
    process in the set forks one."""
    prog = owned.program(bpf_program_object("exec").load(
        "follow_children", {"tgids": tgids},
        {"task_pid_offset": Offsets.of_this_kernel().task_pid}, name="ustack_children"))
    owned.link(bpf_syscall.attach_raw_tracepoint("task_newtask", prog))


def arm_on_exec(pid: int, owned: RunObjects):
    """The map `armed`, whose [0] is set when the held command `pid` execs
    (exec.bpf.c's exec_armed on the raw tracepoint sched_process_exec); the
    probes' programs wait for it. Made before any perf event opens on that
    tracepoint: handlers run in the order they were registered, and the
    count program of `tracepoint:sched:sched_process_exec` must see the
    command's own exec armed already. `owned` keeps and closes it all."""
    obj = bpf_program_object("exec")
    armed = owned.map(obj.make_map("armed"))
    prog = owned.program(obj.load("exec_armed", {"armed": armed},
                                  {"traced_tgid": pid}, name="ustack_exec"))
    owned.link(bpf_syscall.attach_raw_tracepoint("sched_process_exec", prog))
    return armed


def with_ring_records(chunks: list, counter, chunk_type) -> list:
    """`chunks` (the perf buffers'), then what the counter's BPF ring holds
    as one chunk_type chunk, if it has a ring and anything is in it: read
    after the perf buffers, so the MMAP2 records that explain the ring's
    records come first."""
    if counter is not None and counter.ring is not None:
        records = counter.ring.read(READ_MOST)
        if records:
            chunks.append(chunk_type(records))
    return chunks


class BpfCounter:
    """The maps and programs of one run, attached to a PerfCapture's
    events; `owned` (the capture's) keeps and closes them. Counts stacks
    walked by frame pointers (counts.bpf.c); the unwinder, latency and
    off-CPU count otherwise (subclasses)."""
    interrupt = NEVER       # the run's Interrupt: loading gives up when requested
    ring = None             # a BPF ring buffer the capture reads (the unwinder's)
    objects = None          # the objects whose unwind rows are loaded (the unwinder's)
    python = None           # bpf_python.PythonProcs: Python frames merged into stacks
    v8 = None               # bpf_v8.V8Objects: JS frames named in stacks
    php = None              # bpf_php.PhpObjects: PHP frames merged into stacks
    perl = None             # bpf_perl.PerlObjects: Perl frames merged into stacks
    ruby = None             # bpf_ruby.RubyObjects: Ruby frames merged into stacks
    # called with a runtime's name ("python", "v8", ...) once its objects
    # above are made: at the run's first object of it (runtime_objects.py)
    on_runtime = None
    passes = None           # runtime_passes.RuntimePasses: loaded as runtimes are met

    def __init__(self, probes: list, owned: RunObjects, *,
                 stack_storage: int = DEFAULT_STACK_STORAGE, kernel: bool = False,
                 filter_tgid=None, armed=None, weighted: bool = False,
                 linked: frozenset = frozenset()):
        self._no_maps_yet(probes, owned, kernel, armed)
        self.linked = linked            # behind uprobe_multi links (uprobe_links.linked)
        # frames kept per stack: the kernel's limit, at most bcc's 127
        self.max_depth = max(1, min(pe.max_stack(), 127))
        obj = bpf_program_object("counts")
        self.stacks = owned.map(obj.make_map("stacks", stack_storage,
                                             value_size=8 * self.max_depth))
        self.counts = owned.map(obj.make_map(
            "counts", max(MIN_COUNT_ENTRIES, 2 * stack_storage)))
        self.errors = owned.error_counters(owned.map(obj.make_map("errors")),
                                           obj.enum("count_error"))
        self.named.update(stacks=self.stacks, counts=self.counts, errors=self.errors)
        if weighted:
            self.weigh(obj)
            self.named["weights"] = self.weighing.weights
        self.follow_if_traced(filter_tgid)

    def _no_maps_yet(self, probes: list, owned: RunObjects, kernel: bool = False,
                     armed=None) -> None:
        """The fields every counter has before it makes its maps. `armed`:
        the map a -c command's exec arms (arm_on_exec), or None."""
        self.probes = probes
        self.owned = owned
        self.kernel = kernel
        self.armed = armed
        self.tgids = None                   # for tracepoints under -p/-c: see follow()
        self.loaded: dict = {}              # probe index -> program fd, load_programs()
        # the probes behind uprobe_multi links (capture/uprobe_links.py): one
        # program for them all, the run's perf events have none of them
        self.linked: frozenset = frozenset()
        self.named: dict = {}               # the C programs' maps by their names
        self.weighing = None                # count --weight: bpf_weight.WeightPrograms

    def weigh(self, obj) -> None:
        """Count each event's weight, not 1 (see capture/bpf_weight.py):
        `obj`, the counting programs' object, declares the weights map."""
        from .bpf_weight import WeightPrograms     # --weight only (~1.5 ms of imports)
        self.weighing = WeightPrograms(self.owned, obj)

    def _program(self, index: int, probe, by_cookie: bool = False) -> int:
        """Load the probe's program: counts.bpf.c's count_stack, told what
        the probe needs; `by_cookie`: of every linked probe like it, which
        learns the probe from the link's cookie."""
        result = program_result(probe)
        armed = self.armed is not None
        slot = getattr(probe, "return_address_slot", None)
        bits = bpf_program_object("counts").enum("count_option")
        wanted = {"COUNT_ONLY_TRACED": self.tgids is not None
                  and isinstance(probe, TracepointProbe),
                  "COUNT_WAIT_FOR_EXEC": armed and not isinstance(probe, ProfileProbe),
                  "COUNT_KERNEL_STACK": self.kernel,
                  "COUNT_RETURN_ADDRESS": slot is not None,
                  "COUNT_WEIGHT": self.weighing is not None}
        return self._load_c("counts", "count_stack", probe, {
            "probe_index": index, "result": result,
            "options": sum(bits[name] for name, on in wanted.items() if on),
            "return_address_slot": slot or 0, "probe_by_cookie": int(by_cookie)},
            "ustack_links" if by_cookie else f"ustack_{index}",
            bpf_syscall.TRACE_UPROBE_MULTI if by_cookie else None)

    def _load_c(self, obj_name: str, program: str, probe, rodata: dict, name: str,
                attach_type: int | None = None, own: dict | None = None) -> int:
        """Load a C program for `probe` with the run's maps; a map it names
        and the run lacks (no -c: no `armed`) is made as the C declares it,
        once, and closed with the rest. `own`: maps of this program's
        alone (its PASSES array)."""
        maps = {**self.named, **(own or {})}
        for shared, m in (("armed", self.armed), ("tgids", self.tgids)):
            if m is not None:
                maps[shared] = m
        before = set(maps)
        fd = self.owned.program(bpf_program_object(obj_name).load(
            program, maps, rodata, prog_type_of(probe), name, attach_type))
        for name in set(maps) - before:
            self.named[name] = self.owned.map(maps[name])
        return fd

    def follow_if_traced(self, tgid) -> None:
        """follow(tgid) when a -p/-c run (tgid) has trace events, whose
        programs see every process and filter on the set; uprobe and
        profile events (and links) are scoped to the target by the kernel."""
        if tgid is not None and any(isinstance(p, TracepointProbe) for p in self.probes):
            self.follow(tgid)

    def follow(self, tgid: int) -> None:
        """Tracepoints count process `tgid` and every child it forks from
        now on (and theirs), as the perf backend's inherited events do."""
        self.tgids = self.owned.map(traced_set(tgid))
        follow_children(self.tgids, self.owned)

    def skipped(self) -> int:
        """Events the kernel skipped the probes' programs for (see
        bpf_syscall.recursion_misses)."""
        total = 0
        for fd in set(self.loaded.values()):
            try:
                total += bpf_syscall.recursion_misses(fd)
            except OSError:
                pass
        return total

    def load_programs(self) -> None:
        """Load (verify) every probe's program ahead of attach(), which
        takes them from `loaded`: BpfCapture has the kernel verify them
        while the unwinder's rows load."""
        shared: dict = {}                   # a linked probe's kind -> its program
        for index, probe in enumerate(self.probes):
            if index not in self.loaded:
                self.interrupt.check()      # the verifier takes ~8 ms a program
                if index in self.linked:    # one program per kind of linked probe
                    kind = self._linked_kind(probe)
                    if kind not in shared:
                        shared[kind] = self._linked_program(probe)
                    self.loaded[index] = shared[kind]
                    continue
                fd = self._program(index, probe)
                if self.weighing is not None:   # its weight's program goes first
                    fd = self.weighing.wrap(index, probe, fd)
                self.loaded[index] = fd

    def _linked_kind(self, probe):
        """What tells apart the programs of linked probes: where the
        caller's return address is (an entry's [sp], or none)."""
        return getattr(probe, "return_address_slot", None)

    def _linked_program(self, probe) -> int:
        """The program behind the uprobe_multi links of the probes of
        `probe`'s kind, which learns the probe from the link's cookie."""
        return self._program(0, probe, by_cookie=True)

    def attach(self, capture) -> None:
        """Attach a program per probe: to every sampling event a PerfCapture
        opened, and to one event of its own per trace event. Not to one of
        the capture's events there: those are inherited by the target's
        children, the copies share the program, and when a child exits its
        copy takes the program off the trace event for everyone."""
        self.load_programs()
        progs = self.loaded
        anchored: set = set()
        for probe, fd in list(capture.opened):
            index = self.probes.index(probe)
            if index not in anchored:
                self.interrupt.check()
                anchored.add(index)
                if not isinstance(probe, ProfileProbe):
                    bpf_syscall.attach(self._anchor(capture, probe), progs[index])
            if isinstance(probe, ProfileProbe):
                bpf_syscall.attach(fd, progs[index])
        if self.linked:
            sites = [(i, progs[i], i) for i in sorted(self.linked)]
            for pid in uprobe_links.pids_of(capture.target):
                uprobe_links.attach(sites, self.probes, self.owned, self.interrupt, pid)

    @staticmethod
    def _anchor(capture, probe) -> int:
        """A non-inherited event on the probe's trace event, scoped like the
        run (so a uprobe stays limited to the traced processes); the capture
        owns and closes it, before it removes its uprobes."""
        if isinstance(probe, UprobeProbe):
            config = capture.uprobe_id(probe)
        else:
            config = tracepoint_id(probe.group, probe.name)
        target = capture.target
        pid, cpu = (-1, 0) if target.scope == "system" else (target.pid, -1)
        fd = pe.open_event(pe.make_attr(pe.TYPE_TRACEPOINT, config,
                                        period=NEVER_SAMPLE), pid, cpu,
                           what=probe.label)
        capture.fds.append(fd)
        return fd

    # -- reading the maps ---------------------------------------------------
    def counted(self, reset: bool = False) -> list:
        """The count map's entries (stack counting)."""
        out, key = [], count_key()
        for k, v in self.counts.items(take=reset):
            pid_tgid, probe, ustack, kstack, word = key.unpack(k)
            out.append(Counted(pid_tgid >> 32, pid_tgid & 0xFFFFFFFF, probe,
                               ustack, kstack, word, _U64.unpack(v)[0]))
        return out

    def stack_bytes(self, stack_id: int) -> bytes:
        """The addresses of a stack id as u64s, innermost first, up to the
        first 0 (b"" for none or gone)."""
        if stack_id < 0:
            return b""
        raw = self.stacks.lookup(stack_id.to_bytes(4, "little"))
        if raw is None:
            return b""
        for i in range(0, len(raw), 8):
            if not any(raw[i:i + 8]):
                return bytes(raw[:i])
        return bytes(raw)


def ring_bytes(buffer_pages: int) -> int:
    """trace's ring of unwound stacks: RING_BYTES, more as --buffer-pages
    grows (the advice a full ring prints), a power of two."""
    want = max(RING_BYTES, buffer_pages * 4096 * 16)
    return 1 << (want - 1).bit_length()


def cut_reason(chain: bytes):
    """Why the in-kernel unwinder cut this callchain short, or None."""
    if len(chain) >= 8:
        last = _U64.unpack_from(chain, len(chain) - 8)[0]
        if last & ~0xFF == KERNEL_UNWIND_STOP and last & 0xFF not in KERNEL_UNWIND_WHOLE:
            return KERNEL_UNWIND_REASONS.get(last & 0xFF, f"reason {last & 0xFF}")
    return None


class InBackground(threading.Thread):
    """fn(*args, **kwargs) run in a thread from now, for the kernel's slow
    parts (a uprobe's registration, the verifier, zeroing a big map): they
    go on while the caller does the rest, ctypes having let go of the GIL.
    result() waits, then returns what fn returned or raises what it raised
    (with quiet=True it returns None instead of raising)."""

    def __init__(self, fn, *args, **kwargs):
        super().__init__(name="ustack-bg", daemon=True)
        self._call = (fn, args, kwargs)
        self._value = self._error = None
        self.start()

    def run(self) -> None:
        fn, args, kwargs = self._call
        try:
            self._value = fn(*args, **kwargs)
        except BaseException as e:      # handed to result()
            self._error = e

    def result(self, quiet: bool = False):
        self.join()
        if self._error is not None and not quiet:
            raise self._error
        return self._value
