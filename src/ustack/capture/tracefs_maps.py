"""What the tracefs backend tells the mapping tracker in place of perf's
MMAP2, COMM and FORK records, which ftrace has not: a process's executable
mappings, read from /proc when its first event is decoded or an event's
address lies outside what was read (a library dlopened since, a process
started during the run); its forks and execs from the instance's
sched_process_fork/exec events, so that the tracker keeps each exec's maps
apart and a child starts with its parent's. A process gone before its
events are decoded cannot be read (the -c command is, at its exit stop)."""
from __future__ import annotations

import os

from ..kernel import procfs
from ..model import CommEvent, ForkEvent, MmapEvent
from ..target.mappings import ProcessMaps

MAX_PIDS = 4096          # processes whose sent maps are remembered
MAX_MISSES = 64          # pages per process that were re-read in vain
MAX_SEEN = 1 << 16       # (pid, callchain) pairs known to be inside the maps
_USER_END = 1 << 47      # above: a marker, not an address


class ProcessWatch:
    """Called by the decoder (kernel/ftrace_records.py) in the order of
    each CPU's records; appends (time, event) to the stream's metadata."""

    def __init__(self):
        self.known: dict = {}       # pid -> ProcessMaps of what was sent
        self.misses: dict = {}      # pid -> pages whose re-read found nothing
        self.seen: set = set()      # (pid, callchain) all inside `known`: skip
        self.execs: dict = {}       # pid -> time of its last exec decoded

    def fork(self, t: int, parent_tid: int, child: int, metas: list) -> None:
        if procfs.tgid(child) != child:
            return                  # a thread: its process's maps are its own
        ppid = procfs.tgid(parent_tid)
        if ppid not in self.known:
            self._read(ppid, t, metas)
        metas.append((t, ForkEvent(child, ppid, child, parent_tid)))
        self._remember(child, ProcessMaps(self.known[ppid].maps))

    def exec(self, t: int, pid: int, filename: str, metas: list) -> None:
        metas.append((t, CommEvent(pid, pid, os.path.basename(filename)[:15], True, t)))
        self.known.pop(pid, None)   # its next event reads the new program's maps
        self.misses.pop(pid, None)
        self.seen.clear()
        self.execs[pid] = t

    def sample(self, sample, metas: list) -> None:
        pid = sample.pid
        known = self.known.get(pid)
        if sample.regs is not None:
            addrs = (sample.regs["ip"],)
        else:                       # a stack repeats: checked once
            chain = sample.callchain
            if known is not None and (pid, chain) in self.seen or len(chain) % 8:
                return
            addrs = memoryview(chain).cast("Q")
        if known is None:
            self._read(pid, sample.time_ns, metas, addrs)
            return
        for addr in addrs:
            if 0x1000 <= addr < _USER_END and known.find(addr) is None \
                    and known.find(addr - 1) is None:
                missed = self.misses.setdefault(pid, set())
                if addr >> 12 not in missed and len(missed) < MAX_MISSES:
                    missed.add(addr >> 12)
                    self._read(pid, sample.time_ns, metas, addrs)
                return
        if sample.regs is None:
            if len(self.seen) >= MAX_SEEN:
                self.seen.clear()
            self.seen.add((pid, chain))

    def _read(self, pid: int, t: int, metas: list, addrs=()) -> None:
        # /proc shows the latest program: its maps go after that exec (an
        # event from before it, on another CPU, can be decoded later)
        t = max(t, self.execs.get(pid, 0))
        maps = self.known.get(pid) or ProcessMaps()
        mappings = procfs.executable_mappings(pid)
        if addrs and not _holds_one(ProcessMaps(mappings), addrs):
            # none of the sample's addresses (or it is gone): /proc shows a
            # program the process exec'd since, its exec not decoded yet;
            # sent at the sample's time, its maps would name the program it
            # ran before. Its exec's decoding has them read again.
            self._remember(pid, maps)
            return
        for m in mappings:
            found = maps.find(m.start)
            if found is None or (found.start, found.end, found.path) != (m.start, m.end, m.path):
                maps.add(m)
                metas.append((t, MmapEvent(pid, pid, m)))
        self._remember(pid, maps)

    def _remember(self, pid: int, maps: ProcessMaps) -> None:
        if len(self.known) >= MAX_PIDS:
            self.known.clear()
            self.misses.clear()
            self.execs.clear()
        self.known[pid] = maps


def _holds_one(maps: ProcessMaps, addrs) -> bool:
    """Whether one of a sample's addresses (return addresses: or the byte
    before) lies in `maps`; markers above user space are none."""
    return any(maps.find(a) is not None or maps.find(a - 1) is not None
               for a in addrs if 0x1000 <= a < _USER_END)
