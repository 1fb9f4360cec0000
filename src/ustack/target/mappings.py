"""The mapping tracker (SystemTap's "vma tracker"): which file is mapped where
in each process, kept current from MMAP2/FORK/COMM-exec records and seeded
from /proc/PID/maps. Mappings are never forgotten when a process exits, so
its stacks can still be symbolized afterwards. An exec starts a new
generation of a pid, so stacks counted before the exec keep their maps."""
from __future__ import annotations

import bisect
import os
import time

from ..kernel import procfs, tracefs
from ..kernel.proc_root import ns_pids
from ..model import CommEvent, ForkEvent, Mapping, MmapEvent, UstackError, printable
from ..objfile.elf import ElfImage


# Where a mapping whose file is not here points instead: never an ELF file,
# so its frames stay unnamed rather than named from another file.
NOT_HERE = os.devnull


def _checked(pid: int, host: str, path: str, build_id: str) -> str:
    """`host` (where the file process `pid` maps at `path` opens here, ""
    for `path` itself), or NOT_HERE when the kernel named the mapped file's
    build-id and that file has another. Checked only once the process is
    gone: while it lives, /proc/PID/map_files gave the very file; after,
    only a path was left to guess from (a container gone with it, whose
    library the host has at the same path in another build)."""
    if not build_id or procfs.process_exists(pid):
        return host
    try:
        found = ElfImage.open(host or path).build_id
    except UstackError:
        return host                    # unreadable or not ELF: nothing named anyway
    return host if found in (None, build_id) else NOT_HERE


class ProcessMaps:
    __slots__ = ("starts", "maps")

    def __init__(self, maps=()):
        self.maps = sorted(maps, key=lambda m: m.start)
        self.starts = [m.start for m in self.maps]

    def add(self, new: Mapping) -> None:
        """`new` replaces whatever it overlaps (mmap MAP_FIXED semantics).
        The maps are sorted and do not overlap, so those it replaces are
        one run of them, found by bisection: a sort per mapping made
        filling the tracker from /proc for a whole machine (~1,400
        mappings) cost 0.35 s of 0.96."""
        lo = bisect.bisect_right(self.starts, new.start) - 1
        if lo < 0 or self.maps[lo].end <= new.start:
            lo += 1
        hi = bisect.bisect_left(self.starts, new.end, lo)
        self.maps[lo:hi] = [new]
        self.starts[lo:hi] = [new.start]

    def find(self, addr: int) -> Mapping | None:
        i = bisect.bisect_right(self.starts, addr) - 1
        if i >= 0 and addr < self.maps[i].end:
            return self.maps[i]
        return None


