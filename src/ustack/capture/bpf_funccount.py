"""funccount's capture: calls per function counted in the kernel, through
one uprobe_multi link per binary instead of a perf event per uprobe.

Why: closing a perf event on a uprobe waits for RCU grace periods (~0.1 s
each, serialized by the kernel's event_mutex), so a glob of 86 functions
took 9 s to end; a link takes all its uprobes away after one wait. The
program learns which function fired from the link's cookie (its index in
the run's probes).

Scope as bcc's funccount and bpftrace's uprobes: -p/-c count the calls of
that process (its threads, across its exec), not of the children it
forks; a system-wide run counts every process but ustack itself."""
from __future__ import annotations

import os
import struct
import time

from ..kernel import bpf_syscall
from .bpf_counter import arm_on_exec, bpf_program_object
from .contract import Capture
from .run_objects import RunObjects
from . import uprobe_links

_U64 = struct.Struct("<Q")


class FuncCountCapture(Capture):
    """Nothing streams: the counts are read with calls()."""

    def __init__(self, probes: list, target):
        self.probes = probes
        self.target = target
        self.owned = RunObjects()
        self.counts = None

    def open(self) -> None:
        owned = self.owned
        try:
            obj = bpf_program_object("funccount")
            self.counts = owned.map(obj.make_map("calls", max(1, len(self.probes))))
            scope = self.target.scope
            maps = {"calls": self.counts}
            if scope == "command":
                maps["armed"] = arm_on_exec(self.target.pid, owned)
            given = set(maps)
            # funccount.bpf.c's count_by_cookie: calls[cookie] += 1
            try:
                prog = owned.program(obj.load("count_by_cookie", maps, {
                    "wait_for_exec": "armed" in given,
                    "skip_tgid": os.getpid() if scope == "system" else 0},
                    name="ustack_calls"))
            finally:                      # made for the load: (no -c) an unused `armed`
                for name in set(maps) - given:
                    owned.map(maps[name])
            # -p 1,2,3: links per process (each costs one wait at close)
            sites = [(i, prog, i) for i in range(len(self.probes))]
            for pid in uprobe_links.pids_of(self.target):
                uprobe_links.attach(sites, self.probes, owned, self.interrupt, pid)
        except BaseException:
            self.close()
            raise

    def start(self) -> None:
        if self.target.scope == "command":
            self.target.release()
            self.target.resume()

    def read_chunks(self, timeout_ms: int) -> list:
        time.sleep(timeout_ms / 1000)    # nothing streams: the drain thread idles
        return []

    def decode(self, chunk, metas: list, samples: list, offset: int, limit: int) -> int:
        return len(chunk)

    def calls(self, reset: bool = False) -> list:
        """Calls per probe, in probe order; `reset` zeroes each after
        reading it (funccount -i)."""
        out = []
        for i in range(len(self.probes)):
            key = i.to_bytes(4, "little")
            out.append(_U64.unpack(self.counts.lookup(key))[0])
            if reset:
                self.counts.update(key, bytes(8))
        return out

    def close(self) -> None:
        self.owned.close()              # links first: nothing runs the program

    def release(self) -> None:
        """close() in a process whose links the closer (capture/closer.py)
        holds copies of: not the last holder, it does not wait for the
        kernel's ~0.15 s per link (a libc glob's 15 links took 1.8 s)."""
        self.close()


def uprobe_multi_supported(release: str = "") -> bool:
    """Whether this kernel makes uprobe_multi links: Linux 6.6 and later
    (asking the kernel itself would cost a link, and closing one waits)."""
    return bpf_syscall.kernel_at_least(6, 6, release)