class MappingTracker:
    """`live`: the processes run on this host, so /proc fills what the
    stream has not said yet; False for a recording, whose pids may be
    unrelated processes here."""

    def __init__(self, live: bool = True):
        self.live = live
        self.generations: dict = {}     # pid -> current generation
        self.exec_times: dict = {}      # pid -> times of its execs (those known)
        self.procs: dict = {}           # (pid, generation) -> ProcessMaps
        self.comms: dict = {}           # tid -> comm
        self.exec_comms: dict = {}      # (pid, generation) -> its name before the exec that ended it
        self.last_seed: dict = {}       # pid -> monotonic time of last /proc read
        self.kernel_threads: dict = {}  # pid -> bool, asked of /proc once
        self.ns_ids: dict = {}          # tid -> its id in its own pid namespace
        self.on_object = None           # callable(path): told each object mapped

    # -- feeding ----------------------------------------------------------
    def _maps(self, pid: int) -> ProcessMaps:
        key = (pid, self.generations.get(pid, 0))
        pm = self.procs.get(key)
        if pm is None:
            pm = self.procs[key] = ProcessMaps()
        return pm

    def seed_from_proc(self, pid: int) -> bool:
        maps = procfs.executable_mappings(pid)
        if not maps:
            return False
        pm = self._maps(pid)
        for m in maps:
            if pm.find(m.start) is None:
                pm.add(m)
                if self.on_object is not None and m.path:
                    self.on_object(m.host_path or m.path)
        if pid not in self.comms:
            self.comms[pid] = printable(procfs.comm(pid))
        self.ns_id(pid)                 # while it lives: -P shows it at the end
        return True

    def seed_all(self, skip: int) -> None:
        """Every running process's mappings and name (but `skip`'s), for a
        system-wide run: a process that exits before its first sample is
        decoded is still named."""
        for entry in os.listdir("/proc"):
            if entry.isdigit() and int(entry) != skip:
                self.seed_from_proc(int(entry))

    def seed_target(self, target, skip: int) -> None:
        """What /proc says of a run's processes before their first event:
        a system-wide run's (all but `skip`), a -p process's."""
        if target.scope == "system":
            self.seed_all(skip)
        elif target.scope == "pid":
            self.seed_from_proc(target.pid)

    def current_maps(self, pid: int) -> list:
        """The mappings of `pid` as it runs now (its last exec's)."""
        pm = self.procs.get((pid, self.generations.get(pid, 0)))
        return pm.maps if pm is not None else []

    def apply(self, event) -> None:
        if isinstance(event, MmapEvent):
            m = event.mapping
            if m.path and not m.host_path and self.live:
                m = Mapping(m.start, m.end, m.pgoff, m.path,
                            _checked(event.pid, procfs.host_path(
                                event.pid, m.path, m.start, m.end), m.path, m.build_id),
                            m.build_id)
            self._maps(event.pid).add(m)
            if self.on_object is not None and m.path:
                self.on_object(m.host_path or m.path)
            if event.pid not in self.ns_ids:
                self.ns_id(event.pid)
        elif isinstance(event, CommEvent):
            if event.exec and event.pid == event.tid:
                generation = self.generations.get(event.pid, 0)
                before = self.comms.get(event.tid) or self.comms.get(event.pid)
                if before:      # the execve call itself was made under this name
                    self.exec_comms[(event.pid, generation)] = before
                self.generations[event.pid] = generation + 1
                if event.time_ns:
                    self.exec_times.setdefault(event.pid, []).append(event.time_ns)
            self.comms[event.tid] = printable(event.comm)   # a task names itself
        elif isinstance(event, ForkEvent):
            parent_comm = self.comms.get(event.ptid) or self.comms.get(event.ppid)
            if parent_comm and event.tid not in self.comms:
                self.comms[event.tid] = parent_comm
            if event.pid != event.ppid:     # a new process: copies the maps
                parent = self._maps(event.ppid)
                self.procs[(event.pid, self.generations.get(event.pid, 0))] = \
                    ProcessMaps(parent.maps)

    # -- querying ---------------------------------------------------------
    def generation_at(self, pid: int, time_ns: int) -> int:
        """The exec generation process `pid` was in at `time_ns`: a sample
        taken before an exec can be read after it (the exec's COMM record
        is applied with the rest of its batch, or came through another
        buffer first), and must be named from the program it ran in."""
        current = self.generations.get(pid, 0)
        times = self.exec_times.get(pid)
        if not times or not time_ns or time_ns >= times[-1]:
            return current
        return current - (len(times) - bisect.bisect_right(times, time_ns))

    def generation_holding(self, pid: int, addrs) -> int:
        """The exec generation of a sample that has no time (counted in the
        kernel, which keeps none): the newest whose mappings hold all its
        addresses, e.g. a forked child's stacks from before its exec; the
        current one when none does."""
        current = self.generations.get(pid, 0)
        for gen in range(current, -1, -1):
            pm = self.procs.get((pid, gen))
            if pm is not None and addrs and all(
                    pm.find(a) or pm.find(a - 1) for a in addrs):
                return gen
        return current

    def find(self, pid: int, addr: int, generation: int | None = None
             ) -> Mapping | None:
        current = self.generations.get(pid, 0)
        gen = current if generation is None else generation
        pm = self.procs.get((pid, gen))
        m = pm.find(addr) if pm is not None else None
        if m is None and gen == current and self.live:
            # a sample can arrive before its MMAP2 record (another CPU's
            # buffer): re-read the live process's maps, at most 4 times/s
            now = time.monotonic()
            if now - self.last_seed.get(pid, -1.0) > 0.25:
                self.last_seed[pid] = now
                if self.seed_from_proc(pid):
                    m = self._maps(pid).find(addr)
        return m

    def comm(self, pid: int, tid: int, generation: int | None = None) -> str:
        """The name of `tid`; with `generation`, the name it had while it ran
        that program (an execve event's stack is the old program's, and so
        is its name, as perf gives it)."""
        if generation is not None and generation < self.generations.get(pid, 0):
            c = self.exec_comms.get((pid, generation))
            if c:
                return c
        c = self.comms.get(tid) or self.comms.get(pid)
        if not c and self.live:
            # gone from /proc: ftrace may have saved its name (tracefs)
            c = printable(procfs.comm(pid, tid) or procfs.comm(pid)
                          or (tracefs.saved_comm(tid) if pid > 0 else ""))
            if c or pid > 0:
                self.comms[tid] = c or "?"      # once: a task gone stays unnamed
        return c or ("swapper" if pid == 0 else "?")      # the idle task, as perf names it

    def comm_at(self, pid: int, tid: int, time_ns: int) -> str:
        """The name of `tid` when it was sampled at `time_ns`."""
        return self.comm(pid, tid, self.generation_at(pid, time_ns))

    def is_kernel_thread(self, pid: int) -> bool:
        """A kernel thread (no user stack); pid 0, the idle task, is not."""
        known = self.kernel_threads.get(pid)
        if known is None:
            known = self.kernel_threads[pid] = (
                self.live and pid > 0 and procfs.is_kernel_thread(pid))
        return known

    def ns_id(self, tid: int) -> int:
        """The id of process or thread `tid` in its own pid namespace (a
        container's 7 for our 4321); `tid` itself outside containers and
        when not known (gone before it was asked, a recording)."""
        known = self.ns_ids.get(tid)
        if known is None:
            ids = ns_pids(tid) if self.live and tid > 0 else ()
            known = self.ns_ids[tid] = ids[-1] if ids else tid
        return known



class PinnedView:
    """`find(pid, addr)` for the symbolizer, pinned to the generation (exec)
    a counted stack was seen in; set `generation` before each lookup."""

    def __init__(self, tracker: MappingTracker):
        self.tracker = tracker
        self.generation: int | None = None

    def find(self, pid: int, addr: int) -> Mapping | None:
        return self.tracker.find(pid, addr, self.generation)

    def paths(self, pid: int) -> list:
        """The files process `pid` maps (in the pinned generation): which
        runtime it is (libjvm.so: a JVM), also after it exited."""
        gen = self.generation
        if gen is None:
            gen = self.tracker.generations.get(pid, 0)
        pm = self.tracker.procs.get((pid, gen))
        return [m.path for m in pm.maps] if pm is not None else []
